"""The in-process engine's client workers: a round's clients train at once, in processes that
start once and stay warm.

Each worker is a Python process (``spawn``: no fork of a process that holds threads or a CUDA
context) that imports torch, Flower and the ClientApp once, opens its CUDA context once when
it has a GPU, and keeps its node data caches; it then runs the ClientApp on one message after
another. The ServerApp stays in the parent, on :class:`~fedvls_flwr.ops.inprocess.InProcessGrid`,
which hands each pushed message to this pool. How many workers and on which device:
:func:`fedvls_flwr.ops.resources.plan_workers` (the federation config read as Ray reads it).

What keeps a run's results those of one worker (and of ``flwr run .``), bit for bit:

* every message is computed with the plan's thread count and the ClientApp's own seeds (derived
  from seed, round and partition), whichever worker takes it, with the same per-message
  process discipline as one worker (:func:`run_client`);
* the parent owns every node's ``Context``: a message travels with its node's state and the
  reply brings the updated state back; when the ClientApp raises, the state stays as it was
  and the reply is the error reply Flower's simulation builds; one node's messages never run
  at two workers at once;
* a worker that dies (killed, out of memory) fails only the message it was running: its reply
  is an error (``CLIENT_APP_CRASHED``), the node's state stays as it was, the worker is
  started again and the run goes on (the strategy's ``min-fit-fraction`` and ``round-retries``
  decide what the failed reply means for the round).

Little copying: a worker is sent each distinct array (the global model of a round, which every
message of the round shares) once, and keeps it for the next message that refers to it; the
arrays of replies and of node state travel as raw bytes (``Connection.send_bytes``), never
pickled. Messages are handed out one at a time to whichever worker is free (the server pushes
a round's largest clients first), by one thread per worker in the parent.
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from uuid import uuid4

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import ErrorCode

from fedvls_flwr.ops.processes import die_with_parent
from fedvls_flwr.ops.resources import WorkerPlan, cuda_visible_devices

__all__ = ["ClientPool", "ClientWorkersFailed", "load_client_app", "run_client"]

#: The project's ClientApp, as a worker imports it.
PROJECT_CLIENT_APP = "fedvls_flwr.app.client_app:app"
#: Seconds a worker may take to start (imports, CUDA context) before it counts as failed.
START_TIMEOUT = 300.0


class ClientWorkersFailed(RuntimeError):
    """No client worker could start (the message says why: the first worker's traceback)."""


# ---- one message, as a Ray actor runs it (one worker, or this process) --------------------
@contextmanager
def client_process(threads: int) -> Iterator[None]:
    """The ClientApp as a Ray actor runs it: its own torch thread count and random generators,
    which nothing outside the message (the ServerApp's side, the next message) sees."""
    import torch

    outer_threads = torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(outer_threads)
            random.setstate(py_state)
            np.random.set_state(np_state)


def run_client(client_app: ClientApp, message: Message, context: Context, threads: int) -> tuple[Message, bool]:
    """The node's reply to ``message`` and whether the ClientApp returned one (False: it raised,
    the reply is the error reply Flower's simulation builds, and ``context.state`` holds again
    the records it held before, as a Ray actor's copy would)."""
    kept = dict(context.state.items())
    try:
        with client_process(threads):
            return client_app(message=message, context=context), True
    except Exception as ex:  # noqa: BLE001 - a ClientApp that raises is a failed reply, as in Flower
        for name in [n for n in context.state if n not in kept]:
            del context.state[name]
        for name, record in kept.items():
            context.state[name] = record
        wrapped = ClientAppException(str(ex))
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                             reason=str(type(wrapped)) + ":<'" + str(wrapped) + "'>"), reply_to=message), False


