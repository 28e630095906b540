"""Every preset in conf/ loads and validates (no SuperLink is started)."""

import os
import tomllib
from pathlib import Path

import pytest

from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.experiments.preset import PresetError, load_preset, split_federation

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_yaml_presets_validate(path):
    preset = load_preset(path)
    assert preset.runs, f"{path.name} defines no run"
    names = [r.get("run-name") for r in preset.runs]
    assert len(names) == len(preset.runs)


@pytest.mark.parametrize("path", sorted(CONF.glob("*.toml")), ids=lambda p: p.name)
def test_toml_run_configs_validate(path):
    parse_run_config(tomllib.loads(path.read_text()))


def test_authors_preset_is_what_spec_says():
    cfg = parse_run_config(tomllib.loads((CONF / "fedvls-authors.toml").read_text()))
    assert (cfg.method, cfg.weight_decay, cfg.teacher_mode, cfg.logit_weight) == ("fedvls", 0.0, "train", 0.005)


def test_bad_preset_fails_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {dataset: digits}\ngrid: {method: [fedavg, fedfoo]}\n")
    with pytest.raises(PresetError, match="'method' = 'fedfoo' is not allowed"):
        load_preset(bad)


@pytest.mark.parametrize(
    "base, message",
    [
        ("{dataset: mnist10k, data-dir: /nonexistent}", "/nonexistent"),
        ("{dataset: digits, partition: shards, shards-per-client: 500}", "shards_per_client=500"),
    ],
)
def test_missing_data_or_impossible_split_fails_before_any_superlink(tmp_path, base, message, monkeypatch):
    from fedvls_flwr.experiments import sweep

    monkeypatch.setattr(sweep.LocalSuperLink, "start", lambda *a, **k: pytest.fail("a SuperLink was started"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {base}\ngrid: {{method: [fedavg]}}\n")
    with pytest.raises(PresetError, match=message):
        sweep.run_preset(load_preset(bad), tmp_path / "out", report=False)


@pytest.mark.parametrize(
    "extra, message",
    [
        # each would pass --dry-run, then end in a Python traceback from `flwr run --federation-config`
        ("federation: {num-supernode: 10}", "unknown federation key 'num-supernode' (did you mean 'num-supernodes'?)"),
        ("federation: {num-supernodes: 0}", "federation 'num-supernodes' = 0: must be an integer >= 1"),
        ("federation: {client-resources-num-cpus: -1}", "'client-resources-num-cpus' = -1: must be a number > 0"),
        # were: accepted silently, a table column of dashes
        ("table: {rows: [datset], cols: [method]}", "unknown table rows entry 'datset' (did you mean 'dataset'?)"),
        ("table: {rows: [dataset], colums: [method]}", "unknown table key 'colums' (did you mean 'cols'?)"),
        ("table: {rows: [], cols: [method]}", "table 'rows' must be a non-empty list"),
        ("tabel: {rows: [dataset]}", "unknown top-level key 'tabel' (did you mean 'table'?)"),
        ("variants: [{num-supernode: 3}]", "unknown key in variants 'num-supernode' (did you mean 'num-supernodes'?)"),
        ("variants: {use-dis: false}", "'variants' must be a list of mappings"),
    ],
)
def test_preset_typos_fail_at_load_with_a_did_you_mean(tmp_path, extra, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {{dataset: digits}}\ngrid: {{method: [fedavg]}}\n{extra}\n")
    with pytest.raises(PresetError) as err:
        load_preset(bad)
    assert message in str(err.value)


def test_grid_key_typo_names_run_config_and_federation_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {dataset: digits}\ngrid: {method: [fedavg], num-supernode: [3, 5]}\n")
    with pytest.raises(PresetError, match="unknown key in grid 'num-supernode' \\(did you mean 'num-supernodes'\\?\\)"):
        load_preset(bad)
    good = tmp_path / "good.yaml"
    good.write_text("base: {dataset: digits}\ngrid: {method: [fedavg], num-supernodes: [3, 5]}\n"
                    "table: {rows: [dataset, num-server-rounds], cols: [label]}\n")
    preset = load_preset(good)
    assert [r["num-supernodes"] for r in preset.runs] == [3, 5]
    assert (preset.table_rows, preset.table_cols) == (("dataset", "num-server-rounds"), ("label",))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "lr="], "--set: 'lr=' has no value"),
        (["--set", "lr=0.1 momentum"], "--set: 'momentum' after 'lr=0.1' is not key=value"),
        (["--set", "lr"], "--set: 'lr' is not key=value"),
        (["--set", "lamda-dis=0.2"], "unknown key in --set 'lamda-dis' (did you mean 'lambda-dis'?)"),
        (["--only", "datset=digits"], "unknown --only key 'datset' (did you mean 'dataset'?)"),
        (["--seeds", "0,one"], "--seeds '0,one': expected comma-separated integers"),
        (["--seeds", ""], "--seeds '': expected comma-separated integers"),
        (["--seeds", "0,0"], "--seeds '0,0': seed 0 is given twice (one seed, one run); give each once"),
        (["--set", "lr=0.1", "--set", "lr=0.2"], "--set: 'lr' is given twice ('lr=0.1', then 'lr=0.2' in 'lr=0.2')"),
    ],
)
def test_sweep_command_line_rejects_bad_overrides(args, message, capsys):
    from fedvls_flwr.experiments.sweep import main

    assert main([str(CONF / "mnist10k-dir0.05.yaml"), "--dry-run", *args]) == 2
    assert message in capsys.readouterr().err


