"""A client worker of the in-process engine, and what passes between it and its parent.

The worker (:func:`worker_main`) is a fresh Python process that imports torch, Flower and the
ClientApp once, opens its CUDA context once when it has a GPU, and then runs the ClientApp on
one message after another (:func:`run_client`: the thread count a Ray actor would give it,
and, as in an actor, random generators that its messages draw from in turn), keeping its node
data caches from message to message. Its parent is
:class:`fedvls_flwr.ops.client_pool.ClientPool`.

On the wire (a socket pair): each message and reply is a pickled header - the records'
structure (:func:`encode_records`), array bytes replaced by numbers - then the array bytes
themselves, through a file in shared memory both map when there is one (:class:`Bulk`), else
as raw frames on the socket; never pickled.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import mmap
import os
import pickle
import random
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import ErrorCode

from fedvls_flwr.ops.flower_internals import copied_metadata, records_copy, values_copy, wire_values
from fedvls_flwr.ops.processes import die_with_parent

__all__ = ["Bulk", "ClientGenerators", "client_threads", "decode_records", "encode_records", "generators_apart",
           "load_client_app", "run_client", "stamped", "worker_main"]

#: Where the shared-memory files live when the system has no anonymous ones (tmpfs); without
#: either, everything goes through the socket.
SHM_DIR = Path("/dev/shm")
#: Anonymous shared memory (Linux: ``memfd_create``), handed to the worker over its socket: no
#: name exists at any moment, so none can be left behind, and /dev/shm's size (64 MiB in a
#: Docker container unless raised) does not cap it.
USE_MEMFD = hasattr(os, "memfd_create")
#: The path a segment names when its file comes as a descriptor right after the message.
MEMFD_PATH = "<memfd>"
#: The pickle protocol of the headers.
HEADER_PROTOCOL = pickle.HIGHEST_PROTOCOL


# ---- one message, as a Ray actor runs it (a worker, or the calling process) ----------------
@contextmanager
def client_threads(threads: int) -> Iterator[None]:
    """One message's torch thread count, as a Ray actor's ``OMP_NUM_THREADS`` gives it, put back
    afterwards: whatever the message before set, each message starts with ``threads``."""
    import torch

    outer_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(outer_threads)


class ClientGenerators:
    """Where the global random generators of the clients that run in a server's process are
    kept between rounds: those clients continue their own sequence, as a Ray actor's messages
    do, instead of starting again from the server's every round."""

    def __init__(self) -> None:
        self.state: tuple[Any, ...] | None = None  # None: the clients have not drawn yet


def _cpu_generators() -> tuple[Any, Any, Any]:
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_cpu_generators(state: tuple[Any, ...]) -> None:
    import torch

    py_state, np_state, torch_state = state
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)


def _cuda_generators() -> dict[int, Any]:
    """Each device's CUDA generator state; none while CUDA is not open (its generators are not made yet)."""
    import torch

    cuda = torch.cuda
    return {d: cuda.get_rng_state(d) for d in range(cuda.device_count())} if cuda.is_initialized() else {}


def _set_cuda_generators(states: dict[int, Any]) -> None:
    import torch

    for device, device_state in states.items():
        torch.cuda.set_rng_state(device_state, device)


@contextmanager
def generators_apart(clients: ClientGenerators) -> Iterator[None]:
    """The process's random generators (Python's, numpy's global one, torch's CPU and CUDA ones)
    as the clients in ``clients`` left them while what runs inside runs, and as they were before
    once it is done.

    The in-process engine runs a round's clients in the ServerApp's own process; around them,
    this keeps the server's draws what they are under ``flwr run``, where clients are other
    processes, and the clients' draws a sequence of their own that goes on from round to round,
    as a Ray actor's (the first round's clients start from the server's state at that moment).
    The clients inside draw from the generators in turn, as the messages a Ray actor serves do
    (each message's save and restore would cost a tenth of a FedConcat head round's client,
    numpy's state alone 70 µs each way). A client worker, a process of its own, needs no such
    fence.

    CUDA the server had not opened: its generators did not exist, so none was saved. Torch
    makes them when CUDA opens, seeded as the last ``torch.manual_seed`` (or ``torch.seed``)
    asked, with the CPU generator's seed, ``torch.initial_seed()`` (where no seed was ever asked
    for, randomly). So afterwards they are seeded again from the server's
    ``torch.initial_seed()``: at once if a client opened CUDA (not left where the clients' draws
    took them), else when CUDA opens (a seed a client asked for, still waiting for CUDA, is not
    the server's). The app always seeds the server (``torch.manual_seed``).

    On the way out the server's generators go back first, whatever happens: the CPU ones before
    anything that can fail, the CUDA ones whether or not the clients' could be read. A CUDA
    error there is raised once the server's state is back, unless the clients raised (then it
    is logged and theirs goes on)."""
    import torch

    server_cpu, server_cuda, server_seed = _cpu_generators(), _cuda_generators(), torch.initial_seed()
    try:
        if clients.state is not None:
            _set_cpu_generators(clients.state[:3])
            _set_cuda_generators(clients.state[3])
        yield
    except BaseException:
        _leave(clients, server_cpu, server_cuda, server_seed, raising=False)
        raise
    _leave(clients, server_cpu, server_cuda, server_seed, raising=True)


