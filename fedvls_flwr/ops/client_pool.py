"""The in-process engine's client workers: a round's clients train at once, in processes that
start once and stay warm.

Each worker (:mod:`fedvls_flwr.ops.client_worker`) is a fresh Python process (``python -c``: no
fork of a process that holds threads or a CUDA context, and unlike ``multiprocessing``'s spawn
it never imports the caller's main script again) that imports torch, Flower and the ClientApp
once, opens its CUDA context once when it has a GPU, and keeps its node data caches; it then
runs the ClientApp on one message after another. The ServerApp stays in the parent, on
:class:`~fedvls_flwr.ops.inprocess.InProcessGrid`, which hands each pushed message to this
pool. How many workers and on which device: :func:`fedvls_flwr.ops.resources.plan_workers`
(the federation config read as Ray reads it).

What keeps a run's results those of one worker (and of ``flwr run .``), bit for bit:

* every message is computed with the plan's thread count and the ClientApp's own seeds
  (derived from seed, round and partition), whichever worker takes it, under the same
  per-message discipline as in one process (:func:`~fedvls_flwr.ops.client_worker.run_client`);
* the parent owns every node's ``Context``: a message travels with its node's state and the
  reply brings the updated state back; when the ClientApp raises, the state stays as it was
  and the reply is the error reply Flower's simulation builds; one node's messages never run
  at two workers at once;
* a worker that dies (killed, out of memory) fails only the message it was running: its reply
  is an error (``CLIENT_APP_CRASHED``), its node's state stays as it was, a message queued
  behind it goes back to the queue, the worker is started again and the run goes on (the
  strategy's ``min-fit-fraction`` and ``round-retries`` decide what the failure means for the
  round); one that died while idle fails none (the message handed to it goes back to the
  queue), and an error in this process's own handling of a worker counts as that worker's
  crash - no message is ever left without a reply;
* a reply holding a value Flower refuses (a ClientApp that changed a record after Flower
  checked it) raises Flower's error in the server, as delivering it in one process does.

Little copying: each distinct array (the global model of a round, which every message of the
round shares) goes to a worker once and stays there for its next message that refers to it;
arrays travel through a shared-memory file per worker (one copy in, one copy out) or, without
room for one, as raw socket frames; never pickled. Messages go to whichever worker is free
(the server pushes a round's largest clients first), by one thread per worker in this process;
while the queue is long, each worker also holds the next message, so it never waits for this
process to wake up between two clients.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.app.message import make_message
from flwr.common.constant import ErrorCode

from fedvls_flwr.ops.client_worker import (
    HEADER_PROTOCOL,
    MEMFD_PATH,
    WORKER_CODE,
    Bulk,
    Encoded,
    Numbering,
    decode_records,
    encode_records,
    stamped,
)
from fedvls_flwr.ops.flower_internals import copied_metadata
from fedvls_flwr.ops.resources import WorkerPlan, cuda_visible_devices

__all__ = ["PROJECT_CLIENT_APP", "ClientPool", "ClientWorkersFailed", "crash_reply"]

#: The project's ClientApp, as a worker imports it.
PROJECT_CLIENT_APP = "fedvls_flwr.app.client_app:app"
#: Variables a worker's environment sets for itself, whatever its parent's say.
WORKER_OWN_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONPATH"})
#: Arrays travel through shared memory once a message or a reply carries this many bytes.
SHARED_MEMORY_FROM = 2**16
#: A message queued behind a worker's current one must fit the socket's buffer unread.
QUEUED_HEADER_MOST = 2**16
#: Seconds a worker may take to start (imports, CUDA context) before it counts as failed.
START_TIMEOUT = 300.0


class ClientWorkersFailed(RuntimeError):
    """No client worker could start (the message says why: the first worker's traceback)."""


def crash_reply(message: Message, reason: str) -> Message:
    """The error reply for a message whose worker died (Flower's code for a crashed ClientApp)."""
    return stamped(Message(Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message))


@dataclass
class _Task:
    number: int
    message: Message
    context: Context
    blobs: list[tuple[int, bytes]]  # the message's arrays, numbered (shared with the round's other messages)
    content: Encoded
    generation: int = 0  # the pool's generation when it was queued (a run's)
    state_blobs: list[bytes] = field(default_factory=list)  # the node's state as sent (a reply may name them)
    handed_to_dead: int = 0  # times a worker was found dead as this message was handed to it


class _WorkerGone(Exception):
    """The worker process ended while it held messages."""


class _UnreadableReply(Exception):
    """A reply came back whole but this process refuses its values (the ClientApp put in one
    that Flower does not allow): the run fails with that error, as without workers."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class _Slot:
    """One worker place of the plan: its GPUs, its process, what that process holds."""

    index: int
    gpus: tuple[int, ...]
    process: subprocess.Popen | None = None
    conn: Connection | None = None
    has: set[int] = field(default_factory=set)       # blob numbers the worker keeps
    state: str = "starting"                           # starting, ready, failed
    failure: str = ""
    held: deque[_Task] = field(default_factory=deque)  # sent, reply not yet back (the first is running)
    env: dict[str, str] = field(default_factory=dict)  # this process's environment when the worker started
    bulk: Bulk | None = None                          # the shared-memory file with the worker
    unlink: str | None = None                         # its path, until the worker has mapped it
    reply_bytes: int = 0                              # the largest reply's arrays so far
    shared_memory: bool = True                        # False: no room for a shared file, the socket only



def _holds_arrays(state: RecordDict) -> bool:
    """Whether a node's state holds arrays (read directly: Flower's ``state.array_records``
    builds a checked dictionary of them every time, and the scheduler asks often)."""
    return any(isinstance(record, ArrayRecord) for record in state.values())

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
        # the replies by message id; an exception: a reply whose values this process refused
        self._replies: dict[str, Message | Exception] = {}
        self._numbers = itertools.count(1)
        self._generation = 0
        self._closing = False
        self._parent_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.client_seconds = 0.0  # time inside the ClientApp, all workers together
        self.transport_seconds = 0.0  # this process's time handing messages out and taking replies back
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
        numbering = Numbering(self._numbers)
        tasks = []
        for message, context in messages:
            content = encode_records(message.content, numbering, as_sent=True) if message.has_content() else []
            tasks.append(_Task(next(self._numbers), message, context, [], content, generation=self._generation))
        by_number = dict(numbering.blobs())
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
        """The replies to ``message_ids`` that are ready, in that order, once all are or after
        ``wait`` seconds (the caller sees a round's last reply the moment it comes)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                for i in message_ids:
                    if isinstance(refused := self._replies.get(i), Exception):  # raised, as delivering it here is
                        del self._replies[i]
                        raise refused
                ready = [i for i in message_ids if i in self._replies]
                left = deadline - time.monotonic()
                if len(ready) == len(message_ids) or left <= 0:
                    return [cast(Message, self._replies.pop(i)) for i in ready]  # no exception left (above)
                self._cond.wait(left)

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Until every worker has started (or failed); raises when none could."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(s.state == "starting" for s in self.slots) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if all(slot.state == "failed" for slot in self.slots):
                raise ClientWorkersFailed(self._failure_text())

    def forget(self) -> None:
        """A run ended: what it queued is dropped, and replies still coming for it are not kept
        (a kept pool serves the next run from a clean slate)."""
        with self._cond:
            self._generation += 1
            for task in self._pending:
                self._busy_nodes.discard(task.context.node_id)
            self._pending.clear()
            self._replies.clear()

    @property
    def alive(self) -> bool:
        return not self._closing and any(slot.state != "failed" for slot in self.slots)

    def pids(self) -> list[int]:
        """The worker processes' PIDs (those started and not failed)."""
        return [s.process.pid for s in self.slots
                if s.process is not None and s.state == "ready" and s.process.poll() is None]

    def close(self, timeout: float = 10.0) -> None:
        """Every worker stopped: idle ones told to end, busy ones (a stopped run) terminated."""
        with self._cond:
            self._closing = True
            self._pending.clear()
            self._cond.notify_all()
        for slot in self.slots:
            process = slot.process
            if process is not None and process.poll() is None and (slot.held or slot.state == "starting"):
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
        """Start the slot's worker, then keep it fed until the pool closes: one message
        running and, while the queue is long, the next one waiting in its socket. An error
        this thread did not foresee ends the worker like a crash (the message it ran fails, the
        next goes back to the queue, a fresh worker starts): a thread that died would leave its
        messages unanswered and their nodes busy for the rest of the run."""
        try:
            if not self._start(slot):
                return
            while slot.state != "failed":
                try:
                    if not self._turn(slot):
                        break
                except Exception as err:  # noqa: BLE001 - see the docstring
                    if self._closing:
                        break
                    process = slot.process
                    self._replace(slot, f"the client worker process (pid {None if process is None else process.pid}) "
                                        f"was stopped after an error in this process: {type(err).__name__}: {err}",
                                  running_failed=bool(slot.held))
        finally:
            with contextlib.suppress(OSError, ValueError):
                self._stop(slot)
            with self._cond:
                if not self._closing and slot.state != "failed":
                    slot.state = "failed"
                    slot.failure = slot.failure or "its thread in the server process ended"
                held, slot.held = list(slot.held), deque()
                self._cond.notify_all()
            for task in held:  # only when even the fallback above failed: nobody would answer them
                self._finish(task, crash_reply(task.message, "the client worker's thread ended"), None, None)
            with self._cond:
                self._fail_pending_if_none_left()
                self._cond.notify_all()

    def _turn(self, slot: _Slot) -> bool:
        """Hand the worker a message (and, while the queue is long, the next one to wait in its
        socket), then take the reply to the one it runs; False when the pool closes."""
        if not slot.held:  # nothing to run: wait for a message (None: the pool closes)
            task = self._take(slot, queued=False)
            if task is None:
                return False
            try:
                self._send(slot, task, queued=False)
            except _Closing:
                self._put_back(task)
                return False
            except _WorkerGone as gone:  # it ended while idle: the message never ran
                self._found_dead(slot, task, str(gone))
                return True
            except Exception:
                if not _holds(slot, task):
                    slot.held.append(task)  # it fails with the error (_serve), not left unanswered
                raise
        if len(slot.held) == 1 and (task := self._take(slot, queued=True)) is not None:
            try:
                self._send(slot, task, queued=True)
            except _Closing:
                self._put_back(task)
                return False
            except (_Unqueued, _WorkerGone):  # it never reached the worker (gone: the reply to the one
                self._put_back(task)           # it runs may be in the socket already, read below)
            except Exception:
                if _holds(slot, task):  # on its way when it failed: the worker is replaced (_serve)
                    raise
                self._put_back(task)  # it fails alone when it is next handed over, the running one unharmed
        head = slot.held[0]
        try:
            reply, state, seconds, retire = self._receive(slot, head)
        except _WorkerGone as gone:
            self._lost(slot, str(gone))
            return True
        except _UnreadableReply as refused:
            slot.held.popleft()
            self._finish(head, refused.error, None, None)
            return True
        slot.held.popleft()
        self._finish(head, reply, state, seconds)
        if retire:
            self._retire(slot, reply)
        return True

    def _take(self, slot: _Slot, queued: bool) -> _Task | None:
        """The next message for this worker: the first queued whose node is free. With nothing
        held, wait for one (None: the pool closes); ``queued`` (the worker is busy): only while
        more messages wait than there are workers (the round's last ones go to whoever is free
        first), and only one that needs nothing but its header."""
        with self._cond:
            while not self._closing:
                if not queued or len(self._pending) > len(self.slots):
                    for i, task in enumerate(self._pending):
                        if task.context.node_id in self._busy_nodes:  # one node's messages one at a time
                            continue
                        if queued and (any(n not in slot.has for n, _ in task.blobs) or _holds_arrays(task.context.state)):
                            return None
                        self._busy_nodes.add(task.context.node_id)
                        return self._pending.pop(i)
                if queued:
                    return None
                self._cond.wait()
            return None

    def _put_back(self, task: _Task) -> None:
        """``task`` never reached a worker: first in the queue again (unless its run has ended)."""
        with self._cond:
            self._busy_nodes.discard(task.context.node_id)
            if task.generation == self._generation and not self._closing:
                self._pending.insert(0, task)
            self._cond.notify_all()

    def _finish(self, task: _Task, reply: Message | Exception, state: RecordDict | None, seconds: float | None) -> None:
        with self._cond:
            if state is not None:
                task.context.state = state
            if seconds is not None:
                self.client_seconds += seconds
            self._busy_nodes.discard(task.context.node_id)
            if task.generation == self._generation:  # else its run ended without it
                self._replies[task.message.metadata.message_id] = reply
            self._cond.notify_all()

    def _found_dead(self, slot: _Slot, task: _Task, text: str) -> None:
        """The worker had ended before ``task`` reached it (killed while idle): ``task`` goes back
        to the queue and a fresh worker starts. Found so a second time, ``task`` fails with
        ``text`` (a message that ends every worker it is handed to must not go round forever)."""
        task.handed_to_dead += 1
        slot.held.append(task)
        self._replace(slot, text, running_failed=task.handed_to_dead > 1)

    def _lost(self, slot: _Slot, text: str) -> None:
        """The worker died: the message it was running fails (its node's state kept), one queued
        behind it goes back to the queue (it never started), and a fresh worker starts."""
        self._replace(slot, text, running_failed=True)

    def _retire(self, slot: _Slot, reply: Message) -> None:
        """The worker's GPU context broke with the message it answered (that reply is the
        failure, as the ClientApp raised it) and the worker ends: a message queued behind it
        goes back to the queue (it never started) and a fresh worker takes the next ones."""
        reason = reply.error.reason.strip().splitlines()[-1] if reply.has_error() and reply.error.reason else "?"
        self._replace(slot, f"a client worker's GPU context broke ({reason}); a fresh worker was started",
                      running_failed=False)

    def _replace(self, slot: _Slot, text: str, running_failed: bool) -> None:
        """The slot's worker ends (``text`` says why): the messages it holds go back to the queue
        - but the one it was running when ``running_failed``, which fails with ``text`` - and a
        fresh worker starts (unless the pool is closing)."""
        self.crashes.append(text)
        held, slot.held = list(slot.held), deque()
        with contextlib.suppress(OSError, ValueError):  # a worker that cannot be stopped cleanly is stopped all the same
            self._stop(slot)
        with self._cond:
            slot.state = "starting"
            for task in reversed(held[1:] if running_failed else held):
                self._busy_nodes.discard(task.context.node_id)
                if task.generation == self._generation:  # else its run ended (forget): nobody waits for it
                    self._pending.insert(0, task)
            self._cond.notify_all()
        if running_failed:
            self._finish(held[0], crash_reply(held[0].message, text), None, None)
        if not self._closing:
            self._start(slot)
        else:
            slot.state = "failed"

    def _start(self, slot: _Slot) -> bool:
        """Start the slot's worker (from this thread: it dies with the thread that started it)
        and wait until it is ready; False when it could not start. Its environment: this
        process's, with the slot's GPUs as ``CUDA_VISIBLE_DEVICES`` ("" for none: Ray's rule for
        an actor), num-cpus as ``OMP_NUM_THREADS`` and this process's import path."""
        ours, theirs = socket.socketpair()
        own = {"CUDA_VISIBLE_DEVICES": cuda_visible_devices(slot.gpus, self._parent_cuda),
               "OMP_NUM_THREADS": str(self.plan.omp_threads),
               "PYTHONPATH": os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")])}
        slot.env = dict(os.environ)
        failure = ""
        try:
            process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-c", WORKER_CODE, str(theirs.fileno()), str(self.plan.omp_threads), self.client_app],
                env={**slot.env, **own}, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as err:
            process, failure = None, f"the worker process could not be started: {err}"
        theirs.close()
        conn = Connection(ours.detach())
        slot.process, slot.conn, slot.has, slot.state = process, conn, set(), "starting"
        said: Any = None
        if process is not None and conn.poll(START_TIMEOUT):
            try:
                said = conn.recv()
            except (EOFError, OSError):
                said = None
        with self._cond:
            if isinstance(said, tuple) and said[0] == "ready":
                slot.state = "ready"
            else:
                slot.state = "failed"
                slot.failure = failure or (said[1] if isinstance(said, tuple) else
                                           f"the worker process ended at start (exit code "
                                           f"{None if process is None else process.poll()})")
                self._fail_pending_if_none_left()
            self._cond.notify_all()
        if slot.state == "failed":
            self._stop(slot)
        return slot.state == "ready"

    def _send(self, slot: _Slot, task: _Task, queued: bool) -> None:
        """Hand ``task`` to the slot's worker. ``queued`` (the worker is busy): the header only,
        and small enough to wait in the socket unread (else :class:`_Unqueued`)."""
        t0 = time.perf_counter()
        conn = slot.conn
        assert conn is not None
        context = task.context
        state_blobs: list[bytes] = []

        def state_blob(data: bytes) -> int:
            state_blobs.append(data)
            return -len(state_blobs)  # negative: this message's own, never kept

        state = encode_records(context.state, state_blob)
        new = [(n, data) for n, data in task.blobs if n not in slot.has]
        numbers = [n for n, _ in new] + [-(i + 1) for i in range(len(state_blobs))]
        task.state_blobs = state_blobs
        outgoing = [data for _, data in new] + state_blobs
        keep = [n for n, _ in task.blobs]
        node = (context.run_id, context.node_id, dict(context.node_config), dict(context.run_config))
        now = os.environ
        env: dict[str, str | None] = {k: v for k, v in now.items() if slot.env.get(k) != v and k not in WORKER_OWN_ENV}
        env.update({k: None for k in slot.env if k not in now and k not in WORKER_OWN_ENV})
        bulk = slot.bulk = slot.bulk or Bulk(conn)
        segment = None if queued else self._room(slot, bulk, sum(len(d) for d in outgoing))
        layout: list[tuple[int | None, int]] = [(None, len(d)) for d in outgoing] if queued else bulk.put(outgoing)
        header = pickle.dumps((task.number, segment, list(zip(numbers, layout)), keep, task.message.metadata,
                               task.content, node, state, self.log_to, env), HEADER_PROTOCOL)
        if queued and (outgoing or len(header) > QUEUED_HEADER_MOST):
            raise _Unqueued
        with self._cond:  # close() sets _closing and then terminates every worker that holds a message
            if self._closing:
                raise _Closing
            slot.held.append(task)
        try:
            conn.send_bytes(header)
            bulk.send_file()  # a new anonymous file, right after the message that names it
            bulk.send_rest(outgoing, layout)
        except OSError as err:
            slot.held.pop()
            raise _WorkerGone(self._gone_text(slot, task, err, ran=False)) from None
        except BaseException:
            slot.held.pop()
            raise
        slot.has = set(keep)
        self._spent(time.perf_counter() - t0)

    def _receive(self, slot: _Slot, task: _Task) -> tuple[Message, RecordDict | None, float, bool]:
        """The reply to ``task`` (the first message the worker holds), the node's new state
        (None: unchanged, the ClientApp raised), the seconds the ClientApp took, and whether the
        worker ends after it (its GPU context broke: :func:`client_worker.gpu_context_broken`)."""
        conn, bulk = slot.conn, slot.bulk
        assert conn is not None and bulk is not None
        try:
            number, seconds, metadata, body, new_state, reply_layout, retire = pickle.loads(conn.recv_bytes())
            t0 = time.perf_counter()
            frames = bulk.take(reply_layout)
        except (EOFError, OSError) as err:
            raise _WorkerGone(self._gone_text(slot, task, err)) from None
        assert number == task.number, (number, task.number)
        if slot.unlink is not None:  # the worker has mapped it (and removed its name, Bulk.attach)
            Path(slot.unlink).unlink(missing_ok=True)
            slot.unlink = None
        slot.reply_bytes = max(slot.reply_bytes, sum(n for _, n in reply_layout))
        metadata = copied_metadata(metadata, str(uuid4()))

        def blob(n: int) -> bytes:  # a frame of the reply, or (negative) a state array sent with the message
            return frames[n] if n >= 0 else task.state_blobs[-n - 1]

        try:
            if body[0] == "error":
                reply = make_message(metadata, error=body[1])
            else:
                reply = make_message(metadata, content=decode_records(body[1], blob, as_sent=True))
            state = None if new_state is None else decode_records(new_state, blob)
        except (TypeError, ValueError) as err:  # the values Flower refuses (the whole reply was read)
            raise _UnreadableReply(err) from err
        finally:
            task.state_blobs = []
        self._spent(time.perf_counter() - t0)
        return reply, state, seconds, retire

    def _spent(self, seconds: float) -> None:
        with self._cond:
            self.transport_seconds += seconds

    def _room(self, slot: _Slot, bulk: Bulk, outgoing: int) -> tuple[str, int] | None:
        """A bigger shared-memory file when this message or two of the replies so far would not
        fit (its path and size, for the worker to map), else None: the one it has will do. Two
        replies: the worker writes each in the other half of the file (:meth:`Bulk.put_reply`)."""
        needed = max(outgoing, 2 * slot.reply_bytes)
        if not slot.shared_memory or needed <= bulk.size or needed < SHARED_MEMORY_FROM:
            return None
        size = int(max(needed, 2 * outgoing) * 1.25) + 2**16
        path = bulk.create(size, f"fedvls-{os.getpid()}-{id(self):x}-{slot.index}-{next(self._numbers)}")
        if path is None:  # no room for a new file: the one it has, and for the rest the socket, from now on
            slot.shared_memory = False
            return None
        slot.unlink = None if path == MEMFD_PATH else path
        return path, size

    def _gone_text(self, slot: _Slot, task: _Task, err: BaseException, ran: bool = True) -> str:
        process = slot.process
        code = None
        if process is not None:
            try:
                code = process.wait(5)
            except subprocess.TimeoutExpired:
                code = None
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"ended (exit code {code})" if code is not None else f"stopped answering ({err})")
        when = "while it ran" if ran else "before it took"
        return (f"the client worker process (pid {None if process is None else process.pid}) {how} {when} "
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
                conn.send_bytes(pickle.dumps(None))
            except (OSError, ValueError):
                pass
        if process is not None:
            for stop in (None, process.terminate, process.kill):
                if stop is not None and process.poll() is None:
                    stop()
                try:
                    process.wait(5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if conn is not None:
            conn.close()
        slot.conn = None
        if slot.bulk is not None:
            slot.bulk.close()
        slot.bulk, slot.reply_bytes = None, 0
        if slot.unlink is not None:
            Path(slot.unlink).unlink(missing_ok=True)
            slot.unlink = None


class _Closing(Exception):
    """The pool closes: a message about to be handed over stays with the pool."""


def _holds(slot: _Slot, task: _Task) -> bool:
    return any(held is task for held in slot.held)


class _Unqueued(Exception):
    """A message too big to wait behind another in a worker's socket: it stays in the queue."""


def _blob_numbers(encoded: Encoded) -> set[int]:
    return {n for _, kind, items in encoded if kind == "arrays" for *_, n in items}