def with_message_id(metadata: Metadata, message_id: str) -> Metadata:
    """``metadata`` with ``message_id`` (what a SuperLink gives a message it stores)."""
    return Metadata(run_id=metadata.run_id, message_id=message_id, src_node_id=metadata.src_node_id,
                    dst_node_id=metadata.dst_node_id, reply_to_message_id=metadata.reply_to_message_id,
                    group_id=metadata.group_id, created_at=metadata.created_at, ttl=metadata.ttl,
                    message_type=metadata.message_type, src_task_id=metadata.src_task_id,
                    dst_task_id=metadata.dst_task_id)


def stamped(reply: Message) -> Message:
    """``reply`` with a message id of its own, as the SuperLink gives every reply it stores."""
    metadata = with_message_id(reply.metadata, str(uuid4()))
    if reply.has_error():
        return make_message(metadata, error=reply.error)
    return make_message(metadata, content=reply.content)


def crash_reply(message: Message, reason: str) -> Message:
    """The error reply for a message whose worker died (Flower's code for a crashed ClientApp)."""
    return stamped(Message(Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message))


def load_client_app(reference: str) -> ClientApp:
    """``module:attribute``: a ClientApp, or a function that returns one (the tests' fault injection)."""
    module, _, name = reference.partition(":")
    found = getattr(importlib.import_module(module), name)
    app = found if isinstance(found, ClientApp) else found()
    if not isinstance(app, ClientApp):
        raise TypeError(f"{reference} is not a ClientApp nor gives one")
    return app


# ---- records on the wire: structure pickled, array bytes as raw frames ----------------------
Encoded = list[tuple[str, str, Any]]


def encode_records(content: RecordDict, blob: Callable[[bytes], int]) -> Encoded:
    """``content`` as picklable tuples in its own order; each array's bytes replaced by the
    number ``blob`` gives them."""
    out: Encoded = []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out.append((name, "arrays", [(k, a.dtype, a.shape, a.stype, blob(a.data)) for k, a in record.items()]))
        elif isinstance(record, ConfigRecord):
            out.append((name, "config", dict(record)))
        else:
            out.append((name, "metrics", dict(record)))
    return out


def decode_records(encoded: Encoded, blob: Callable[[int], bytes]) -> RecordDict:
    records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {}
    for name, kind, items in encoded:
        if kind == "arrays":
            records[name] = ArrayRecord({k: Array(dtype, tuple(shape), stype, blob(n)) for k, dtype, shape, stype, n in items})
        elif kind == "config":
            records[name] = ConfigRecord(items)
        else:
            records[name] = MetricRecord(items)
    return RecordDict(records)


class _Numbering:
    """Numbers for byte strings, one per distinct object (the arrays a round's messages share)."""

    def __init__(self, counter: Iterator[int]) -> None:
        self.counter = counter
        self.by_object: dict[int, tuple[int, bytes]] = {}

    def __call__(self, data: bytes) -> int:
        if id(data) not in self.by_object:
            self.by_object[id(data)] = (next(self.counter), data)
        return self.by_object[id(data)][0]

    def blobs(self) -> list[tuple[int, bytes]]:
        return list(self.by_object.values())


def _output_to(path: str) -> None:  # pragma: no cover - a worker process
    """fd 1 and 2 of this process appended to ``path`` from now on."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _Frames:
    """Byte strings to send after a message, numbered in order."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def __call__(self, data: bytes) -> int:
        self.data.append(data)
        return len(self.data) - 1