def _leave(clients: ClientGenerators, server_cpu: tuple[Any, ...], server_cuda: dict[int, Any], server_seed: int,
           *, raising: bool) -> None:
    """The server's generators back, the clients' kept in ``clients`` as far as they can be read
    (see :func:`generators_apart`)."""
    import torch

    clients_cpu = _cpu_generators()  # copies: nothing here fails
    _set_cpu_generators(server_cpu)
    errors: list[Exception] = []
    clients_cuda: dict[int, Any] = {}  # unreadable: the next round's clients start from the server's, as the first's
    try:
        clients_cuda = _cuda_generators()
    except Exception as ex:  # noqa: BLE001 - the server's CUDA generators go back all the same
        errors.append(ex)
    clients.state = (*clients_cpu, clients_cuda)
    try:
        if server_cuda:
            _set_cuda_generators(server_cuda)
        else:  # as torch.manual_seed(server_seed) left them: now if CUDA is open, else when it opens
            torch.cuda.manual_seed_all(server_seed)
    except Exception as ex:  # noqa: BLE001
        errors.append(ex)
    shown = errors[1:] if raising else errors  # the first is raised: the others said here
    for error in shown:
        logging.getLogger("flwr").warning("the random generators around in-process clients: %s", error)
    if errors and raising:
        raise errors[0]


def run_client(client_app: ClientApp, message: Message, context: Context, threads: int) -> tuple[Message, bool]:
    """The node's reply to ``message`` and whether the ClientApp returned one (False: it raised,
    the reply is the error reply Flower's simulation builds, and ``context.state`` holds again
    the records it held before, as a Ray actor's copy would)."""
    kept = dict(context.state.items())
    try:
        with client_threads(threads):
            return client_app(message=message, context=context), True
    except Exception as ex:  # noqa: BLE001 - a ClientApp that raises is a failed reply, as in Flower
        for name in [n for n in context.state if n not in kept]:
            del context.state[name]
        for name, record in kept.items():
            context.state[name] = record
        wrapped = ClientAppException(str(ex))
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                             reason=str(type(wrapped)) + ":<'" + str(wrapped) + "'>"), reply_to=message), False


def stamped(reply: Message) -> Message:
    """``reply`` as the SuperLink stores it: a message id of its own, and records of its own
    (nothing the ClientApp still holds, its metrics as the wire gives them back)."""
    metadata = copied_metadata(reply.metadata, str(uuid4()))
    if reply.has_error():
        return make_message(metadata, error=reply.error)
    return make_message(metadata, content=records_copy(reply.content))


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


def encode_records(content: RecordDict, blob: Callable[[bytes], int], *, as_sent: bool = False) -> Encoded:
    """``content`` as picklable tuples in its own order; each array's bytes replaced by the
    number ``blob`` gives them. ``as_sent``: a message the server sends, its config and metric
    values as Flower's wire delivers them (converted, or refused here as ``flwr run`` refuses
    them at the push); a node's state stays as the ClientApp left it."""
    out: Encoded = []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out.append((name, "arrays", [(k, a.dtype, a.shape, a.stype, blob(a.data)) for k, a in record.items()]))
        else:
            out.append((name, "config" if isinstance(record, ConfigRecord) else "metrics",
                        wire_values(record) if as_sent else dict(record)))
    return out


def decode_records(encoded: Encoded, blob: Callable[[int], bytes], *, as_sent: bool = False) -> RecordDict:
    """What :func:`encode_records` encoded. ``as_sent``: a client's reply, its config and metric
    values as Flower's wire gives them to the server (converted, or refused as ``flwr run``
    would); its arrays are new already."""
    records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {}
    for name, kind, items in encoded:
        if kind == "arrays":
            records[name] = ArrayRecord({k: Array(dtype, tuple(shape), stype, blob(n)) for k, dtype, shape, stype, n in items})
        else:
            values = ConfigRecord(items) if kind == "config" else MetricRecord(items)
            records[name] = values_copy(values) if as_sent else values
    return RecordDict(records)


class Numbering:
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


