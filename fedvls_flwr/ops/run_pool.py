"""Worker processes that run experiments on the in-process engine, start-up paid once per worker.

A sweep's runs go to up to N workers (``--parallel N``). Each worker is a Python process that
imports torch and Flower once and then runs one experiment after another
(:func:`fedvls_flwr.ops.inprocess.run_in_process`) in its share of the machine
(:func:`fedvls_flwr.ops.resources.share_machine`: its cores, its GPUs or part of one), which
each run's clients fill with client workers it keeps warm from one run to the next.
A run that outlives its timeout has its worker stopped (by PID, SIGTERM then SIGKILL) and a
fresh worker takes the next run; the stopped run keeps what it saved (its checkpoint), and the
sweep resumes it next time. Each run's output (the ServerApp's log) goes to a file the caller
names. Workers end with the pool (:meth:`RunPool.close`), and with their parent if that dies
first (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from fedvls_flwr.ops.processes import die_with_parent, is_running
from fedvls_flwr.ops.resources import Machine, cuda_visible_devices

__all__ = ["Job", "Outcome", "RunPool"]


@dataclass(frozen=True)
class Job:
    """One run: its key (the run's name), its run-config overrides and federation, where its log goes."""

    key: str
    overrides: dict[str, Any]
    num_supernodes: int
    client_cpus: float
    log: Path
    timeout: float
    client_gpus: float = 0.0


@dataclass
class Outcome:
    key: str
    status: str  # "completed", "failed" or "timeout"
    error: str = ""
    seconds: float = 0.0


class _Stopped(SystemExit):
    """SIGTERM in a worker (the sweep stopping it mid-run: Ctrl-C, ``kill``, --timeout; or the
    sweep's death, PR_SET_PDEATHSIG): unwind instead of dying on the spot, so that the run's
    ServerApp finishes writing the round it was saving and releases its folder - a worker that
    just died left run.lock behind, and the resumed run warned it had taken over the lock of a
    run "stopped without releasing the folder (killed?)" - and its client workers are stopped."""


def _unwind(signum: int, frame: object) -> None:  # pragma: no cover - a worker process
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM would cut the unwinding short
    raise _Stopped(128 + signum)


def _worker(conn: Connection, threads: int, share: Machine | None) -> None:  # pragma: no cover - a worker process
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the sweep stops its workers
    signal.signal(signal.SIGTERM, _unwind)
    if share is not None and share.gpus:  # this worker's GPUs only, numbered from 0 as its runs see them
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(tuple(i for i, _ in share.gpus),
                                                                  os.environ.get("CUDA_VISIBLE_DEVICES"))
        share = Machine(share.cores, tuple((j, part) for j, (_, part) in enumerate(share.gpus)))
    import torch

    torch.set_num_threads(threads)
    from fedvls_flwr.ops.inprocess import close_kept_pool, run_in_process  # the worker's, not the sweep's (no torch)

    try:
        _serve(conn, share, run_in_process)
    finally:
        close_kept_pool()  # the client workers it kept warm (atexit does not run in this process)


def _serve(conn: Connection, share: Machine | None, run_in_process: Any) -> None:  # pragma: no cover - a worker process
    while True:
        try:
            job: Job | None = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        t0 = time.perf_counter()
        with _output_to(job.log):
            try:
                run_in_process(job.overrides, job.num_supernodes, client_cpus=job.client_cpus,
                               client_gpus=job.client_gpus, machine=share, keep_pool=True, client_output=job.log)
                result = Outcome(job.key, "completed")
            except _Stopped:
                raise  # the sweep stopped it: nobody waits for an outcome
            except BaseException as err:  # noqa: BLE001 - reported to the sweep, the worker goes on
                traceback.print_exc()
                result = Outcome(job.key, "failed", f"{type(err).__name__}: {err}")
                if not isinstance(err, Exception):
                    conn.send(result)
                    raise
        result.seconds = time.perf_counter() - t0
        conn.send(result)


class _output_to:  # noqa: N801 - a context manager
    """fd 1 and 2 of this process into ``path`` (appended) while inside."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)


def _died(code: int | None) -> str:
    """What the sweep says of a run whose worker process died: by which signal, and that the
    run is not lost (a bare "exit code -9" said neither, and the sweep went on to its next run)."""
    signals = {int(sig) for sig in signal.Signals}
    if code is not None and code < 0 and -code in signals:
        how = f"was killed by {signal.Signals(-code).name} while it ran (killed, or out of memory?)"
    elif code is not None and code > 128 and code - 128 in signals:  # SIGTERM: it unwound (_Stopped), 128 + 15
        how = f"was stopped by {signal.Signals(code - 128).name} while it ran"
    else:
        how = f"ended (exit code {code}) while it ran (killed, or out of memory?)"
    return f"its worker process {how}; what it saved is kept and the sweep resumes it next time"


@dataclass
class _Worker:
    process: Any
    conn: Connection
    slot: int
    job: Job | None = None
    started: float = 0.0


@dataclass
class RunPool:
    """Up to ``workers`` worker processes with ``threads`` torch threads each; worker i runs in
    ``shares[i]`` (None: the whole machine, as the run sizes it itself)."""

    workers: int = 1
    threads: int = 1
    shares: list[Machine] | None = None
    _idle: list[_Worker] = field(default_factory=list)
    _busy: list[_Worker] = field(default_factory=list)

    def _spawn(self) -> _Worker:
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
        parent, child = context.Pipe()
        taken = {w.slot for w in self._idle + self._busy}
        slot = min(set(range(self.workers)) - taken)
        share = self.shares[slot] if self.shares else None
        # not a daemon: it starts client workers of its own; it ends with the pool, or with the sweep (die_with_parent)
        process = context.Process(target=_worker, args=(child, self.threads, share), daemon=False,
                                  name="fedvls-run-worker")
        process.start()
        child.close()
        return _Worker(process, parent, slot)

    @property
    def free(self) -> int:
        return self.workers - len(self._busy)

    def submit(self, job: Job) -> None:
        if self.free <= 0:
            raise RuntimeError("every worker is busy: wait for one first")
        worker = self._idle.pop() if self._idle else self._spawn()
        worker.conn.send(job)
        worker.job, worker.started = job, time.monotonic()
        self._busy.append(worker)

    def wait(self, poll: float = 0.5) -> Iterator[Outcome]:
        """The outcomes of busy workers' runs that end (or time out) within ``poll`` seconds."""
        if not self._busy:
            return
        ready = wait([w.conn for w in self._busy], timeout=poll)
        now = time.monotonic()
        for worker in list(self._busy):
            job = worker.job
            assert job is not None
            if worker.conn in ready:
                try:
                    outcome: Outcome = worker.conn.recv()
                except (EOFError, OSError):  # the worker died (killed, out of memory)
                    self._stop(worker)
                    outcome = Outcome(job.key, "failed", _died(worker.process.exitcode))
                else:
                    worker.job = None
                    self._idle.append(worker)
                self._busy.remove(worker)
                yield outcome
            elif now - worker.started > job.timeout:
                self._stop(worker)
                self._busy.remove(worker)
                yield Outcome(job.key, "timeout", f"stopped after --timeout {job.timeout:g} s; what it saved is kept "
                                                  "and the sweep resumes it next time", now - worker.started)

    @staticmethod
    def _stop(worker: _Worker) -> None:
        process = worker.process
        if process.is_alive():
            process.terminate()
            process.join(5)
        if process.pid is not None and is_running(process.pid):
            process.kill()
            process.join(5)
        worker.conn.close()

    def close(self) -> None:
        """Every worker stopped: idle ones told to end, busy ones (a sweep stopped mid-run) sent
        SIGTERM all at once - each unwinds its run in parallel with the others - then killed if
        one has not ended within :meth:`_stop`'s wait."""
        for worker in self._busy:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in self._idle:
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.process.join(5)
            self._stop(worker)
        for worker in self._busy:
            self._stop(worker)
        self._idle, self._busy = [], []

    def __enter__(self) -> RunPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
