"""A YAML preset run by fedvls_flwr.experiments.sweep end to end (on the in-process engine, its
default on one machine), a sweep killed after its first run that finishes the rest without
re-running that run, and a sweep stopped by SIGTERM that stops everything it started (worker
processes; with --engine flwr, the SuperLink, the simulation and the shared Ray head)."""

import csv
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedvls_flwr.experiments.preset import load_preset
from fedvls_flwr.experiments.progress import PROGRESS_FILE
from fedvls_flwr.experiments.report import method_label
from fedvls_flwr.experiments.sweep import run_preset
from fedvls_flwr.ops.launch import PROJECT_DIR
from fedvls_flwr.ops.processes import descendants, stop_process
from tests.processes import assert_none_left

pytestmark = pytest.mark.e2e

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_TIMEOUT = 300.0
PRESET = """\
name: tiny-e2e
description: two one-round digits runs
base:
  dataset: digits
  num-server-rounds: 1
  local-epochs: 1
  dirichlet-beta: 0.5
grid:
  method: [fedavg, fedvls]
  seed: [0]
federation:
  num-supernodes: 3
  client-resources-num-cpus: 1
"""
FIRST, SECOND = "digits-fedavg-dir0.5-s0", "digits-fedvls-dir0.5-s0"
# A one-round digits run takes a tenth of a second in-process: runs that are to be interrupted
# get rounds to be interrupted in (the kill lands within a poll, ~0.1 s, of the signal it waits for).
ROUNDS_TO_INTERRUPT = 40


def write_preset(tmp_path: Path, rounds: int = 1) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(PRESET.replace("num-server-rounds: 1", f"num-server-rounds: {rounds}"))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_tiny_preset_runs_end_to_end_and_its_table_matches_the_summaries(tmp_path):
    preset = load_preset(write_preset(tmp_path))
    assert [r["run-name"] for r in preset.runs] == [FIRST, SECOND]
    out = tmp_path / "out"
    logs: list[str] = []
    result = run_preset(preset, out, timeout=RUN_TIMEOUT, log=logs.append)
    assert not (out / ".flwr-home").exists()  # no SuperLink, no Ray

    assert result["statuses"] == {FIRST: "completed", SECOND: "completed"}, "\n".join(logs)
    # the progress: each run's round with its accuracy and the time left, every estimate on file
    for i, name in enumerate((FIRST, SECOND), 1):
        assert any(line.startswith(f"[sweep] ({i}/2) {name}: round 1/1, accuracy ") and "sweep ~" in line
                   for line in logs), "\n".join(logs)
    progress = [json.loads(line) for line in (out / PROGRESS_FILE).read_text().splitlines()]
    assert [(e["event"], e.get("run")) for e in progress if e["event"] != "round"] == [
        ("run-start", FIRST), ("run-end", FIRST), ("run-start", SECOND), ("run-end", SECOND), ("sweep-end", None)]
    summaries = {}
    for name in (FIRST, SECOND):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert summary["final_round"] == 1 and summary["rounds_completed"] == 1
        assert 0.0 <= summary["best_accuracy"] <= 1.0 and 0.0 <= summary["final_accuracy"] <= 1.0
        summaries[name] = summary
    assert {s["config"]["method"] for s in summaries.values()} == {"fedavg", "fedvls"}
    # both runs' clients ran in the sweep's worker process, on this machine
    nodes = [set(s["replies_per_node"]) for s in summaries.values()]
    assert nodes[0] == nodes[1] == {socket.gethostname()}, nodes
    assert (out / FIRST / "run.log").read_text().count("round 1/1: accuracy") == 1

    report_dir = out / "report" / "tiny-e2e"  # the preset's own report folder
    md_path, csv_path = report_dir / "results.md", report_dir / "results.csv"
    assert result["report"]["table_md"] == md_path and result["report"]["table_csv"] == csv_path
    rows = read_csv(csv_path)
    assert list(rows[0]) == [
        "dataset", "partition", "dirichlet-beta", "method", "n", "best_mean", "best_std",
        "final_mean", "final_std", "seeds", "best_per_seed", "final_per_seed", "excluded", "dropped_share",
    ]
    by_label = {row["method"]: row for row in rows}
    assert len(rows) == len(by_label) == 2
    markdown = md_path.read_text()
    for summary in summaries.values():
        row = by_label[method_label(summary["config"])]
        assert (row["dataset"], row["partition"], float(row["dirichlet-beta"])) == ("digits", "dirichlet", 0.5)
        assert (row["n"], row["seeds"], row["best_std"], row["final_std"]) == ("1", "0", "0.0", "0.0")
        assert row["excluded"] == "" and 0.0 <= float(row["dropped_share"]) <= 1.0
        best, final = 100 * summary["best_accuracy"], 100 * summary["final_accuracy"]
        assert float(row["best_mean"]) == pytest.approx(best, abs=1e-9, rel=0)
        assert float(row["final_mean"]) == pytest.approx(final, abs=1e-9, rel=0)
        assert float(row["best_per_seed"]) == pytest.approx(best, abs=1e-9, rel=0)
        assert float(row["final_per_seed"]) == pytest.approx(final, abs=1e-9, rel=0)
        assert f"{best:.2f} ({final:.2f})" in markdown

    plots = {name: Path(p) for name, p in result["report"].items() if name.startswith(("accuracy-", "per-class-", "partition-"))}
    kinds = {name.split("-digits")[0] for name in plots}
    assert kinds == {"accuracy", "per-class", "partition"}, sorted(plots)
    assert set(plots.values()) == set(report_dir.glob("*.png"))
    for path in plots.values():
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path