class Bulk:
    """Array bytes between a worker and its parent: through a file in shared memory that both
    map (one copy in, one copy out), else - no such file, or too small - through the connection.

    The parent makes the file (reserving its pages: no room is a clean fallback, never a SIGBUS
    later) and names it in a message: on Linux an anonymous file (memfd) whose descriptor follows
    that message on the socket; elsewhere a /dev/shm file that the worker unlinks as soon as it
    has mapped it (the parent does if the worker never did). Either way the memory goes when both
    let go, even if the parent is killed in the middle of the round. The parent writes a message's arrays only
    when it has taken every reply (from the start of the file); the worker copies them out,
    then writes its reply's - each reply in the half of the file its last reply did not use:
    a message queued behind the last one runs as soon as that reply is sent, and the parent may
    still be copying that reply out (a loaded machine); it sends the next queued message only
    once it has, so two halves are enough (:meth:`put_reply`; the parent sizes the file for two
    replies)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.map: mmap.mmap | None = None
        self.size = 0
        self.low_half_used = False  # (worker) the last reply went to the file's first half
        self.file: int | None = None  # (parent) an anonymous file made and not yet handed over

    def attach(self, path: str, size: int) -> None:
        """(worker) map the parent's file: an anonymous one (``MEMFD_PATH``) comes as a descriptor
        right after the message; a named one loses its name now - both processes hold it mapped,
        and a name left in /dev/shm would outlive a parent killed before the reply."""
        self.close()
        fd = _take_fd(self.conn) if path == MEMFD_PATH else os.open(path, os.O_RDWR)
        try:
            self.map, self.size, self.low_half_used = mmap.mmap(fd, size), size, False
        finally:
            os.close(fd)
            if path != MEMFD_PATH:
                Path(path).unlink(missing_ok=True)

    def create(self, size: int, name: str) -> str | None:
        """(parent) a new file of ``size`` bytes, mapped in place of the one it had; its path
        (``MEMFD_PATH``: :meth:`send_file` hands it over after the message), or None (no room):
        then the file it had stays mapped, as the worker keeps it and writes its replies there,
        and what does not fit goes through the connection."""
        path, fd = SHM_DIR / name, None
        if USE_MEMFD:
            with contextlib.suppress(OSError):  # refused (an old kernel, a seccomp filter): a named file then
                fd = os.memfd_create(name, os.MFD_CLOEXEC)
        anonymous = fd is not None
        if fd is None:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError:
                return None
        try:
            os.posix_fallocate(fd, 0, size)  # the pages reserved now: no room is a clean None, never a SIGBUS later
            new = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            if not anonymous:
                path.unlink(missing_ok=True)
            return None
        self.close()
        if anonymous:
            self.file = fd
        else:
            os.close(fd)
        self.map, self.size = new, size
        return MEMFD_PATH if anonymous else str(path)

    def send_file(self) -> None:
        """(parent) the anonymous file :meth:`create` made, to the worker, right after the message
        that names it; this side keeps only its map."""
        if self.file is not None:
            try:
                _pass_fd(self.conn, self.file)
            finally:
                self.close_file()

    def close_file(self) -> None:
        if self.file is not None:
            os.close(self.file)
            self.file = None

    def put(self, blobs: list[bytes], start: int = 0, end: int | None = None) -> list[tuple[int | None, int]]:
        """Write what fits in [start, end) of the file; each blob's (offset, length), offset None:
        it goes through the connection."""
        layout: list[tuple[int | None, int]] = []
        offset, end = start, self.size if end is None else end
        for data in blobs:
            if self.map is not None and offset + len(data) <= end:
                self.map[offset:offset + len(data)] = data
                layout.append((offset, len(data)))
                offset += len(data)
            else:
                layout.append((None, len(data)))
        return layout

    def put_reply(self, blobs: list[bytes]) -> list[tuple[int | None, int]]:
        """(worker) a reply's arrays, in the other half of the file than its last reply's."""
        half = self.size // 2
        self.low_half_used = not self.low_half_used
        return self.put(blobs, 0, half) if self.low_half_used else self.put(blobs, half, self.size)

    def send_rest(self, blobs: list[bytes], layout: list[tuple[int | None, int]]) -> None:
        for data, (offset, _) in zip(blobs, layout):
            if offset is None:
                self.conn.send_bytes(data)

    def take(self, layout: list[tuple[int | None, int]]) -> list[bytes]:
        assert all(offset is None for offset, _ in layout) or self.map is not None
        return [self.conn.recv_bytes() if offset is None else bytes(self.map[offset:offset + n])  # type: ignore[index]
                for offset, n in layout]

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        self.map, self.size = None, 0
        self.close_file()


def _pass_fd(conn: Connection, fd: int) -> None:
    """``fd`` to the other end of ``conn`` (a Unix socket), as the next byte it reads. Through a
    socket object of our own on a copy of the descriptor, kept blocking: a socket object made
    while ``socket.setdefaulttimeout`` is set (an app may set it before a download) turns the
    shared descriptor non-blocking, and the connection's next read then fails (multiprocessing's
    send_handle does just that)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno())) as sock:
        sock.settimeout(None)
        try:
            socket.send_fds(sock, [b"F"], [fd])
        finally:
            os.set_blocking(conn.fileno(), True)