def test_sweep_set_takes_several_items_and_yaml_values(capsys):
    from fedvls_flwr.experiments.sweep import main

    assert main([str(CONF / "mnist10k-dir0.05.yaml"), "--dry-run", "--set", "lr=0.05 use-dis=false",
                 "--set", "run-name-suffix=x"]) == 2  # an unknown key still fails
    assert main([str(CONF / "mnist10k-dir0.05.yaml"), "--dry-run", "--set", "lr=0.05 use-dis=false"]) == 0
    out = capsys.readouterr().out
    assert '"lr": 0.05' in out and '"use-dis": false' in out


def test_damaged_run_folder_fails_before_any_superlink(tmp_path, monkeypatch):
    """A half-finished run the sweep would resume, with a truncated checkpoint: named at
    once, not after a SuperLink and Ray started and the run failed."""
    import json

    from fedvls_flwr.experiments import sweep

    monkeypatch.setattr(sweep.LocalSuperLink, "start", lambda *a, **k: pytest.fail("a SuperLink was started"))
    path = tmp_path / "p.yaml"
    path.write_text("base: {dataset: digits, num-server-rounds: 2}\ngrid: {method: [fedavg]}\n")
    preset = load_preset(path)
    out = (tmp_path / "out").resolve()
    run = {**split_federation(preset.runs[0])[0], "output-dir": str(out), "resume": True}
    folder = out / run["run-name"]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(parse_run_config(run).to_flower()))
    (folder / "state.json").write_text('{"round": 1}')
    (folder / "checkpoint.npz").write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(PresetError, match=f"run {run['run-name']}: resume: {folder / 'checkpoint.npz'} is damaged"):
        sweep.run_preset(preset, out, report=False)


def test_sweep_reuses_identical_finished_runs_and_refuses_a_folder_with_other_settings(tmp_path):
    """A planned run that finished under another name is not run again (also when that run
    was made by a version that did not know some keys yet: they ran at their defaults); a
    folder whose finished run differs from what is planned for it is an error."""
    import json

    from fedvls_flwr.config.run_config import RunConfig
    from fedvls_flwr.experiments import sweep

    out = tmp_path / "out"
    old = out / "made-by-an-older-version"
    old.mkdir(parents=True)
    config = {k: v for k, v in RunConfig(dataset="digits", num_server_rounds=1).to_flower().items()
              if k not in ("server-optimizer", "local-optimizer")}  # keys that version did not have
    identity = {"config": {k: v for k, v in config.items() if k not in sweep.NON_IDENTITY_KEYS}, "num-supernodes": 3}
    (old / sweep.RUN_FILE).write_text(json.dumps({"identity": identity}))
    (old / "summary.json").write_text(json.dumps({"status": "completed", "config": config}))
    preset_path = tmp_path / "p.yaml"
    preset_path.write_text("base: {dataset: digits, num-server-rounds: 1}\ngrid: {method: [fedvls]}\n"
                           "federation: {num-supernodes: 3}\n")
    result = sweep.run_preset(load_preset(preset_path), out, report=False)
    assert list(result["statuses"].values()) == ["skipped (the same run finished as made-by-an-older-version)"]
    # the planned run's own folder holding a different finished run
    name = load_preset(preset_path).runs[0]["run-name"]
    (out / name).mkdir()
    (out / name / "summary.json").write_text(json.dumps({"status": "completed", "config": {**config, "lr": 0.5}}))
    with pytest.raises(PresetError, match="other settings than planned for it \\(lr\\)"):
        sweep.run_preset(load_preset(preset_path), out, report=False)


