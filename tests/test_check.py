"""The pre-flight check (python -m fedvls_flwr.check) and the order of the ServerApp's work:
the run config is validated before anything heavy is imported or any node is asked."""

import subprocess
import sys
from pathlib import Path

import pytest

from fedvls_flwr.check import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run-config", "method='fedvsl'"], "'method' = 'fedvsl' is not allowed; choose one of"),
        (["--run-config", "lamda-dis=0.1"], "unknown run config key 'lamda-dis'"),
        (["--run-config", "fraction-train=0"], "'fraction-train' = 0.0: must be in (0, 1]"),
        (["--run-config", "dataset='mnist10k' data-dir='/nonexistent'"], "/nonexistent"),
        (["--run-config", "partition='shards' shards-per-client=500", "--num-supernodes", "10"],
         "shards_per_client=500"),
        (["--run-config", "dataset='synthetic' synthetic-clients=100", "--num-supernodes", "10"],
         "must equal num-supernodes = 10"),
        (["--run-config", "method=="], "invalid format"),
    ],
)
def test_bad_configs_name_what_is_wrong(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_good_config_and_toml_file(capsys):
    assert main(["--run-config", "method='fedavg' dirichlet-beta=0.5", "--num-supernodes", "10"]) == 0
    assert capsys.readouterr().out.startswith("ok: fedavg on digits")
    assert main(["--run-config", str(ROOT / "conf" / "fedvls-authors.toml"), "--no-data"]) == 0


def test_serverapp_validates_before_importing_torch_or_touching_the_grid():
    code = (
        "import sys\n"
        "from flwr.app import Context, RecordDict\n"
        "import server_app\n"
        "class Grid:\n"
        "    def __getattr__(self, name): raise AssertionError(f'grid.{name} used')\n"
        "ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={'dirichlet-beta': -1.0})\n"
        "try:\n"
        "    server_app.main(Grid(), ctx)\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
        "print('torch' in sys.modules, 'ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "ConfigError run config 'dirichlet-beta' = -1.0: must be > 0 (e.g. 0.5, 0.1, 0.05)"
    assert lines[1] == "False False"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run-config", "method='fedfoo'"], "'method' = 'fedfoo' is not allowed"),
        (["--node-config", "partition-id=3 num-partitions=2", "--node-config", "partition-id=1 num-partitions=2"],
         "partition-id=3 is outside 0..1"),
    ],
)
def test_deploy_launcher_checks_before_starting_anything(args, message, capsys, monkeypatch):
    from fedvls_flwr import deploy

    def no_start(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(deploy.LocalSuperLink, "start", no_start)
    assert deploy.main(["local", "--insecure", "--nodes", "2", *args]) == 2
    err = capsys.readouterr().err
    assert "nothing started" in err and message in err