def test_a_sweeps_report_is_of_its_own_runs_when_its_folder_holds_another_presets(tmp_path):
    """Several presets may share one output folder (the docs' Fashion-MNIST presets do): a
    sweep's report tabulates its own runs, not another preset's run of the same method and seed
    (which it would otherwise count, or count instead of its own)."""
    out = tmp_path / "out"
    other = tmp_path / "other.yaml"
    other.write_text(PRESET.replace("name: tiny-e2e", "name: other-e2e").replace(
        "  method: [fedavg, fedvls]\n", "  method: [fedavg]\n  lr: [0.5, 0.2]\n"))
    foreign = [run["run-name"] for run in load_preset(other).runs]
    assert len(foreign) == 2 and not set(foreign) & {FIRST, SECOND}, foreign
    assert run_preset(load_preset(other), out, timeout=RUN_TIMEOUT)["statuses"] == dict.fromkeys(foreign, "completed")
    others_report = (out / "report" / "other-e2e" / "results.md").read_text()
    result = run_preset(load_preset(write_preset(tmp_path)), out, timeout=RUN_TIMEOUT)
    assert result["statuses"] == {FIRST: "completed", SECOND: "completed"}
    rows = {row["method"]: row for row in read_csv(out / "report" / "tiny-e2e" / "results.csv")}
    assert len(rows) == 2 and all(row["n"] == "1" and row["excluded"] == "" for row in rows.values()), rows
    for name in (FIRST, SECOND):
        summary = json.loads((out / name / "summary.json").read_text())
        row = rows[method_label(summary["config"])]
        assert float(row["best_mean"]) == pytest.approx(100 * summary["best_accuracy"], abs=1e-9, rel=0)
    table = (out / "report" / "tiny-e2e" / "results.md").read_text()
    assert not [name for name in foreign if name in table], table  # not even as runs left out
    # each preset's report in its own folder: the other's is as its sweep wrote it
    assert (out / "report" / "other-e2e" / "results.md").read_text() == others_report


def test_sweep_killed_after_its_first_run_resumes_without_rerunning_it(tmp_path):
    """Stronger form: the real command line is killed (its whole process tree) as soon as
    the first run's summary.json appears, then the same preset is run again in-process."""
    preset_path = write_preset(tmp_path, rounds=ROUNDS_TO_INTERRUPT)
    out = (tmp_path / "out").resolve()
    flwr_home = out / ".flwr-home"
    first_summary = out / FIRST / "summary.json"
    console = tmp_path / "sweep-killed.log"
    seen: set[int] = set()
    with console.open("wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedvls_flwr", "sweep", str(preset_path), "-o", str(out), "--timeout", str(RUN_TIMEOUT)],
            cwd=PROJECT_DIR, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not first_summary.exists():
            seen.update(descendants(proc.pid))
            if proc.poll() is not None:
                pytest.fail(f"sweep exited ({proc.returncode}) before its first run finished:\n"
                            f"{console.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the first run never finished:\n{console.read_text()[-3000:]}")
            time.sleep(0.1)
        seen.update(descendants(proc.pid))
        stop_process(proc)
    finally:
        if proc.poll() is None:
            stop_process(proc)
    assert proc.returncode not in (0, None), "the sweep ended by itself instead of being interrupted"
    assert seen, "the sweep started no processes?"
    assert_none_left(seen | {proc.pid}, flwr_home)
    # it was really interrupted: the second run had not finished
    assert not (out / SECOND / "summary.json").exists()
    assert not (out / "report").exists()

    first_files = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / FIRST).iterdir() if p.is_file()}
    assert json.loads(first_summary.read_text())["status"] == "completed"

    logs: list[str] = []
    result = run_preset(load_preset(preset_path), out, timeout=RUN_TIMEOUT, log=logs.append)
    assert_none_left((), flwr_home)
    assert result["statuses"] == {
        FIRST: "skipped (finished earlier)", SECOND: "completed",
    }, "\n".join(logs)
    assert "2 runs, 1 already finished, 1 to run" in logs[0]
    assert not any(FIRST in line for line in logs[1:] if line.startswith("[sweep] (")), logs
    # nothing in the first run's folder was touched (same files, same mtimes, same bytes)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes())
            for p in (out / FIRST).iterdir() if p.is_file()} == first_files

    second = json.loads((out / SECOND / "summary.json").read_text())
    assert second["status"] == "completed" and second["rounds_completed"] == ROUNDS_TO_INTERRUPT
    labels = {row["method"] for row in read_csv(out / "report" / "tiny-e2e" / "results.csv")}
    assert labels == {"FedAvg", "FedVLS"}