def _take_fd(conn: Connection) -> int:
    """The descriptor :func:`_pass_fd` sent, the next byte of ``conn`` (blocking kept, as there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno())) as sock:
        sock.settimeout(None)
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1, 1)
        finally:
            os.set_blocking(conn.fileno(), True)
    if data != b"F" or len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise OSError(f"expected a shared-memory file from the parent, got {data!r} with {len(fds)} descriptor(s)")
    return fds[0]


def _output_to(path: str) -> None:  # pragma: no cover - a worker process
    """fd 1 and 2 of this process appended to ``path`` from now on."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _Frames:
    """Byte strings to send after a reply, numbered in order from 0; one the parent sent with the
    message as the node's state (its number there, negative) and still unchanged is not sent
    back, only named (FedConcat's frozen encoders, a round after round)."""

    def __init__(self, received: dict[int, int] | None = None) -> None:
        self.data: list[bytes] = []
        self.received = received or {}  # id of a state blob the parent sent -> its number

    def __call__(self, data: bytes) -> int:
        if id(data) in self.received:
            return self.received[id(data)]
        self.data.append(data)
        return len(self.data) - 1


# ---- the worker process ------------------------------------------------------------------
#: What a worker process runs: ``python -c WORKER_CODE FD THREADS APP`` (no ``multiprocessing``
#: spawn, which would import the caller's main script again in every worker). Ctrl-C is ignored
#: first thing, before the imports: a terminal's Ctrl-C reaches the workers too, and one still
#: importing flwr and numpy printed a KeyboardInterrupt traceback under the run's one line.
WORKER_CODE = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; "
               "from fedvls_flwr.ops.client_worker import worker_main; worker_main(*sys.argv[1:])")


def gpu_context_broken() -> bool:
    """After a message that failed: whether this process's CUDA context is unusable - a
    device-side assert or an illegal memory access leaves every later CUDA call failing with the
    same error until the process ends (an out-of-memory error does not). False where CUDA was
    never used."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error here is the broken context's
        return True
    return False


def worker_main(fd: str, threads_text: str, app_reference: str) -> None:  # pragma: no cover - a worker process
    """A worker: its end of the parent's socket pair is ``fd``; start up, say ready (or why
    not), then run one message after another until told to stop or the parent is gone."""
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above
        return
    # Ctrl-C in a terminal reaches the whole process group: the run's own process says what is
    # saved and stops its workers; a worker would only add a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(fd))
    threads = int(threads_text)
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
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
    bulk = Bulk(conn)
    while True:
        try:
            task = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if task is None:
            return
        number, segment, new, keep, metadata, content, node, state, log_to, env = task
        run_id, node_id, node_config, run_config = node
        if segment is not None:
            bulk.attach(*segment)
        if log_to is not None and log_to != output:  # a kept worker's output goes to its current run's log
            _output_to(log_to)
            output = log_to
        for key, value in env.items():  # the parent's environment now, as the ClientApp would read it there
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for blob_number, data in zip([n for n, _ in new], bulk.take([place for _, place in new])):
            blobs[blob_number] = data
        message = make_message(metadata, content=decode_records(content, blobs.__getitem__))
        context = Context(run_id=run_id, node_id=node_id, node_config=node_config,
                          state=decode_records(state, blobs.__getitem__), run_config=run_config)
        blobs_now = dict(blobs)  # this message's state blobs among them: kept alive until the reply is sent
        for blob_number in [b for b in blobs if b not in keep]:  # the node's state, an earlier round's arrays
            del blobs[blob_number]
        t0 = time.perf_counter()
        reply, returned = run_client(client_app, message, context, threads)
        seconds = time.perf_counter() - t0
        frames = _Frames({id(data): n for n, data in blobs_now.items() if n < 0})
        body = ("error", reply.error) if reply.has_error() else ("content", encode_records(reply.content, frames))
        new_state = encode_records(context.state, frames) if returned else None
        retire = reply.has_error() and gpu_context_broken()
        layout = bulk.put_reply(frames.data)
        conn.send_bytes(pickle.dumps((number, seconds, reply.metadata, body, new_state, layout, retire),
                                     HEADER_PROTOCOL))
        bulk.send_rest(frames.data, layout)
        if retire:  # every later message would fail with it: the parent starts a fresh worker
            return
