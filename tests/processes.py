"""Which processes an end-to-end test left running: by PID, or by the FLWR_HOME they inherited.

Every Flower process a test starts (SuperLink, SuperExec, the simulation with Ray and its
actors, SuperNodes, ClientApps) inherits an ``FLWR_HOME`` inside the test's folder. The
SuperExec runs in a session of its own and Ray re-parents processes, so neither process
groups nor the PID tree alone would find them all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fedvls_flwr.ops.processes import is_running


def _homes() -> dict[int, str]:
    """pid -> FLWR_HOME of every live process that has one."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"FLWR_HOME="):
                if is_running(int(entry.name)):
                    found[int(entry.name)] = item[len(b"FLWR_HOME="):].decode(errors="replace")
                break
    return found


def processes_with_home(home: Path, *, below: bool = False) -> list[int]:
    """Live processes whose FLWR_HOME is ``home`` (``below``: or any folder inside it)."""
    home = str(home)
    return sorted(pid for pid, h in _homes().items() if h == home or (below and h.startswith(home + os.sep)))


def leftovers(pids, root: Path) -> list[int]:
    """Live processes among ``pids`` or with an FLWR_HOME at or below ``root``."""
    return sorted({p for p in pids if is_running(p)} | set(processes_with_home(root, below=True)))


def cmdline(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid}: (gone)"


def assert_none_left(pids, root: Path, timeout: float = 15.0) -> None:
    """Wait up to ``timeout`` s for what the test started to exit, then fail naming what is left."""
    deadline = time.monotonic() + timeout
    while (left := leftovers(pids, root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes still running: {[cmdline(p) for p in left]}"


def wait_for_saved_round(run_dir: Path, at_least: int, timeout: float = 300.0,
                         explain: Callable[[], str] = lambda: "") -> int:
    """Poll the run's state.json until round ``at_least`` is saved; the round saved then
    (a test that kills the run mid-way waits here first). Fails the test after ``timeout`` s."""
    import pytest

    state = run_dir / "state.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.exists() and (saved := json.loads(state.read_text())["round"]) >= at_least:
            return int(saved)
        time.sleep(0.02)
    pytest.fail(f"round {at_least} never finished\n{explain()}")


def saved_round(run_dir: Path) -> int:
    """The last completed round as a resume sees it: the checkpoint's. state.json is written
    after the checkpoint, so a kill between the two leaves it one round behind."""
    from fedvls_flwr.app.results import CHECKPOINT_FILE, load_checkpoint

    done, _ = load_checkpoint(run_dir / CHECKPOINT_FILE)
    assert done is not None, f"{run_dir / CHECKPOINT_FILE} records no round"
    return done


def kill_now(pids: Iterable[int], timeout: float = 15.0) -> None:
    """SIGKILL, no grace period: the processes die as a crashed machine's would. Returns once
    they are gone, so nothing they were writing lands after the caller reads the run folder."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if is_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes survived SIGKILL: {[cmdline(p) for p in alive]}"
