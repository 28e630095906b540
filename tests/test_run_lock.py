"""One run folder, one run: the lock the ServerApp holds for a run's life (app/results.py,
RunFolderLock), what a second run on a held folder is told, and a lock left by a killed run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedvls_flwr.app import results
from fedvls_flwr.app.results import LOCK_FILE, RunFolderBusy, RunFolderLock, lock_holder, read_lock_holder
from fedvls_flwr.app.server import run_experiment
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.experiments.check import main as check_main
from tests.test_resume import TrainingGrid

pytestmark = pytest.mark.usefixtures("run_identity")

HOLD = textwrap.dedent("""
    import sys, time
    from fedvls_flwr.app.results import RunFolderLock
    RunFolderLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(600)
""")


def holding_process(run_dir: Path) -> subprocess.Popen:
    """Another process that takes ``run_dir``'s lock and keeps it until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def killed(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_second_lock_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "runs" / "twin"
    with RunFolderLock(run_dir, what="Flower run 7: flwr stop 7 ends it"):
        holder = read_lock_holder(run_dir)
        assert holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname()
        assert "Flower run 7" in holder.command
        t0 = time.perf_counter()
        with pytest.raises(RunFolderBusy) as refused:
            RunFolderLock(run_dir).acquire()
        assert time.perf_counter() - t0 < 5
        message = str(refused.value)
        assert f"run folder {run_dir} is in use by another run (pid {os.getpid()} on host {socket.gethostname()}" in message
        assert f"kill {os.getpid()}" in message and "another run-name / output-dir" in message
        with pytest.raises(RunFolderBusy, match=r"resume: the run in .* is still going \(pid"):
            RunFolderLock(run_dir, resume=True).acquire()
    assert not (run_dir / LOCK_FILE).exists()
    assert not run_dir.exists()  # the lock made the folder and nothing was written into it
    RunFolderLock(run_dir).acquire().release()


def test_a_lock_left_by_a_killed_process_is_seen_as_stale_and_taken_over_with_a_note(tmp_path):
    run_dir = tmp_path / "killed"
    proc = holding_process(run_dir)
    assert lock_holder(run_dir) is not None and lock_holder(run_dir).pid == proc.pid
    with pytest.raises(RunFolderBusy, match=f"pid {proc.pid}"):
        RunFolderLock(run_dir).acquire()
    killed(proc)
    assert (run_dir / LOCK_FILE).exists() and lock_holder(run_dir) is None  # left behind, but nobody's
    lock = RunFolderLock(run_dir).acquire()
    try:
        assert lock.took_over is not None and lock.took_over.pid == proc.pid
        note = lock.took_over_note()
        assert note is not None and f"took over the lock left by a run that no longer runs (pid {proc.pid}" in note
        assert read_lock_holder(run_dir).pid == os.getpid()
    finally:
        lock.release()


def test_where_the_filesystem_cannot_lock_the_lock_file_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_flock", lambda fd: None)  # e.g. an NFS mount without a lock manager
    run_dir = tmp_path / "nolock"
    run_dir.mkdir()

    def left_by(pid: int, host: str) -> None:
        (run_dir / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host, "started": "then", "command": "x"}))

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        left_by(sleeper.pid, socket.gethostname())  # a live process of this host
        with pytest.raises(RunFolderBusy, match="cannot lock files"):
            RunFolderLock(run_dir).acquire()
        assert lock_holder(run_dir).pid == sleeper.pid
    finally:
        killed(sleeper)
    left_by(sleeper.pid, socket.gethostname())  # the same process, ended: stale
    assert lock_holder(run_dir) is None
    lock = RunFolderLock(run_dir).acquire()
    assert lock.took_over is not None and lock.took_over.pid == sleeper.pid
    lock.release()
    left_by(1, "another-host")  # cannot be asked from here: refused, with how to clear it
    with pytest.raises(RunFolderBusy, match=rf"stop it on another-host .* delete {run_dir / LOCK_FILE}"):
        RunFolderLock(run_dir).acquire()


def config(out: Path, **changes) -> RunConfig:
    settings = dict(dataset="digits", num_server_rounds=2, output_dir=str(out), run_name="r")
    return RunConfig(**{**settings, **changes})


def test_a_run_on_a_held_folder_is_refused_before_it_writes_anything(tmp_path):
    run_experiment(TrainingGrid(), config(tmp_path))  # a finished run
    run_dir = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    proc = holding_process(run_dir)
    try:
        with pytest.raises(RunFolderBusy, match=f"resume: the run in {run_dir} is still going \\(pid {proc.pid}"):
            run_experiment(TrainingGrid(), config(tmp_path, resume=True, num_server_rounds=3))
        with pytest.raises(RunFolderBusy, match=f"is in use by another run \\(pid {proc.pid}"):
            run_experiment(TrainingGrid(), config(tmp_path, lr=0.5))
    finally:
        killed(proc)
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != LOCK_FILE}
    assert after == before


def test_a_run_releases_its_folder_when_it_ends_and_when_it_fails(tmp_path):
    run_experiment(TrainingGrid(), config(tmp_path, run_name="ok"))
    assert not (tmp_path / "ok" / LOCK_FILE).exists()

    class Failing(TrainingGrid):
        def answer(self, messages):
            raise RuntimeError("the grid broke")

    with pytest.raises(RuntimeError, match="the grid broke"):
        run_experiment(Failing(), config(tmp_path, run_name="bad"))
    assert not (tmp_path / "bad" / LOCK_FILE).exists()
    RunFolderLock(tmp_path / "bad").acquire().release()


def test_check_names_the_run_going_on_in_the_folder(tmp_path, capsys):
    run_dir = tmp_path / "going"
    proc = holding_process(run_dir)
    try:
        code = check_main(["--no-data", "--run-config", f"output-dir='{tmp_path}' run-name='going' resume=true"])
    finally:
        killed(proc)
    err = capsys.readouterr().err
    assert code == 2 and f"error: resume: the run in {run_dir} is still going (pid {proc.pid}" in err