# ---- the worker process ------------------------------------------------------------------
def _worker_main(conn: Connection, cuda_visible: str, threads: int, app_reference: str) -> None:  # pragma: no cover
    """A worker: start up, say ready (or why not), then run one message after another."""
    os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible  # before any CUDA call: Ray's rule for an actor
    os.environ["OMP_NUM_THREADS"] = str(threads)
    die_with_parent()
    try:
        import torch

        torch.set_num_threads(threads)
        client_app = load_client_app(app_reference)
        if cuda_visible and torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # the CUDA context, once, before the first message
        conn.send(("ready", os.getpid()))
    except BaseException:  # noqa: BLE001 - said to the parent, which says it to the user
        conn.send(("failed", traceback.format_exc()))
        return
    blobs: dict[int, bytes] = {}
    output: str | None = None
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        number, new, keep, metadata, content, (run_id, node_id, node_config, run_config), state, log_to = task
        if log_to is not None and log_to != output:  # a kept worker's output goes to its current run's log
            _output_to(log_to)
            output = log_to
        for blob_number in new:
            blobs[blob_number] = conn.recv_bytes()
        message = make_message(metadata, content=decode_records(content, blobs.__getitem__))
        context = Context(run_id=run_id, node_id=node_id, node_config=node_config,
                          state=decode_records(state, blobs.__getitem__), run_config=run_config)
        for blob_number in [b for b in blobs if b not in keep]:  # the node's state, an earlier round's arrays
            del blobs[blob_number]
        t0 = time.perf_counter()
        reply, returned = run_client(client_app, message, context, threads)
        seconds = time.perf_counter() - t0
        frames = _Frames()
        body = ("error", reply.error) if reply.has_error() else ("content", encode_records(reply.content, frames))
        new_state = encode_records(context.state, frames) if returned else None
        conn.send((number, seconds, reply.metadata, body, new_state, len(frames.data)))
        for data in frames.data:
            conn.send_bytes(data)


# ---- the parent's side -------------------------------------------------------------------
@dataclass
class _Task:
    number: int
    message: Message
    context: Context
    blobs: list[tuple[int, bytes]]  # the message's arrays, numbered (shared with the round's other messages)
    content: Encoded
    started: float = 0.0


class _WorkerGone(Exception):
    """The worker process ended while it held a message."""


@dataclass
class _Slot:
    """One worker place of the plan: its GPUs, its process, what that process holds."""

    index: int
    gpus: tuple[int, ...]
    process: Any = None
    conn: Connection | None = None
    has: set[int] = field(default_factory=set)   # blob numbers the worker keeps
    state: str = "starting"                       # starting, ready, failed
    failure: str = ""
    starts: int = 0
    served: int = 0
    task: _Task | None = None                     # the message the worker holds


