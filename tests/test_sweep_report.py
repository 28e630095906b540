"""Where a sweep's report goes and what it leaves alone, with the runs faked (no training): two
presets whose names make one report folder are stopped before any run, and report files an
earlier version left straight in ``<output>/report/`` are named, not removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedvls_flwr.experiments import sweep
from fedvls_flwr.experiments.preset import PresetError, load_preset
from fedvls_flwr.experiments.report import make_report


def _preset(tmp_path: Path, name: str, methods: str = "[fedavg, fedvls]", path: Path | None = None) -> Path:
    """A preset YAML: ``path``, or a new file in ``tmp_path``."""
    path = path or tmp_path / f"{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(f"name: {name}\nbase: {{dataset: digits, num-server-rounds: 2}}\n"
                    f"grid: {{method: {methods}}}\nfederation: {{num-supernodes: 3}}\n")
    return path


@pytest.fixture()
def fake_runs(monkeypatch) -> list[str]:
    """The in-process engine replaced by run folders with two recorded rounds each; the names
    of the runs it was given."""
    started: list[str] = []

    def run(todo, planned, output_dir, statuses, view, **_):
        for run_config, _federation, _identity in todo:
            name = run_config["run-name"]
            (output_dir / name).mkdir()
            (output_dir / name / "rounds.jsonl").write_text(
                "".join(json.dumps({"round": r, "accuracy": 0.5 + r / 10}) + "\n" for r in (0, 1, 2)))
            (output_dir / name / "summary.json").write_text(json.dumps(
                {"status": "completed", "config": run_config, "best_accuracy": 0.7, "best_round": 2,
                 "final_accuracy": 0.7, "final_round": 2, "rounds_completed": 2}))
            statuses[name] = "completed"
            started.append(name)

    monkeypatch.setattr(sweep, "_run_in_process", run)
    return started


def test_two_presets_whose_names_make_one_report_folder_are_stopped_before_any_run(tmp_path, fake_runs, capsys,
                                                                                  monkeypatch):
    """'table-1' and 'table 1' both make report/table-1/: the second sweep would write its
    report over the first's. It stops before any run, naming both presets and the ways out."""
    out = tmp_path / "out"
    first = sweep.run_preset(load_preset(_preset(tmp_path, "table-1")), out, log=lambda *a: None)
    assert first["report"]["table_md"] == out / "report" / "table-1" / "results.md"
    before = {p.name: p.read_bytes() for p in (out / "report" / "table-1").iterdir()}
    ran = list(fake_runs)
    clash = load_preset(_preset(tmp_path, "table 1", methods="[fedlc]"))
    with pytest.raises(PresetError) as err:
        sweep.run_preset(clash, out, log=lambda *a: None)
    assert str(err.value) == (
        f"preset {clash.path}: its name 'table 1' makes the report folder {out / 'report' / 'table-1'}, which holds "
        "the report of preset 'table-1' (both names make the folder name 'table-1'); rename one of them (name: in "
        "its YAML), give this sweep another --output-dir, or, if 'table-1' was this preset's old name, remove "
        f"{out / 'report' / 'table-1'}")
    assert fake_runs == ran  # no run started
    assert {p.name: p.read_bytes() for p in (out / "report" / "table-1").iterdir()} == before
    # the command line says it in one line, exit status 2
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    capsys.readouterr()
    assert sweep.main([str(clash.path), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {err.value}\n"
    assert fake_runs == ran


def test_a_preset_swept_again_or_into_a_folder_fedvls_report_wrote_keeps_its_report_folder(tmp_path, fake_runs):
    """Not a clash: the same preset again (more runs: its report is written anew), or a report
    folder that `fedvls report --out` wrote (its manifest names no preset)."""
    from fedvls_flwr.experiments.report import MANIFEST

    out = tmp_path / "out"
    first = _preset(tmp_path, "table-1", methods="[fedavg]")
    sweep.run_preset(load_preset(first), out, log=lambda *a: None)
    again = sweep.run_preset(load_preset(_preset(tmp_path, "table-1", path=first)), out, log=lambda *a: None)  # edited
    assert "FedVLS" in again["report"]["table_md"].read_text()
    make_report(out, out / "report" / "other")
    assert json.loads((out / "report" / "other" / MANIFEST).read_text())["preset"] is None
    assert sweep.run_preset(load_preset(_preset(tmp_path, "other")), out, log=lambda *a: None)["report"]
    assert json.loads((out / "report" / "other" / MANIFEST).read_text())["preset"] == "other"
    moved = first.rename(tmp_path / "moved.yaml")  # a YAML moved away is the same preset, not another one
    assert sweep.run_preset(load_preset(_preset(tmp_path, "table-1", path=moved)), out, log=lambda *a: None)["report"]


def test_two_yamls_of_one_name_are_stopped_before_any_run(tmp_path, fake_runs):
    """A copied preset whose name was not changed (or t1.yaml in two folders) would write its
    report over the other's; while the other YAML exists, it stops before any run."""
    out = tmp_path / "out"
    first = _preset(tmp_path, "table-1")
    sweep.run_preset(load_preset(first), out, log=lambda *a: None)
    ran = list(fake_runs)
    copy = load_preset(_preset(tmp_path, "table-1", methods="[fedlc]"))
    with pytest.raises(PresetError) as err:
        sweep.run_preset(copy, out, log=lambda *a: None)
    assert str(err.value).startswith(f"preset {copy.path}: the report folder {out / 'report' / 'table-1'} holds the "
                                     f"report of another preset of the same name 'table-1', {first.resolve()}, ")
    assert fake_runs == ran


def test_an_earlier_versions_report_straight_in_report_is_named_not_removed(tmp_path, fake_runs):
    """Earlier versions wrote a sweep's report straight into <output>/report/: beside the
    per-preset folders it would read as current. The sweep names those files in one line and
    removes none (no manifest says a report wrote them: they may be the user's)."""
    out = tmp_path / "out"
    (out / "report").mkdir(parents=True)
    old = {"results.md": "old table", "accuracy-digits-dirichlet-0.5.png": "old plot", "notes.txt": "mine"}
    for name, text in old.items():
        (out / "report" / name).write_text(text)
    logs: list[str] = []
    preset = _preset(tmp_path, "table-1")
    sweep.run_preset(load_preset(preset), out, log=logs.append)
    notes = [line for line in logs if "also holds" in line]
    assert notes == [
        f"[sweep] note: {out / 'report'} also holds accuracy-digits-dirichlet-0.5.png, results.md, not of this "
        f"report: an earlier version's sweep report (each preset's report is now in {out / 'report'}/<preset name>/) "
        "or your own files; left as they are: remove them if they are stale"], logs
    assert {name: (out / "report" / name).read_text() for name in old} == old
    # a report of the whole folder that `fedvls report` writes there now is current: not named
    for name in old:
        (out / "report" / name).unlink()
    make_report(out, out / "report")
    logs.clear()
    sweep.run_preset(load_preset(preset), out, log=logs.append)
    assert not [line for line in logs if "also holds" in line], logs


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_dry_run_says_what_the_sweep_would_refuse_and_what_it_would_run_and_writes_nothing(tmp_path, fake_runs,
                                                                                             capsys, monkeypatch):
    """``--dry-run`` makes the sweep's own checks before its first run (here: the report folder
    another preset's report holds) with the same message and exit status 2, and otherwise counts
    the runs finished and new; it writes nothing and starts no run."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "out"
    first = _preset(tmp_path, "table-1", methods="[fedavg]")
    sweep.run_preset(load_preset(first), out, log=lambda *a: None)
    grown = _preset(tmp_path, "table-1", methods="[fedavg, fedlc, fedvls]", path=first)
    names = [run["run-name"] for run in load_preset(grown).runs]
    assert [name.split("-")[1] for name in names] == ["fedavg", "fedlc", "fedvls"]
    before, ran = _tree(out), list(fake_runs)
    capsys.readouterr()
    assert sweep.main([str(grown), "-o", str(out), "--dry-run"]) == 0
    said = capsys.readouterr()
    assert [line.split(" ", 1)[0] for line in said.out.splitlines()] == names
    assert said.err.startswith(f"dry run: 3 runs in {out}: 1 finished (skipped), 0 stopped midway (they continue from "
                               "their last checkpoint), 2 new;")  # a stopped run: tests/test_e2e_sweep.py
    clash = _preset(tmp_path, "table 1", methods="[fedlc]")
    assert sweep.main([str(clash), "-o", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: preset {clash}: its name 'table 1' makes the report folder {out / 'report' / 'table-1'}")
    assert sweep.main([str(clash), "-o", str(tmp_path / "new"), "--dry-run"]) == 0
    assert _tree(out) == before and fake_runs == ran and not (tmp_path / "new").exists()


@pytest.mark.parametrize("damage", ['{"status": "compl', "[]", "", '{"status": "completed", "config": "x"}'])
def test_a_finished_runs_damaged_summary_is_named_with_the_fix_not_a_traceback(tmp_path, fake_runs, capsys, monkeypatch,
                                                                               damage):
    """A summary.json that cannot be read (a disk that filled up, a hand edit) stops the sweep
    before any run - and its dry run - naming the file and what to do, exit status 2."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "out"
    preset = _preset(tmp_path, "table-1")
    sweep.run_preset(load_preset(preset), out, log=lambda *a: None)
    summary = out / load_preset(preset).runs[1]["run-name"] / "summary.json"
    summary.write_text(damage)
    ran = list(fake_runs)
    capsys.readouterr()
    for dry in ([], ["--dry-run"]):
        assert sweep.main([str(preset), "-o", str(out), *dry]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {summary} cannot be read (") and "Traceback" not in err
        assert err.endswith(f"remove that file and run the sweep again - the run continues from its checkpoint (its "
                            f"rounds are kept) and writes a new one - or move {summary.parent} away\n")
    assert fake_runs == ran


def test_a_tilde_in_the_output_folder_is_the_home_folder_for_the_sweep_and_its_dry_run(tmp_path, fake_runs, capsys,
                                                                                        monkeypatch):
    """bash leaves '~' as typed in --output-dir=~/runs: the sweep does not make a folder named '~'
    where it runs, and its dry run looks where the sweep writes."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    preset = _preset(tmp_path, "table-1", methods="[fedavg]")
    assert sweep.main([str(preset), "--output-dir=~/runs"]) == 0
    assert fake_runs and (tmp_path / "home" / "runs" / fake_runs[0] / "summary.json").is_file()
    assert not (tmp_path / "~").exists()
    capsys.readouterr()
    assert sweep.main([str(preset), "--output-dir=~/runs", "--dry-run"]) == 0
    assert capsys.readouterr().err.startswith(f"dry run: 1 run in {tmp_path / 'home' / 'runs'}: 1 finished (skipped)")


def test_a_gpu_share_on_a_machine_without_a_gpu_is_refused_before_the_data_and_by_the_dry_run(tmp_path, fake_runs,
                                                                                               capsys, monkeypatch):
    from fedvls_flwr.experiments import preset as preset_module

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sweep, "check_data", lambda *a: pytest.fail("the data was loaded first"))
    monkeypatch.setattr(preset_module, "check_data", lambda *a: pytest.fail("the data was loaded first"))
    path = tmp_path / "gpu.yaml"
    path.write_text("name: g\nbase: {dataset: digits}\ngrid: {method: [fedavg]}\n"
                    "federation: {num-supernodes: 3, client-resources-num-gpus: 0.25}\n")
    for dry in (["--dry-run"], []):
        assert sweep.main([str(path), "-o", str(tmp_path / "out"), *dry]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "client-resources-num-gpus = 0.25" in err and "no GPU" in err, err
    assert not fake_runs and not (tmp_path / "out").exists()