def test_a_preset_with_a_non_default_model_gets_its_own_folder_names():
    """conf/fmnist-cnn.yaml and conf/table1-fmnist.yaml share an output directory in the
    README; without the model in the name the CNN runs would land in the MLP runs' folders."""
    cnn = {r["run-name"] for r in load_preset(CONF / "fmnist-cnn.yaml").runs}
    mlp = {r["run-name"] for r in load_preset(CONF / "table1-fmnist.yaml").runs}
    assert "fmnist-fedvls-dir0.05-modelcnn-s0" in cnn and "fmnist-fedvls-dir0.05-s0" in mlp
    assert not cnn & mlp
    # a model that varies within a preset is named once, by the grid
    backbones = [r["run-name"] for r in load_preset(CONF / "table3-backbones.yaml").runs]
    assert all(name.count("model") == 1 for name in backbones)


@pytest.mark.parametrize("grid", ["{method: []}", "{method: [fedavg], seed: []}", "[{method: [fedavg]}, {method: []}]"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_an_empty_grid_list_is_refused_naming_the_key(tmp_path, grid, dry_run, capsys, monkeypatch):
    """Not exit 0 and no output at all (the product of an empty list has no runs)."""
    from fedvls_flwr.experiments import sweep

    monkeypatch.setattr(sweep.LocalSuperLink, "start", lambda *a, **k: pytest.fail("a SuperLink was started"))
    bad = tmp_path / "empty.yaml"
    bad.write_text(f"base: {{dataset: digits}}\ngrid: {grid}\n")
    code = sweep.main([str(bad), "-o", str(tmp_path / "out")] + (["--dry-run"] if dry_run else []))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    key = "seed" if "seed" in grid else "method"
    assert f"grid key '{key}' is an empty list, so the preset has no runs" in captured.err


@pytest.mark.parametrize("engine", ["flwr", "inprocess"])
def test_a_sweep_still_starts_runs_whose_folders_do_not_exist_yet(tmp_path, monkeypatch, engine):
    """The sweep submits every run with resume=true (an interrupted run continues, a new one
    starts): refusing resume of a missing folder must not stop it before its first run."""
    from fedvls_flwr.experiments import sweep
    from fedvls_flwr.ops.run_pool import RunPool

    class Started(Exception):
        pass

    def start(*args, **kwargs):
        raise Started

    monkeypatch.setattr(sweep.LocalSuperLink, "start", start)
    monkeypatch.setattr(RunPool, "submit", start)
    path = tmp_path / "p.yaml"
    path.write_text("base: {dataset: digits, num-server-rounds: 2}\ngrid: {method: [fedavg, fedvls]}\n")
    with pytest.raises(Started):
        sweep.run_preset(load_preset(path), tmp_path / "out", report=False, engine=engine)


@pytest.mark.parametrize("text, key, lines", [
    ("base: {dataset: digits, lr: 0.1, lr: 0.01}\ngrid: {method: [fedavg]}\n", "lr", "lines 1 and 1"),
    ("base: {dataset: digits}\ngrid:\n  method: [fedavg, fedprox, moon]\n  method: [fedvls]\n", "method",
     "lines 3 and 4"),
    ("name: a\nbase: {dataset: digits}\ngrid: {method: [fedavg]}\nname: b\n", "name", "lines 1 and 4"),
])
def test_a_key_given_twice_in_a_preset_is_refused_naming_it_and_its_lines(tmp_path, text, key, lines, capsys):
    """YAML keeps the last of two equal keys: a grid meant for three methods would run one."""
    from fedvls_flwr.experiments.sweep import main

    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(PresetError, match=f"key '{key}' is given twice in one mapping \\({lines}\\)"):
        load_preset(path)
    assert main([str(path), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"preset {path}: key '{key}' is given twice" in captured.err


@pytest.mark.parametrize("timeout", ["-5", "0", "inf", "soon"])
def test_a_sweep_timeout_that_is_not_seconds_is_refused_before_anything_starts(tmp_path, timeout, capsys,
                                                                               monkeypatch):
    """A negative timeout started Ray and a SuperLink, then stopped every run at once."""
    from fedvls_flwr.experiments import sweep

    monkeypatch.setattr(sweep, "run_preset", lambda *a, **k: pytest.fail("the sweep started"))
    with pytest.raises(SystemExit) as exited:
        sweep.main([str(CONF / "mnist10k-dir0.05.yaml"), "-o", str(tmp_path / "out"), "--timeout", timeout])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout: " in err and timeout in err and "seconds" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["afile", "afile/runs"])
def test_a_sweep_output_dir_that_is_a_file_is_refused_as_such(tmp_path, where, capsys, monkeypatch):
    from fedvls_flwr.experiments import sweep

    monkeypatch.setattr(sweep, "run_preset", lambda *a, **k: pytest.fail("the sweep started"))
    (tmp_path / "afile").write_text("x")
    assert sweep.main([str(CONF / "mnist10k-dir0.05.yaml"), "-o", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert f"error: --output-dir {tmp_path / where}: " in err and "is a file; give a folder" in err
    assert "free space" not in err


def test_sweep_help_gives_the_timeout_default(capsys):
    from fedvls_flwr.experiments.sweep import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "seconds per run before it is stopped (default: 3600)" in " ".join(capsys.readouterr().out.split())


def test_a_finished_run_differing_only_in_settings_it_does_not_read_is_the_planned_run(tmp_path):
    """A FedGF run with a fixed c recorded fedgf-threshold = 1.5 (its default until it had none)
    and an SGD run recorded another method's fedprox-mu: neither reads them, so neither folder
    holds an 'other' run, and they are not run again."""
    import json

    from fedvls_flwr.config.run_config import RunConfig
    from fedvls_flwr.experiments import sweep

    out = tmp_path / "out"
    preset_path = tmp_path / "p.yaml"
    preset_path.write_text("base: {dataset: digits, num-server-rounds: 1}\n"
                           "grid: {method: [fedvls], local-optimizer: [sgd, fedgf]}\nfederation: {num-supernodes: 3}\n")
    for overrides in load_preset(preset_path).runs:
        recorded = {**RunConfig().to_flower(), **{k: v for k, v in overrides.items() if k != "num-supernodes"},
                    "fedgf-threshold": 1.5, "fedprox-mu": 0.5}
        (out / overrides["run-name"]).mkdir(parents=True)
        (out / overrides["run-name"] / "summary.json").write_text(json.dumps({"status": "completed", "config": recorded}))
    result = sweep.run_preset(load_preset(preset_path), out, report=False)
    assert list(result["statuses"].values()) == ["skipped (finished earlier)"] * 2
    adaptive = tmp_path / "adaptive.yaml"
    adaptive.write_text("base: {dataset: digits, num-server-rounds: 1, local-optimizer: fedgf, fedgf-c-mode: adaptive, "
                        "fedgf-threshold: 1.6}\ngrid: {method: [fedvls]}\nfederation: {num-supernodes: 3}\n")
    (run,) = load_preset(adaptive).runs
    recorded = {**RunConfig().to_flower(), **run, "fedgf-threshold": 1.5}
    (out / run["run-name"]).mkdir()
    (out / run["run-name"] / "summary.json").write_text(json.dumps({"status": "completed", "config": recorded}))
    with pytest.raises(PresetError, match="other settings than planned for it \\(fedgf-threshold\\)"):
        sweep.run_preset(load_preset(adaptive), out, report=False)  # the adaptive mode reads it


@pytest.mark.parametrize("every", ["-1", "nan", "soon"])
def test_a_progress_interval_that_is_not_seconds_is_refused(every, capsys):
    from fedvls_flwr.experiments.sweep import main

    with pytest.raises(SystemExit) as exited:
        main([str(CONF / "mnist10k-dir0.05.yaml"), "--dry-run", "--progress-every", every])
    assert exited.value.code == 2 and "argument --progress-every: " in capsys.readouterr().err


@pytest.mark.parametrize("where", ["base: {dataset: digits, run-name: same}\ngrid: {method: [fedavg, fedvls]}\n",
                                   "base: {dataset: digits}\ngrid: {method: [fedavg, fedvls]}\n"
                                   "variants: [{run-name: same}]\n"])
def test_a_preset_that_names_every_run_alike_is_told_so(tmp_path, where):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\n" + where)
    with pytest.raises(PresetError, match="sets run-name = 'same', so 2 runs would share one run folder .* leave "
                                          "run-name out of the preset"):
        load_preset(path)
    path.write_text("name: p\nbase: {dataset: digits}\ngrid: [{method: [fedavg]}, {method: [fedavg]}]\n")
    with pytest.raises(PresetError, match="two runs are identical \\(same settings, defaults included\\): "
                                          "\\{'dataset': 'digits', 'method': 'fedavg'\\} and"):
        load_preset(path)


def test_a_sweep_on_flower_without_ray_says_so_in_one_line(tmp_path):
    """Ray that cannot be imported (not installed, or broken): one line naming the package to
    install and the in-process engine, before anything starts - not Ray's traceback."""
    import os
    import subprocess
    import sys

    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    done = subprocess.run([sys.executable, "-m", "fedvls_flwr", "sweep", str(CONF / "mnist10k-dir0.05.yaml"), "-o",
                           str(tmp_path / "out"), "--engine", "flwr"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "shadow")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --engine flwr: every run is a flwr run in Flower's Ray simulation, but Ray cannot be imported here "
        "(ModuleNotFoundError: No module named 'ray'). Install it (pip install \"flwr[simulation]\"; "
        "scripts/setup.sh does), or run the sweep in-process: --engine inprocess"]


def test_a_stopped_sweep_counts_its_runs_another_preset_finished(tmp_path):
    """The stop message counts a run finished under the preset's own name and a run it would
    skip because another preset in the same folder finished the same experiment."""
    from fedvls_flwr.app.results import SUMMARY_FILE
    from fedvls_flwr.experiments import sweep

    path = tmp_path / "p.yaml"
    path.write_text("name: p\nbase: {dataset: digits}\ngrid: {method: [fedavg, fedvls, fedlc]}\n"
                    "federation: {num-supernodes: 4}\n")
    preset = load_preset(path)
    out = tmp_path / "out"
    (out / preset.runs[0]["run-name"]).mkdir(parents=True)  # finished under its own name
    (out / preset.runs[0]["run-name"] / SUMMARY_FILE).write_text('{"status": "completed"}')
    run_config, federation = split_federation(preset.runs[1])
    identity = sweep.experiment_identity(run_config, {**preset.federation, **federation}["num-supernodes"])
    (out / "other-presets-name").mkdir()  # the same experiment, finished as another preset's run
    (out / "other-presets-name" / sweep.RUN_FILE).write_text(__import__("json").dumps({"identity": identity}))
    (out / "other-presets-name" / SUMMARY_FILE).write_text('{"status": "completed"}')
    assert sweep.kept_after_stop(preset, out, [str(path)]).startswith(f"2 of 3 runs are finished in {out}")
    assert sweep.sweep_report_dir(preset, out) == out / "report" / "p"


def two_run_preset(tmp_path):
    """A preset of two short digits runs: (the preset, its first and second run's names, the output folder)."""
    path = tmp_path / "p.yaml"
    path.write_text("base: {dataset: digits, num-server-rounds: 2}\ngrid: {method: [fedavg, fedvls]}\n"
                    "federation: {num-supernodes: 2, client-resources-num-cpus: 1}\n")
    preset = load_preset(path)
    first, second = (r["run-name"] for r in preset.runs)
    return preset, first, second, tmp_path / "out"


def sweep_releasing(preset, out, engine, held):
    """The preset's sweep on ``out`` (no report), then the folder locks ``held`` (the other
    sweep's) released: (its result, its log lines)."""
    from fedvls_flwr.experiments import sweep

    logs: list[str] = []
    try:
        return sweep.run_preset(preset, out, report=False, engine=engine, shared_ray=False, log=logs.append), logs
    finally:
        for lock in held:
            lock.release()


def engines_that_run(monkeypatch, run) -> None:
    """Both engines of a sweep stubbed: each run is ``run(name)`` (what its ServerApp does),
    one at a time, and comes back completed, or with the error ``run`` returns (failed)."""
    from fedvls_flwr.experiments import sweep
    from fedvls_flwr.ops import run_pool

    class Pool:
        def __init__(self, **kwargs):
            self.busy = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        @property
        def free(self):
            return 1 - len(self.busy)

        def submit(self, job):
            self.busy.append((job, run(job.key)))

        def wait(self, poll=0.5):
            while self.busy:
                job, error = self.busy.pop()
                yield run_pool.Outcome(job.key, "failed" if error else "completed", error or "")

    class Outcome:
        def __init__(self, error):
            self.status, self.completed, self.log = ("failed", False, error) if error else ("completed", True, "")

    class Link:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def submit(self, app, run_config, federation_config):
            self.error = run(run_config["run-name"])
            return 1

        def wait(self, run_id, timeout):
            return Outcome(self.error)

    monkeypatch.setattr(run_pool, "RunPool", Pool)
    monkeypatch.setattr(sweep, "LocalSuperLink", Link)


@pytest.mark.parametrize("other", ["finished", "running"])
@pytest.mark.parametrize("engine", ["flwr", "inprocess"])
def test_a_run_another_sweep_took_meanwhile_is_not_started_again(tmp_path, monkeypatch, engine, other):
    """Two sweeps of one preset on one folder: by the time this one reaches its second run, the
    other has finished it, or runs it (holds its run.lock: it may be writing its summary). Started
    with resume=true it took the folder once the other let go, ran with no round left and
    rewrote that run's summary.json and final model as its own (wall_seconds 0.1 s,
    resumed_after_round = the last round). It is not started: a finished one is skipped, as a
    run finished before the sweep started is; a running one is the refusal it would have met."""
    import json

    from fedvls_flwr.app.results import RunFolderLock

    preset, first, second, out = two_run_preset(tmp_path)
    theirs = {"status": "completed", "config": {}, "wall_seconds": 7.0}
    started: list[str] = []
    held: list[RunFolderLock] = []

    def run(name: str) -> None:
        """This sweep runs ``name``; meanwhile the other sweep takes the second run."""
        started.append(name)
        (out / name / "summary.json").write_text(json.dumps({"status": "completed", "best_accuracy": 0.5,
                                                             "best_round": 2, "final_accuracy": 0.5}))
        if name == second:
            return
        if other == "finished":
            (out / second).mkdir(exist_ok=True)
            (out / second / "summary.json").write_text(json.dumps(theirs))
        else:
            held.append(RunFolderLock(out / second, resume=True).acquire())

    engines_that_run(monkeypatch, run)
    result, logs = sweep_releasing(preset, out, engine, held)
    assert started == [first], logs
    # the taken run has its "(2/2)" line like every run of the plan, its reason right under it
    at = next(i for i, line in enumerate(logs) if line.startswith(f"[sweep] (2/2) {second} ..."))
    assert logs[at + 1].startswith(f"[sweep]     {second}: "), logs
    if other == "finished":
        assert result["statuses"] == {first: "completed", second: "skipped (finished meanwhile, by another process)"}
        assert json.loads((out / second / "summary.json").read_text()) == theirs  # not rewritten
        assert any(f"{second}: finished meanwhile by another process" in line for line in logs), logs
    else:
        assert result["statuses"][second] == "failed (its run folder is in use by another process)"
        assert any(f"{second}: not started: resume: the run in {out / second} is still going (pid {os.getpid()}"
                   in line for line in logs), logs


@pytest.mark.parametrize("engine", ["flwr", "inprocess"])
def test_a_run_another_sweep_finished_just_before_it_started_is_said_as_taken(tmp_path, monkeypatch, engine):
    """The other sweep finishes the run after this one asked (no lock, no summary) and before it
    submitted it: the run's ServerApp finds every round done and writes nothing, and comes back
    completed. It was reported as this sweep's run ("best ..., 0.1s"); it is said as taken
    meanwhile. A run that writes its own summary (the first) is this sweep's, as before."""
    import json

    from fedvls_flwr.experiments import sweep

    preset, first, second, out = two_run_preset(tmp_path)
    theirs = {"status": "completed", "best_accuracy": 0.7, "best_round": 2, "final_accuracy": 0.7}
    record_start = sweep._record_start

    def record_then_theirs(output_dir, run_config, *rest):
        name = record_start(output_dir, run_config, *rest)
        if name == second:  # the other sweep's ServerApp writes its summary now, in the window
            (output_dir / name / "summary.json").write_text(json.dumps(theirs))
        return name

    def run(name: str) -> None:
        """The ServerApp: the first run trains and writes its summary; the second is finished."""
        if name == first:
            (out / name / "summary.json").write_text(json.dumps({**theirs, "best_accuracy": 0.5}))

    monkeypatch.setattr(sweep, "_record_start", record_then_theirs)
    engines_that_run(monkeypatch, run)
    logs: list[str] = []
    result = sweep.run_preset(preset, out, report=False, engine=engine, shared_ray=False, log=logs.append)
    assert result["statuses"] == {first: "completed", second: "skipped (finished meanwhile, by another process)"}, logs
    assert any(f"{first}: best 50.00%" in line for line in logs), logs
    assert any(f"{second}: finished meanwhile by another process" in line for line in logs), logs
    assert not any(f"{second}: best" in line for line in logs), logs


@pytest.mark.parametrize("engine", ["flwr", "inprocess"])
def test_a_run_whose_folder_another_sweep_took_just_before_it_started_is_said_as_in_use(tmp_path, monkeypatch, engine):
    """The other sweep takes the run's folder after this one asked (free) and before its
    ServerApp starts: the ServerApp is refused ("still going") and the run comes back failed.
    It is said as the refusal a run in use meets, as when this sweep finds the folder held before
    starting it - not as a failure with a log to read. The other run is not disturbed."""
    from fedvls_flwr.app.results import RunFolderBusy, RunFolderLock, busy_message, lock_holder
    from fedvls_flwr.experiments import sweep

    preset, first, second, out = two_run_preset(tmp_path)
    held: list[RunFolderLock] = []
    record_start = sweep._record_start

    def record_then_taken(output_dir, run_config, *rest):
        name = record_start(output_dir, run_config, *rest)
        if name == second:  # the other sweep's ServerApp takes the folder now, in the window
            held.append(RunFolderLock(output_dir / name, resume=True).acquire())
        return name

    def run(name: str) -> str | None:
        """The ServerApp: the first run trains; the second is refused, as RunFolderLock refuses."""
        if name == first:
            (out / name / "summary.json").write_text('{"status": "completed", "best_accuracy": 0.5, '
                                                     '"best_round": 2, "final_accuracy": 0.5}')
            return None
        return str(RunFolderBusy(busy_message(out / name, lock_holder(out / name), resume=True)))

    monkeypatch.setattr(sweep, "_record_start", record_then_taken)
    engines_that_run(monkeypatch, run)
    result, logs = sweep_releasing(preset, out, engine, held)
    assert result["statuses"] == {first: "completed", second: "failed (its run folder is in use by another process)"}
    assert any(f"{second}: not started: resume: the run in {out / second} is still going (pid {os.getpid()}" in line
               for line in logs), logs
    assert not (out / f"{second}.failed.log").exists()


def test_a_sweep_stopped_in_its_report_says_the_command_writes_the_report(tmp_path):
    """Ctrl-C while the sweep wrote its report (every run finished) said "3 of 3 runs are finished
    ..., and a run stopped midway keeps its saved rounds; to continue (... the others resume)":
    no run was midway, and the report it had not written was not named."""
    from fedvls_flwr.app.results import SUMMARY_FILE
    from fedvls_flwr.experiments import sweep

    path = tmp_path / "p.yaml"
    path.write_text("name: p\nbase: {dataset: digits}\ngrid: {method: [fedavg, fedvls]}\n"
                    "federation: {num-supernodes: 4}\n")
    preset = load_preset(path)
    out = tmp_path / "out"
    for run in preset.runs:
        (out / run["run-name"]).mkdir(parents=True)
        (out / run["run-name"] / SUMMARY_FILE).write_text('{"status": "completed"}')
    assert sweep.kept_after_stop(preset, out, [str(path), "-o", str(out)]) == (
        f"all 2 runs are finished in {out}; to write its report ({out / 'report' / 'p'}; the finished runs are "
        f"skipped): fedvls sweep {path} -o {out}")