@pytest.mark.parametrize("engine", ["flwr", "inprocess"])
def test_sweep_stopped_by_sigterm_stops_everything_it_started(tmp_path, engine):
    """`kill PID` on the sweep alone (SIGTERM, as a scheduler or a closed session sends it),
    in the middle of its first run: the sweep itself stops, by PID, what it started - its
    worker process, or its SuperLink, the simulation and its shared Ray head - and exits with
    143 (Python's default for SIGTERM would end it at once and leave them running)."""
    import signal

    out = (tmp_path / "out").resolve()
    started = out / FIRST / "rounds.jsonl"
    console = tmp_path / "sweep-terminated.log"
    preset = write_preset(tmp_path, rounds=ROUNDS_TO_INTERRUPT if engine == "inprocess" else 1)
    seen: set[int] = set()
    with console.open("wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedvls_flwr", "sweep", str(preset), "-o", str(out),
             "--timeout", str(RUN_TIMEOUT), "--engine", engine],
            cwd=PROJECT_DIR, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not started.exists():
            seen.update(descendants(proc.pid))
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the first run never started:\n{console.read_text()[-3000:]}")
            time.sleep(0.1)
        seen.update(descendants(proc.pid))
        said = console.read_text()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            stop_process(proc)
    log = console.read_text()
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert "fedvls sweep: stopped by SIGTERM" in log, log[-3000:]
    if engine == "flwr":
        assert "one Ray for the whole sweep" in said, said
        assert len(seen) >= 5, seen  # the SuperLink, its SuperExec, the simulation, the Ray head's processes
    else:
        assert "in-process engine: 1 run(s) at once" in said and len(seen) >= 1, (said, seen)
    assert_none_left(seen, out / ".flwr-home", timeout=20.0)
    assert not (out / SECOND).exists()


