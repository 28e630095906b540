"""Processes we own, by PID: free ports (optionally from a range), children that die with their
parent, whole process trees stopped, a port waited for. No Flower import."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path


def free_port(port_range: tuple[int, int] | None = None, taken: set[int] | frozenset[int] = frozenset()) -> int:
    """A TCP port nothing listens on: any (the OS picks) or the first free one in
    ``port_range`` (inclusive) that is not in ``taken`` (ports already handed out)."""
    if port_range is None:
        while True:
            with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in taken:
                return port
    lo, hi = port_range
    for port in range(lo, hi + 1):
        if port in taken:
            continue
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                # Free on every interface: the fence and SuperLinks elsewhere may bind 0.0.0.0.
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise PortRangeError(
        f"no free TCP port left in {lo}-{hi} ({len([p for p in taken if lo <= p <= hi])} handed out here, "
        "the rest in use); widen --port-range"
    )


class PortRangeError(RuntimeError):
    """The port range has no free port left."""


def parse_port_range(text: str | None) -> tuple[int, int] | None:
    """``"LO-HI"`` -> (LO, HI), inclusive; None for None/empty. Raises ValueError saying what is wrong."""
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise ValueError(f"--port-range {text!r}: expected LO-HI, e.g. 20000-20099")
    lo_i, hi_i = int(lo), int(hi)
    if not 1024 <= lo_i <= hi_i <= 65535:
        raise ValueError(f"--port-range {text!r}: need 1024 <= LO <= HI <= 65535")
    return lo_i, hi_i


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGTERM this child when the process that started it dies (even by SIGKILL).

    A safety net only: the launcher still stops every process group it started; this
    covers the launcher itself being killed before it could.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: Signals that end a launcher the way Ctrl-C does (``kill``, a closed terminal, a scheduler).
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def stop_signal(err: BaseException) -> signal.Signals | None:
    """The signal that ``err`` stands for: Ctrl-C's KeyboardInterrupt (SIGINT), or the SystemExit
    that :func:`stopped_cleanly_on_termination` turns SIGTERM / SIGHUP into; None for anything else."""
    if isinstance(err, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(err, SystemExit) and isinstance(err.code, int) and err.code - 128 in {int(s) for s in TERMINATING}:
        return signal.Signals(err.code - 128)
    return None


def say_what_is_kept(stop: BaseException, text: str) -> None:
    """Give a stop (Ctrl-C, SIGTERM: :func:`stop_signal`) what the stopped command keeps and the
    command that continues: :func:`stopped_cleanly_on_termination` says it in its one line."""
    stop.kept = text  # type: ignore[attr-defined]


def shell_word(text: str) -> str:
    """``text`` as one word of a shell command a user can paste: as it is when it is plain,
    else in double quotes (the run configs' values hold single quotes)."""
    if text and all(c.isalnum() or c in "-_./=:,@%+" for c in text):
        return text
    escaped = "".join("\\" + c if c in '"$`\\' else c for c in text)
    return f'"{escaped}"'


@contextmanager
def stopped_cleanly_on_termination(who: str) -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP unwind the stack like Ctrl-C, so the ``finally`` blocks and
    context managers that stop, by PID, what this process started still run. Python's default
    for them ends the process at once, and a killed ``fedvls sweep`` left its Ray head running.
    A signal set to be ignored (``nohup``) stays ignored; outside the main thread nothing
    changes. Any of them, Ctrl-C included, ends in one line on stderr - who stopped, by what,
    what is kept and how to continue (:func:`say_what_is_kept`), no traceback - and the exit
    status 128 + the signal's number, as a shell reports it (130 for Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.getsignal(sig) for sig in TERMINATING}
    for sig, handler in previous.items():
        if handler == signal.SIG_DFL:
            signal.signal(sig, unwind)
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as stop:
        by = stop_signal(stop)
        if by is None:
            raise
        name = "Ctrl-C (SIGINT)" if by == signal.SIGINT else by.name
        kept = getattr(stop, "kept", None) or "every process it started has been stopped"
        print(f"{who}: stopped by {name}; {kept}", file=sys.stderr)
        raise SystemExit(128 + int(by)) from None
    finally:
        for sig, handler in previous.items():
            if handler == signal.SIG_DFL:
                signal.signal(sig, handler)


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (from /proc), children first-level to deepest."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stop ``proc`` and everything it started.

    Flower's SuperLink starts its SuperExec in a new session, and that one starts the
    simulation and Ray; killing one process group would leave them running. So the whole
    tree is collected first, then SIGTERM, a grace period, then SIGKILL for what is left.
    """
    tree = [proc.pid, *descendants(proc.pid)]
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(is_running(pid) for pid in tree[1:]):
        time.sleep(0.2)
    for pid in tree + descendants(proc.pid):
        _signal(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def is_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with code {proc.returncode} before port {port} opened\n{tail}")
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")
