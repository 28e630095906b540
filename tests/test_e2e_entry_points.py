"""The app's entry points as a user meets them: `flwr run` of the clone at its defaults (a log
that says only what matters), and a run of the installed wheel, which claims no top-level
module names (an app folder of a pyproject naming the package's apps)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.deploy.wheelhouse import build_project_wheel
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.processes import assert_none_left

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
#: Two warnings the app's own design would cause in every default run, kept out: the
#: server evaluates the global model itself (fraction_evaluate = 0 by design), and the app
#: says which device each client trains on itself (Ray's note on a future default).
FLOWER_LINE = "fraction_evaluate is set to 0.0. Federated evaluation will be skipped."
RAY_LINE = "Ray will no longer override accelerator visible devices env var"
FEDERATION = {"num-supernodes": 10, "client-resources-num-cpus": 1}


def test_a_default_run_of_the_clone_logs_no_warning_the_user_cannot_act_on(tmp_path):
    """`flwr run <clone>` with the pyproject's run config (only the output folder moved into
    the test's): every round, and neither of the two warnings."""
    with LocalSuperLink(tmp_path / "home") as link:
        run_id = link.submit(ROOT, run_config={"output-dir": str(tmp_path / "runs"), "run-name": "default"},
                             federation_config=FEDERATION)
        outcome = link.wait(run_id, timeout=600)
    assert_none_left((), tmp_path / "home")
    assert outcome.completed, outcome.log[-4000:]
    assert "round 30/30: accuracy" in outcome.log
    assert FLOWER_LINE not in outcome.log and RAY_LINE not in outcome.log, outcome.log
    # nothing of the app's after its last line, nor Flower's actor-termination warnings or empty exit line
    after = outcome.log.split(" run done - best accuracy ", 1)[1].splitlines()[1:]
    assert not [line for line in after if "node data" in line or re.search(r"INFO\S*\s*:\s*$", line)], after
    assert "Manually terminating" not in outcome.log
    assert [r["round"] for r in read_rounds(tmp_path / "runs" / "default")] == list(range(31))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """The project's wheel installed (``--no-deps --no-index``) into a fresh venv whose dependencies
    come from this venv's site-packages through a .pth file holding only that path (so this venv's
    own .pth files - the editable install's - are not read): (its python, its site-packages)."""
    root = tmp_path_factory.mktemp("installed")
    wheel = build_project_wheel(root / "dist", "--no-build-isolation")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    paths = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    ours = subprocess.run([sys.executable, "-c", paths], capture_output=True, text=True, check=True).stdout.strip()
    site = Path(subprocess.run([python, "-c", paths], capture_output=True, text=True, check=True).stdout.strip())
    (site / "test-venv-dependencies.pth").write_text(ours + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   env=without_pythonpath())
    return python, site


def without_pythonpath(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **extra}


def test_the_installed_wheel_checks_runs_and_sweeps_from_another_folder(installed, tmp_path):
    """`fedvls check`, a one-round `fedvls run` and a one-run `fedvls sweep` of the installed
    package, from a folder that is not the source tree (which has the pyproject.toml the
    package reads its defaults from in a checkout)."""
    python, site = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = without_pythonpath(FEDVLS_CACHE_DIR=str(tmp_path / "cache"))
    where = subprocess.run([python, "-c", "import fedvls_flwr; print(fedvls_flwr.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(site / "fedvls_flwr" / "__init__.py")
    fedvls = [str(python.parent / "fedvls")]
    check = subprocess.run([*fedvls, "check", "--run-config", "num-server-rounds=1", "--num-supernodes", "3"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.startswith("ok: fedvls on digits"), check.stderr[-3000:]
    run = subprocess.run([*fedvls, "run", "--run-config", f"num-server-rounds=1 local-epochs=1 output-dir='{tmp_path}' "
                          "run-name='wheel-run'", "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["round"] for r in read_rounds(tmp_path / "wheel-run")] == [0, 1]
    preset = tmp_path / "one.yaml"
    preset.write_text("name: one\nbase: {dataset: digits, num-server-rounds: 1, local-epochs: 1}\n"
                      "grid: {method: [fedavg]}\nfederation: {num-supernodes: 3, client-resources-num-cpus: 1}\n")
    sweep = subprocess.run([*fedvls, "sweep", str(preset), "-o", str(tmp_path / "sweep")], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, (sweep.stdout + sweep.stderr)[-3000:]
    assert (tmp_path / "sweep" / "digits-fedavg-dir0.05-s0" / "summary.json").is_file()


def test_a_run_from_the_installed_wheel(installed, tmp_path):
    """``flwr run`` of the app folder an installed package writes for itself (ops/app_folder.py:
    only a pyproject naming ``fedvls_flwr.app.server_app:app`` and ``fedvls_flwr.app.client_app:app``,
    and its licence), the package installed on its own first on the path: Flower imports both
    apps from the installed package, and the folder claims no top-level module names."""
    python, site = installed
    app = tmp_path / "app"
    made = subprocess.run([python, "-c", "import sys; from pathlib import Path; from fedvls_flwr.ops.app_folder "
                                         "import app_folder; print(app_folder(Path(sys.argv[1])))", str(app)],
                          cwd=tmp_path, env=without_pythonpath(), capture_output=True, text=True, check=True)
    assert made.stdout.strip() == str(app) and sorted(p.name for p in app.iterdir()) == ["LICENSE", "pyproject.toml"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u, fedvls_flwr; print(fedvls_flwr.__file__); "
                               "print(u.find_spec('server_app'), u.find_spec('client_app'))"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert where == [str(site / "fedvls_flwr" / "__init__.py"), "None None"], where

    run_config = {"num-server-rounds": 3, "local-epochs": 1, "output-dir": str(tmp_path / "runs"), "run-name": "wheel"}
    with LocalSuperLink(tmp_path / "home", env_extra={"PYTHONPATH": str(site)}) as link:
        outcome = link.wait(link.submit(app, run_config=run_config, federation_config={"num-supernodes": 3}),
                            timeout=300)
    assert_none_left((), tmp_path / "home")
    assert outcome.completed, outcome.log[-4000:]
    assert [r["round"] for r in read_rounds(tmp_path / "runs" / "wheel")] == [0, 1, 2, 3]