def interruptible() -> None:
    """In the child, before exec: Ctrl-C's default action back. A suite started with SIGINT ignored
    (``nohup ... &``, a non-interactive shell's background job) passes that on to its children, and
    Python then installs no KeyboardInterrupt handler: the run would not see the test's Ctrl-C."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ctrl_c_after_a_saved_round(command: list[str], cwd: Path, state: Path) -> tuple[int, str, str, set[int]]:
    """Start ``command`` as its own process group, wait until ``state`` (a run's state.json)
    exists, then send SIGINT to the whole group as a terminal's Ctrl-C does: (exit code,
    stdout, stderr, every process of the group seen meanwhile)."""
    import os
    import signal

    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=interruptible)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not state.exists():
            seen.update(descendants(proc.pid))
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no round was saved:\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.05)
        seen.update(descendants(proc.pid))
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            stop_process(proc)
    return proc.returncode, stdout, stderr, seen


def test_ctrl_c_stops_a_sweep_with_one_line_saying_what_is_kept(tmp_path, capsys, monkeypatch):
    """Ctrl-C as a terminal sends it (SIGINT to the whole foreground process group: the sweep and
    its worker) in the middle of the first run: no traceback, exit 130, one line that says what is
    kept and the command that continues; the worker is gone, and the run it stopped resumes from
    the rounds it saved when the sweep is run again."""
    import shlex

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    out = (tmp_path / "out").resolve()
    saved = out / FIRST / "state.json"
    preset = write_preset(tmp_path, rounds=ROUNDS_TO_INTERRUPT)
    code, stdout, stderr, seen = ctrl_c_after_a_saved_round(
        [sys.executable, "-m", "fedvls_flwr", "sweep", str(preset), "-o", str(out)], PROJECT_DIR, saved)
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fedvls sweep: stopped by Ctrl-C (SIGINT); 0 of 2 runs are finished in {out}, and a "
                           "run stopped midway keeps its saved rounds; to continue (finished runs are skipped, the "
                           "others resume): fedvls sweep "), line
    assert shlex.split(line.split("resume): ", 1)[1]) == ["fedvls", "sweep", str(preset), "-o", str(out)]
    assert len(seen) >= 1
    assert_none_left(seen, out / ".flwr-home", timeout=20.0)
    done = json.loads(saved.read_text())["round"]
    assert done >= 1 and not (out / SECOND).exists()
    # its dry run counts the stopped run as one to continue, and writes nothing
    from fedvls_flwr.experiments import sweep

    files = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    capsys.readouterr()
    assert sweep.main([str(preset), "-o", str(out), "--dry-run"]) == 0
    assert capsys.readouterr().err.startswith(
        f"dry run: 2 runs in {out}: 0 finished (skipped), 1 stopped midway (they continue from their last checkpoint), "
        "1 new;")
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == files


def test_ctrl_c_stops_fedvls_run_with_one_line_and_its_command_continues_the_run(tmp_path):
    """Ctrl-C in `fedvls run` after some rounds: exit 130, no traceback, one line naming the rounds
    saved and the run folder, and a command that - pasted as it is - continues the run after the
    last saved round to its end, every round once."""
    import shlex

    from fedvls_flwr.app.results import LOCK_FILE, read_rounds

    run_dir = tmp_path / "runs" / "stopped"
    args = ["--run-config", f"dataset='digits' local-epochs=20 num-server-rounds=6 output-dir='{tmp_path / 'runs'}' "
            "run-name='stopped'", "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"]
    code, stdout, stderr, _ = ctrl_c_after_a_saved_round([sys.executable, "-m", "fedvls_flwr", "run", *args],
                                                          tmp_path, run_dir / "state.json")
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    saved = json.loads((run_dir / "state.json").read_text())["round"]
    assert line.startswith(f"fedvls run: stopped by Ctrl-C (SIGINT); rounds 1-{saved} are saved in {run_dir}; "
                           f"to continue after round {saved}: fedvls run --run-config "), line
    assert saved < 6 and not (run_dir / LOCK_FILE).exists()
    command = shlex.split(line.split(f"round {saved}: ", 1)[1])
    assert command[:2] == ["fedvls", "run"]
    again = subprocess.run([sys.executable, "-m", "fedvls_flwr", *command[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=RUN_TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming after round {saved} of 6" in again.stderr
    assert [r["round"] for r in read_rounds(run_dir)] == list(range(7))


def test_a_run_the_sweep_stops_midway_releases_its_folder(tmp_path):
    """The sweep stops a busy run-pool worker with SIGTERM (on Ctrl-C, ``kill``, --timeout). The
    worker died on the spot: run.lock stayed in the run folder, and the resumed run warned that it
    took over the lock of a run "stopped without releasing the folder (killed?)". It unwinds now:
    the ServerApp releases the folder, the client workers are stopped, the worker exits 143."""
    import multiprocessing

    from fedvls_flwr.app.results import LOCK_FILE
    from fedvls_flwr.ops.run_pool import Job, RunPool
    from tests.processes import wait_for_saved_round

    run_dir = tmp_path / "r"
    job = Job("r", {"dataset": "digits", "local-epochs": 1, "num-server-rounds": ROUNDS_TO_INTERRUPT,
                    "output-dir": str(tmp_path), "run-name": "r"}, 3, 1.0, run_dir / "run.log", RUN_TIMEOUT)
    pool = RunPool(workers=1)
    try:
        pool.submit(job)
        (worker,) = [p for p in multiprocessing.active_children() if p.name == "fedvls-run-worker"]
        wait_for_saved_round(run_dir, 1, explain=lambda: job.log.read_text()[-3000:] if job.log.exists() else "")
        clients = descendants(worker.pid)
        assert (run_dir / LOCK_FILE).exists() and clients
    finally:
        pool.close()
    assert worker.exitcode == 128 + 15, job.log.read_text()[-3000:]
    assert not (run_dir / LOCK_FILE).exists()
    assert "Traceback" not in job.log.read_text()
    assert_none_left(clients, tmp_path)
