"""The app's entry points as a user meets them: `flwr run` of the clone at its defaults (a log
that says only what matters), and a run of the installed wheel, which claims no top-level
module names (an app folder of a pyproject naming the package's apps)."""

import os
import shutil
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
    assert [r["round"] for r in read_rounds(tmp_path / "runs" / "default")] == list(range(31))


def test_a_run_from_the_installed_wheel(tmp_path):
    """The wheel installed on its own (pip --target, first on the path), and an app folder
    holding only a pyproject that names ``fedvls_flwr.app.server_app:app`` and
    ``fedvls_flwr.app.client_app:app``: Flower imports both from the installed package."""
    wheel = build_project_wheel(tmp_path / "dist", "--no-build-isolation")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    app = tmp_path / "app"
    app.mkdir()
    for name in ("LICENSE", "README.md"):
        shutil.copy(ROOT / name, app / name)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for part in ("server", "client"):
        assert f'{part}app = "{part}_app:app"' in pyproject
        pyproject = pyproject.replace(f'{part}app = "{part}_app:app"', f'{part}app = "fedvls_flwr.app.{part}_app:app"')
    (app / "pyproject.toml").write_text(pyproject)
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