class ClientPool:
    """The plan's workers, each fed by one thread of this process; see the module docstring.

    :meth:`submit` queues messages (each with its node's ``Context``, owned by the caller),
    :meth:`collect` returns the replies that are ready, :meth:`close` stops every worker. A pool
    outlives a run when the caller keeps it (a sweep's worker reuses it for its next run).
    """

    def __init__(self, plan: WorkerPlan, client_app: str = PROJECT_CLIENT_APP) -> None:
        self.plan = plan
        self.client_app = client_app
        self._cond = threading.Condition()
        self._pending: list[_Task] = []
        self._busy_nodes: set[int] = set()
        self._replies: dict[str, Message] = {}
        self._numbers = itertools.count(1)
        self._closing = False
        self._parent_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.client_seconds = 0.0  # time inside the ClientApp, all workers together
        self.transport_seconds = 0.0  # per message: from handed out to reply taken back, less the ClientApp's time
        self.crashes: list[str] = []
        self.log_to: str | None = None  # where the workers' own output goes (None: where it went)
        self.slots = [_Slot(i, gpus) for i, gpus in enumerate(plan.devices)]
        self._threads = [threading.Thread(target=self._serve, args=(slot,), name=f"fedvls-client-worker-{slot.index}",
                                          daemon=True) for slot in self.slots]
        for thread in self._threads:
            thread.start()

    # ---- the caller's side -----------------------------------------------------------------
    def submit(self, messages: list[tuple[Message, Context]]) -> None:
        """Queue ``messages`` (their ids set), in order; every distinct array numbered once."""
        numbering = _Numbering(self._numbers)
        tasks = []
        for message, context in messages:
            content = encode_records(message.content, numbering) if message.has_content() else []
            tasks.append(_Task(next(self._numbers), message, context, [], content))
        shared = numbering.blobs()
        by_number = dict(shared)
        for task in tasks:
            task.blobs = [(n, by_number[n]) for n in sorted(_blob_numbers(task.content))]
        with self._cond:
            if self._closing:
                raise RuntimeError("the client pool is closed")
            if all(slot.state == "failed" for slot in self.slots):
                raise ClientWorkersFailed(self._failure_text())
            self._pending.extend(tasks)
            self._cond.notify_all()

    def collect(self, message_ids: list[str], wait: float = 0.0) -> list[Message]:
        """The replies to ``message_ids`` that are ready, in that order; with ``wait`` > 0 and
        none ready, up to ``wait`` seconds for one."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                ready = [i for i in message_ids if i in self._replies]
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return [self._replies.pop(i) for i in ready]
                self._cond.wait(left)

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Until every worker has started (or failed); raises when none could."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(s.state == "starting" for s in self.slots) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if all(slot.state == "failed" for slot in self.slots):
                raise ClientWorkersFailed(self._failure_text())

    @property
    def alive(self) -> bool:
        return not self._closing and any(slot.state != "failed" for slot in self.slots)

    def pids(self) -> list[int]:
        return [s.process.pid for s in self.slots if s.process is not None and s.state == "ready"]

    def close(self, timeout: float = 10.0) -> None:
        """Every worker stopped: idle ones told to end, busy ones (a stopped run) terminated."""
        with self._cond:
            self._closing = True
            self._pending.clear()
            self._cond.notify_all()
        for slot in self.slots:
            process = slot.process
            if process is not None and process.is_alive() and (slot.task is not None or slot.state == "starting"):
                process.terminate()  # it holds a message nobody waits for any more, or is still starting
        for thread in self._threads:
            thread.join(timeout)
        for slot in self.slots:
            self._stop(slot)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one thread per worker -------------------------------------------------------------
    def _serve(self, slot: _Slot) -> None:
        """Start the slot's worker, then feed it messages until the pool closes."""
        if not self._start(slot):
            return
        while True:
            task = self._take(slot)
            if task is None:
                break
            slot.task = task
            reply, state, seconds = self._run(slot, task)
            slot.task = None
            with self._cond:
                if state is not None:
                    task.context.state = state
                if seconds is not None:
                    self.client_seconds += seconds
                    self.transport_seconds += time.perf_counter() - task.started - seconds
                self._busy_nodes.discard(task.context.node_id)
                self._replies[task.message.metadata.message_id] = reply
                self._cond.notify_all()
            if slot.state == "failed":
                break
        self._stop(slot)

    def _take(self, slot: _Slot) -> _Task | None:
        with self._cond:
            while not self._closing:
                for i, task in enumerate(self._pending):
                    if task.context.node_id not in self._busy_nodes:  # one node's messages one at a time
                        self._busy_nodes.add(task.context.node_id)
                        return self._pending.pop(i)
                self._cond.wait()
            return None

    def _start(self, slot: _Slot) -> bool:
        """Spawn the slot's worker (from this thread: it dies with the thread that started it)
        and wait until it is ready; False when it could not start."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        visible = cuda_visible_devices(slot.gpus, self._parent_cuda)
        process = context.Process(target=_worker_main, args=(child, visible, self.plan.omp_threads, self.client_app),
                                  daemon=True, name=f"fedvls-client-worker-{slot.index}")
        process.start()
        child.close()
        slot.process, slot.conn, slot.has, slot.starts = process, parent, set(), slot.starts + 1
        said: Any = None
        if parent.poll(START_TIMEOUT):
            try:
                said = parent.recv()
            except (EOFError, OSError):
                said = None
        with self._cond:
            if isinstance(said, tuple) and said[0] == "ready":
                slot.state = "ready"
            else:
                slot.state = "failed"
                slot.failure = (said[1] if isinstance(said, tuple) else
                                f"the worker process ended at start (exit code {process.exitcode})")
                self._fail_pending_if_none_left()
            self._cond.notify_all()
        if slot.state == "failed":
            self._stop(slot)
        return slot.state == "ready"

    def _run(self, slot: _Slot, task: _Task) -> tuple[Message, RecordDict | None, float | None]:
        """The task's reply from the slot's worker, the node's new state (None: unchanged) and
        the seconds the ClientApp took (None: the worker died, failing the task; it is started again)."""
        if slot.process is not None and not slot.process.is_alive() and not self._closing:
            self._stop(slot)  # it died while idle: a fresh one takes the message, which nobody ran yet
            if not self._start(slot):
                return crash_reply(task.message, self._failure_text()), None, None
        task.started = time.perf_counter()
        try:
            reply, state, seconds = self._exchange(slot, task)
        except _WorkerGone as gone:
            self.crashes.append(str(gone))
            self._stop(slot)
            if not self._closing:
                self._start(slot)
            return crash_reply(task.message, str(gone)), None, None
        slot.served += 1
        return reply, state, seconds

    def _exchange(self, slot: _Slot, task: _Task) -> tuple[Message, RecordDict | None, float]:
        conn = slot.conn
        assert conn is not None
        context = task.context
        state_blobs: list[bytes] = []

        def state_blob(data: bytes) -> int:
            state_blobs.append(data)
            return -len(state_blobs)  # negative: this message's own, never kept

        state = encode_records(context.state, state_blob)
        new = [(n, data) for n, data in task.blobs if n not in slot.has]
        keep = [n for n, _ in task.blobs]
        node = (context.run_id, context.node_id, dict(context.node_config), dict(context.run_config))
        try:
            conn.send((task.number, [n for n, _ in new] + [-(i + 1) for i in range(len(state_blobs))], keep,
                       task.message.metadata, task.content, node, state, self.log_to))
            for _, data in new:
                conn.send_bytes(data)
            for data in state_blobs:
                conn.send_bytes(data)
            slot.has = set(keep)
            number, seconds, metadata, body, new_state, count = conn.recv()
            frames = [conn.recv_bytes() for _ in range(count)]
        except (EOFError, OSError) as err:
            raise _WorkerGone(self._gone_text(slot, task, err)) from None
        assert number == task.number, (number, task.number)
        metadata = with_message_id(metadata, str(uuid4()))
        if body[0] == "error":
            reply = make_message(metadata, error=body[1])
        else:
            reply = make_message(metadata, content=decode_records(body[1], frames.__getitem__))
        return reply, None if new_state is None else decode_records(new_state, frames.__getitem__), seconds

    def _gone_text(self, slot: _Slot, task: _Task, err: BaseException) -> str:
        process = slot.process
        if process is not None:
            process.join(5)
        code = None if process is None else process.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"ended (exit code {code})" if code is not None else f"stopped answering ({err})")
        return (f"the client worker process (pid {None if process is None else process.pid}) {how} while it ran "
                f"this {task.message.metadata.message_type} message (killed, or out of memory?); the node's "
                "state is kept and the worker was started again")

    def _fail_pending_if_none_left(self) -> None:
        """With every worker failed, the queued messages get error replies (nobody would run them)."""
        if not all(slot.state == "failed" for slot in self.slots):
            return
        text = self._failure_text()
        for task in self._pending:
            self._replies[task.message.metadata.message_id] = crash_reply(task.message, text)
            self._busy_nodes.discard(task.context.node_id)
        self._pending.clear()

    def _failure_text(self) -> str:
        first = next((s.failure for s in self.slots if s.failure), "unknown")
        return f"no client worker could start: {first.strip().splitlines()[-1] if first.strip() else first}\n{first}"

    @staticmethod
    def _stop(slot: _Slot) -> None:
        process, conn = slot.process, slot.conn
        if conn is not None:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        if process is not None:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        if conn is not None:
            conn.close()
        slot.conn = None


def _blob_numbers(encoded: Encoded) -> set[int]:
    return {n for _, kind, items in encoded if kind == "arrays" for *_, n in items}
