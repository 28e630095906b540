"""The pre-flight check (python -m fedvls_flwr check) and the order of the ServerApp's work:
the run config is validated before anything heavy is imported or any node is asked."""

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedvls_flwr.experiments.check import main
from fedvls_flwr.ops.launch import LocalSuperLink

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run-config", "method='fedvsl'"], "'method' = 'fedvsl' is not allowed (did you mean 'fedvls'?); choose one of"),
        (["--run-config", "lamda-dis=0.1"], "unknown run config key 'lamda-dis'"),
        (["--run-config", "fraction-train=0"], "'fraction-train' = 0.0: must be in (0, 1]"),
        (["--run-config", "dataset='mnist10k' data-dir='/nonexistent'"], "/nonexistent"),
        (["--run-config", "partition='shards' shards-per-client=500", "--num-supernodes", "10"],
         "shards_per_client=500"),
        (["--run-config", "dataset='synthetic' synthetic-clients=100", "--num-supernodes", "10"],
         "must equal num-supernodes = 10"),
        (["--run-config", "method=="], "method== is not a TOML key=value item"),
    ],
)
def test_bad_configs_name_what_is_wrong(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_good_config_and_toml_file(capsys):
    assert main(["--run-config", "method='fedavg' dirichlet-beta=0.5", "--num-supernodes", "10"]) == 0
    assert capsys.readouterr().out.startswith("ok: fedavg on digits")
    assert main(["--run-config", str(ROOT / "conf" / "fedvls-authors.toml"), "--no-data"]) == 0


@pytest.mark.parametrize("resume_missing", [False, True])
def test_serverapp_validates_before_importing_torch_or_touching_the_grid(tmp_path, resume_missing):
    run_config = ({"resume": True, "run-name": "gone", "output-dir": str(tmp_path)} if resume_missing
                  else {"dirichlet-beta": -1.0})
    code = (
        "import sys\n"
        "from flwr.app import Context, RecordDict\n"
        "import server_app\n"
        "class Grid:\n"
        "    def __getattr__(self, name): raise AssertionError(f'grid.{name} used')\n"
        f"ctx = Context(run_id=1, node_id=0, node_config={{}}, state=RecordDict(), run_config={run_config!r})\n"
        "try:\n"
        "    server_app.main(Grid(), ctx)\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
        "print('torch' in sys.modules, 'ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    lines = out.stdout.strip().splitlines()
    if resume_missing:  # not a new run, started without a word
        assert lines[0].startswith(f"ConfigError run config 'resume' = true but there is no run folder {tmp_path / 'gone'}")
    else:
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
    from fedvls_flwr.deploy import cli as deploy

    def no_start(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(LocalSuperLink, "start", no_start)
    assert deploy.main(["local", "--insecure", "--nodes", "2", *args]) == 2
    err = capsys.readouterr().err
    assert "nothing started" in err and message in err


# ---- everything below fails in `check`, in seconds, not in the run -----------------------


@pytest.mark.parametrize(
    "run_config, message",
    [
        ("lr=", "'lr=' has no value"),                              # Flower: dropped, default lr used
        ("lr", "'lr' is not key=value"),
        ("lr=0.1 momentum", "'momentum' after 'lr=0.1' is not key=value"),
        ("lr=inf", "'lr' = inf: must be a finite number"),           # the run: NonFiniteLossError
        ("momentum=nan", "'momentum' = nan: must be a finite number"),
        ("seed=-1", "'seed' = -1: must be >= 0"),                    # the run: clients fail after 44 s
        ("num-server-round=3", "did you mean 'num-server-rounds'?"),
    ],
)
def test_check_rejects_what_flower_would_drop_or_the_run_would_fail_on(run_config, message, capsys):
    assert main(["--run-config", run_config, "--no-data"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("key", ["device", "server-device"])
def test_cuda_on_a_machine_without_it_fails_unless_meant_for_another_machine(key, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = f"{key}='cuda' output-dir='{tmp_path}'"
    assert main(["--run-config", cfg, "--no-data"]) == 2
    err = capsys.readouterr().err
    assert f"'{key}' = 'cuda' but this machine has no CUDA device" in err and "--for-other-machine" in err
    assert main(["--run-config", cfg, "--no-data", "--for-other-machine"]) == 0


def test_output_dir_under_a_file_or_not_writable(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--run-config", f"output-dir='{blocker}/runs'", "--no-data"]) == 2
    assert f"{blocker} is a file, not a folder" in capsys.readouterr().err
    assert main(["--run-config", f"output-dir='{blocker}'", "--no-data"]) == 2
    assert f"{blocker} is a file; choose another output-dir" in capsys.readouterr().err
    assert main(["--run-config", f"output-dir='{blocker}/runs'", "--no-data", "--for-other-machine"]) == 0
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(["--run-config", f"output-dir='{locked}/runs'", "--no-data"]) == 2
        assert f"{locked} is not writable" in capsys.readouterr().err


def test_run_folder_that_already_holds_a_run(tmp_path, capsys):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "state.json").write_text('{"round": 1}')
    assert main(["--run-config", f"output-dir='{tmp_path}' run-name='r1'", "--no-data"]) == 2
    assert "already holds a run; set resume=true" in capsys.readouterr().err


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_dataset_with_a_label_out_of_range_is_named_not_an_assertion(tmp_path, capsys):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 250)
    labels[7] = 12  # one damaged label
    write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (labels.size, 28, 28)), 2051)
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", labels, 2049)
    t0 = time.perf_counter()
    assert main(["--run-config", f"dataset='mnist10k' data-dir='{tmp_path}'"]) == 2
    err = capsys.readouterr().err
    assert f"mnist10k: the train split read from {tmp_path} has labels 0..12, 1 of them outside the 10 classes 0..9" in err
    assert time.perf_counter() - t0 < 30


def test_check_of_a_bad_config_imports_neither_torch_nor_flower():
    """The rejected keys above are refused before torch, Flower, numpy or Ray is imported (seconds
    of a cold start): Python's own import log (``-X importtime``) lists every module loaded."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedvls_flwr", "check", "--run-config", "lr="],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "'lr=' has no value" in out.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "fedvls_flwr.config.unread" in loaded  # the log is read right
    heavy = {name for name in loaded if name.split(".")[0] in {"torch", "flwr", "numpy", "ray"}}
    assert not heavy, sorted(heavy)[:10]


def test_deploy_launcher_rejects_what_flower_would_drop(capsys, monkeypatch):
    from fedvls_flwr.deploy import cli as deploy

    monkeypatch.setattr(LocalSuperLink, "start", lambda *a, **k: pytest.fail("a process was started"))
    assert deploy.main(["local", "--insecure", "--nodes", "2", "--run-config", "lr=0.1 momentum"]) == 2
    err = capsys.readouterr().err
    assert "nothing started" in err and "'momentum' after 'lr=0.1' is not key=value" in err
    assert deploy.main(["local", "--insecure", "--nodes", "1", "--node-config", "partition-id=0 num-partitions="]) == 2
    err = capsys.readouterr().err
    assert "nothing started" in err and "--node-config: 'num-partitions=' after 'partition-id=0' has no value" in err


# ---- runs that can never start, or cannot be meant ------------------------------------


def test_min_nodes_above_the_federation_is_refused_whenever_check_knows_its_size(capsys):
    """Not 'ok': the run would log 'waiting for nodes: 4 connected, 6 needed' for ever."""
    assert main(["--run-config", "min-nodes=6", "--num-supernodes", "4", "--no-data"]) == 2
    err = capsys.readouterr().err
    assert "'min-nodes' = 6 but the federation has 4 SuperNode(s)" in err and "at most 4" in err
    assert main(["--run-config", "min-nodes=4", "--num-supernodes", "4", "--no-data"]) == 0


def test_a_preset_whose_min_nodes_exceeds_its_federation_is_refused(tmp_path):
    from fedvls_flwr.experiments.preset import PresetError, check_data, load_preset

    (tmp_path / "p.yaml").write_text(
        "federation: {num-supernodes: 3}\nbase: {min-nodes: 5, dataset: digits}\ngrid: {method: [fedavg]}\n")
    with pytest.raises(PresetError, match="'min-nodes' = 5 but the federation has 3"):
        check_data(load_preset(tmp_path / "p.yaml"))


def test_deploy_launcher_refuses_min_nodes_above_its_nodes_and_two_nodes_of_one_partition(capsys, monkeypatch):
    from fedvls_flwr.deploy import cli as deploy

    monkeypatch.setattr(LocalSuperLink, "start", lambda *a, **k: pytest.fail("a process was started"))
    assert deploy.main(["local", "--insecure", "--nodes", "2", "--run-config", "min-nodes=3"]) == 2
    assert "'min-nodes' = 3 but the federation has 2 SuperNode(s)" in capsys.readouterr().err
    same = ["--node-config", "partition-id=1 num-partitions=2"] * 2
    assert deploy.main(["local", "--insecure", "--nodes", "2", *same]) == 2
    err = capsys.readouterr().err
    assert "nothing started" in err and "node 0 and node 1 are both partition-id=1" in err


def test_rounds_that_would_never_end_and_rounds_of_one_client_are_said(capsys):
    """Were: 'ok' without a word (num-server-rounds=1000000000; fraction-train=1e-9 trains one
    client per round)."""
    assert main(["--run-config", "num-server-rounds=1000000000", "--num-supernodes", "10"]) == 0
    err = capsys.readouterr().err
    assert "warning: num-server-rounds = 1000000000 is far beyond" in err and "samples" in err
    assert main(["--run-config", "fraction-train=1e-9", "--no-data"]) == 0
    assert "note: fraction-train = 1e-09 samples 1 client per round on any federation up to 100" in \
        capsys.readouterr().err
    assert main(["--run-config", "fraction-train=0.1", "--num-supernodes", "10", "--no-data"]) == 0
    assert "samples 1 client per round of 10 nodes" in capsys.readouterr().err
    assert main(["--run-config", "fraction-train=0.2", "--num-supernodes", "10", "--no-data"]) == 0
    assert capsys.readouterr().err == ""


def test_deploy_launcher_lists_node_data_folders_before_starting(tmp_path, capsys, monkeypatch):
    """--node-data folders are listed (no image read) before anything starts: a symlink loop,
    a class folder not in --classes, an empty folder stop the launcher naming node and path."""
    from fedvls_flwr.deploy import cli as deploy

    monkeypatch.setattr(LocalSuperLink, "start", lambda *a, **k: pytest.fail("a process was started"))
    good, loop, stray = tmp_path / "good", tmp_path / "loop", tmp_path / "stray"
    for site in (good, loop, stray):
        (site / "0").mkdir(parents=True)
        (site / "0" / "a.png").write_bytes(b"")  # listed, not read
    (loop / "0" / "again").symlink_to(loop / "0")
    (stray / "eleven").mkdir()
    classes = ["--classes", ",".join(map(str, range(10)))]
    assert deploy.main(["local", "--insecure", "--node-data", str(good), str(loop), *classes]) == 2
    err = capsys.readouterr().err
    assert "nothing started: node 1 (node-local folder data in" in err
    assert f"{loop}/0/again is the folder {loop}/0 again" in err
    assert deploy.main(["local", "--insecure", "--node-data", str(good), str(stray), *classes]) == 2
    assert "class folder(s) eleven are not in the class list" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert deploy.main(["local", "--insecure", "--node-data", str(good), str(tmp_path / "empty"), *classes]) == 2
    assert f"folder dataset {tmp_path / 'empty'}: no images found" in capsys.readouterr().err


@pytest.mark.parametrize("federation, message", [
    ("num-supernode=2", "--federation-config: unknown key 'num-supernode' (did you mean 'num-supernodes'?)"),
    ("num-supernodes=0", "--federation-config: 'num-supernodes' = 0: must be an integer >= 1"),
    ("num-supernodes=2.5", "'num-supernodes' = 2.5: must be an integer >= 1"),
    ("client-resources-num-cpus=0.5", "'client-resources-num-cpus' = 0.5: must be an integer >= 1"),
    ("client-resources-num-gpus=-1", "'client-resources-num-gpus' = -1: must be a number >= 0"),
    ("lr=0.1", "--federation-config: 'lr' is a run-config key: give it in --run-config"),
])
def test_a_federation_config_flower_would_refuse_or_cannot_run_is_refused(federation, message, capsys):
    """Flower refuses an unknown key only after packing the app, and num-supernodes=0 made
    check advise 'lower min-nodes to at most 0'."""
    assert main(["--no-data", "--federation-config", federation]) == 2
    err = capsys.readouterr().err
    assert message in err and "min-nodes" not in err


def test_every_key_flowers_simulation_takes_is_accepted(capsys):
    from flwr.proto.federation_config_pb2 import SimulationConfig

    from fedvls_flwr.config.federation_config import SIMULATION_KEYS

    assert sorted(k.replace("-", "_") for k in SIMULATION_KEYS) == sorted(
        f.name for f in SimulationConfig.DESCRIPTOR.fields)
    everything = ("num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=0.25 backend='ray' "
                  "verbose=false init-args-num-cpus=2 init-args-num-gpus=1 init-args-logging-level='warning' "
                  "init-args-log-to-driver=true")
    assert main(["--no-data", "--federation-config", everything]) == 0
    assert capsys.readouterr().out.startswith("ok:")


@pytest.mark.parametrize("run_config, message", [
    ("fedconcat-assignment='0,1'", "'fedconcat-assignment' = '0,1' is a setting of protocol 'fedconcat', but this run "
                                   "has protocol = 'standard': it would be ignored. Select the part "
                                   "(protocol='fedconcat'), or leave fedconcat-assignment out"),
    ("fedgf-c=0.5 local-optimizer='sam'", "'fedgf-c' = 0.5 is a setting of local-optimizer 'fedgf', but this run has "
                                          "local-optimizer = 'sam'"),
    ("sam-rho=0.2", "'sam-rho' = 0.2 is a setting of local-optimizer 'sam' or 'fedgf'"),
    ("fedprox-mu=0.1 method='fedavg'", "'fedprox-mu' = 0.1 is a setting of method 'fedprox'"),
    ("local-optimizer='fedgf' fedgf-threshold=2.0", "'fedgf-threshold' = 2.0 is read only with fedgf-c-mode = "
                                                    "'adaptive' (this run: 'fixed'): it would be ignored. Set "
                                                    "fedgf-c-mode='adaptive', or leave fedgf-threshold out"),
])
def test_a_typed_setting_no_selected_part_reads_is_refused(run_config, message, capsys, monkeypatch, tmp_path):
    """By `fedvls check`, `fedvls deploy local` and `fedvls run` alike, before anything starts."""
    from fedvls_flwr.deploy import cli as deploy
    from fedvls_flwr.experiments import run
    from fedvls_flwr.ops import inprocess

    assert main(["--no-data", "--run-config", run_config]) == 2
    assert message in capsys.readouterr().err
    monkeypatch.setattr(LocalSuperLink, "start", lambda *a, **k: pytest.fail("a process was started"))
    assert deploy.main(["local", "--insecure", "--nodes", "2", "--run-config", run_config]) == 2
    assert message in capsys.readouterr().err
    monkeypatch.setattr(inprocess, "run_in_process", lambda *a, **k: pytest.fail("a run was started"))
    assert run.main(["--run-config", f"{run_config} output-dir='{tmp_path}'"]) == 2
    assert message in capsys.readouterr().err


def test_settings_of_the_selected_parts_and_presets_base_settings_pass(capsys, tmp_path):
    for run_config in ("protocol='fedconcat' fedconcat-assignment='0,1,0,1'", "local-optimizer='fedgf' fedgf-c=0.5",
                       "local-optimizer='sam' sam-rho=0.2", str(ROOT / "conf" / "fedvls-authors.toml")):
        assert main(["--no-data", "--run-config", run_config]) == 0, capsys.readouterr().err
    from fedvls_flwr.experiments.preset import load_preset

    # a preset's base gives every method's settings; each run reads its own
    (tmp_path / "p.yaml").write_text("base: {dataset: digits, fedprox-mu: 0.1, fedgf-c: 0.5}\n"
                                     "grid: {method: [fedavg, fedprox]}\n")
    assert len(load_preset(tmp_path / "p.yaml").runs) == 2
