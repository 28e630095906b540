"""Messages over Flower's Grid: push and collect replies at our own pace, and the global
weights between Flower's ArrayRecord and numpy (shapes and dtypes kept)."""

from __future__ import annotations

import re
import sys
import time
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

#: Seconds between two asks for replies: the simulation's in-memory Grid (a lookup in
#: memory; Flower's default 0.1 s ends every round on the next 0.1 s tick after its last
#: reply) and a deployment's SuperLink (an HTTP request; Flower's Grid sleeps 3 s).
SIMULATION_PULL_INTERVAL = 0.01
DEPLOYMENT_PULL_INTERVAL = 0.2


def is_simulation(grid: Grid) -> bool:
    """Whether every node was registered when the run started: Flower 1.41's simulation (its
    ``InMemoryGrid``) and the in-process engine's grid. Any other Grid talks to a SuperLink whose
    nodes come and go."""
    return getattr(grid, "every_node_registered", False) or runs_on_ray(grid)


def runs_on_ray(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's simulation Grid (its clients run in Ray). Its module is looked
    up, not imported: a process that never loaded it (a deployment's, the in-process engine's)
    holds no such Grid, and importing it costs the ClientApp most of a second."""
    inmemory = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return inmemory is not None and isinstance(grid, inmemory.InMemoryGrid)


def pull_interval(grid: Grid) -> float:
    """How often to ask ``grid`` for replies (a lookup in memory, or a request over the network)."""
    return SIMULATION_PULL_INTERVAL if is_simulation(grid) else DEPLOYMENT_PULL_INTERVAL


def exchange(grid: Grid, messages: list[Message], timeout: float, interval: float | None = None) -> list[Message]:
    """Push ``messages`` and collect their replies until all arrived or ``timeout`` passed.

    Flower's ``Grid.send_and_receive`` does the same, but asks a deployment's SuperLink
    only every 3 s: measured on 127.0.0.1, the wait from the last reply to the ServerApp
    seeing it went from 1.2-1.8 s to 0.16-0.20 s per round with 0.2 s. In simulation the
    10 ms interval took a steady mnist10k round from 0.94 s to 0.80 s (median of 3).
    """
    interval = pull_interval(grid) if interval is None else interval
    waiting = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = time.monotonic() + timeout
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies += got
        waiting -= {m.metadata.reply_to_message_id for m in got}
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return replies


#: The npy format's magic string, and the header fields :func:`array_values` reads.
_NPY_MAGIC = b"\x93NUMPY"
_DESCR = re.compile(rb"'descr':\s*'([^']+)'")
_SHAPE = re.compile(rb"'shape':\s*\(([^)]*)\)")


def array_view(arr: Array) -> np.ndarray | None:
    """A read-only view of an ``Array``'s values over its npy bytes (no copy, no ``np.load``:
    numpy's header parser costs about a third of a millisecond per array, and a round reads every
    array of every reply); None for anything but a C-ordered npy payload."""
    data = arr.data
    if arr.stype == "numpy.ndarray" and data[:6] == _NPY_MAGIC and data[6] in (1, 2, 3):
        size = 2 if data[6] == 1 else 4
        start = 8 + size
        end = start + int.from_bytes(data[8:start], "little")
        header = data[start:end]
        descr, shape = _DESCR.search(header), _SHAPE.search(header)
        if descr is not None and shape is not None and b"'fortran_order': False" in header:
            dtype = np.dtype(descr.group(1).decode())
            dims = tuple(int(d) for d in shape.group(1).decode().replace(" ", "").split(",") if d)
            count = int(np.prod(dims, dtype=np.int64))
            if not dtype.hasobject and len(data) - end == count * dtype.itemsize:
                return np.frombuffer(data, dtype=dtype, count=count, offset=end).reshape(dims)
    return None


def array_values(arr: Array) -> np.ndarray:
    """An ``Array``'s values, equal to ``Array.numpy()`` (a writable copy), read with
    :func:`array_view` and one copy where it can be."""
    view = array_view(arr)
    return arr.numpy() if view is None else view.copy()


def npy_payloads(record: ArrayRecord) -> dict[str, np.ndarray | bytes]:
    """``record``'s arrays for a file (:func:`fedvls_flwr.app.results.save_arrays`): each as
    the ``.npy`` bytes it already is where it is one, else its values."""
    return {key: arr.data if array_view(arr) is not None and isinstance(arr.data, bytes) else array_values(arr)
            for key, arr in record.items()}


def to_numpy_dict(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {key: array_values(arr) for key, arr in record.items()}


def read_only_dict(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``record``'s values without copying them where it can: read-only views over each array's
    bytes (:func:`array_view`; a copy for any other payload). For values that are only read, as
    the server reads its replies: a copy of every reply is 45 MB for ResNet-18, and writing into
    a view raises instead of changing the message."""
    out: dict[str, np.ndarray] = {}
    for key, arr in record.items():
        view = array_view(arr)
        out[key] = arr.numpy() if view is None else view
    return out


#: The npy header of a C-ordered array, by (dtype, shape): all that np.save writes before the values.
_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_NPY_HEADERS_MAX = 4096


def npy_array(value: np.ndarray) -> Array:
    """``Array.from_numpy_ndarray(value)``, byte for byte, without ``np.save`` where it can: a
    C-ordered array's npy bytes are a header that depends only on its dtype and shape, then its
    values, so the header np.save wrote for the first such array is kept and reused (np.save
    costs about 20 µs an array, and every reply, state and global model is made of them)."""
    dtype = value.dtype
    if type(value) is not np.ndarray or dtype.hasobject or dtype.fields is not None or not value.flags.c_contiguous:
        return Array.from_numpy_ndarray(value)  # a subclass (a masked array), a scalar: as Flower takes it
    key = (dtype.str, value.shape)
    header = _NPY_HEADERS.get(key)
    if header is None:
        array = Array.from_numpy_ndarray(value)
        if len(_NPY_HEADERS) < _NPY_HEADERS_MAX:
            _NPY_HEADERS[key] = array.data[:len(array.data) - value.nbytes]
        return array
    payload = _npy_payload_of(value, header)
    if payload is None:
        # one copy of the values (``header + value.tobytes()`` makes two: 20 ms more for ResNet-18's 45 MB)
        payload = b"".join((header, value.reshape(-1).view(np.uint8).data))
    return Array(dtype=str(dtype), shape=tuple(value.shape), stype="numpy.ndarray", data=payload)


def _npy_payload_of(value: np.ndarray, header: bytes) -> bytes | None:
    """The ``bytes`` ``value`` is a view over (:func:`array_view`), when they are exactly its npy
    payload: ``header`` and then ``value``'s values. Bytes never change, so an Array over them is
    the one encoding ``value`` would give, without a copy - the server's round state read from
    one round's record (the unchanged layers of a model, FedConcat's frozen encoders) and put into
    the next one's."""
    base: object = value.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is not bytes or len(base) != len(header) + value.nbytes:
        return None
    start = np.frombuffer(base, dtype=np.uint8).ctypes.data
    if value.ctypes.data != start + len(header) or not base.startswith(header):
        return None
    return base


def numpy_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """What ``ArrayRecord`` makes of ``arrays`` (numpy arrays, or a torch state dict's tensors as
    numpy), byte for byte (:func:`npy_array`), each array set once (the dict constructor builds
    the record twice)."""
    record = ArrayRecord()
    for key, value in arrays.items():
        record[key] = npy_array(value)
    return record


def to_array_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Arrays -> ArrayRecord, each C-contiguous with its shape and dtype kept.

    ``np.ascontiguousarray`` would turn a 0-d array (BatchNorm's ``num_batches_tracked``)
    into shape (1,), and every client would then send back shape () - a mismatch.
    """
    return numpy_record({key: np.require(value, requirements="C") for key, value in arrays.items()})


def short_reason(reason: str, limit: int = 600) -> str:
    """The client's own exception message out of Ray/Flower's wrapped traceback."""
    marker = "Message: "
    if marker in reason:
        reason = reason.rsplit(marker, 1)[1]
    # a deployment's ClientApp: "<class 'pkg.SomeError'>:<'the message'>"
    reason = re.sub(r"^\s*<class '[\w.]+'>:<'", "", reason)
    reason = reason.strip().strip("'>").strip()
    return reason if len(reason) <= limit else reason[:limit] + "..."


# ---- typed access to a message's records (Flower's RecordDict[...] is a union of record kinds)
#: What a MetricRecord holds.
MetricValue = int | float | list[int] | list[float]


# Read directly: Flower's typed views (``content.metric_records`` ...) build a dictionary of every
# record of that kind, checking each, on every access - tens of µs, dozens of times a round.
Record = TypeVar("Record", ArrayRecord, ConfigRecord, MetricRecord)


def record_in(content: RecordDict, key: str, kind: type[Record]) -> Record:
    """``content``'s record ``key`` if it is a ``kind``; KeyError otherwise, as Flower's
    ``content.<kind>_records[key]``."""
    record = content.get(key)
    if not isinstance(record, kind):
        raise KeyError(key)
    return record


def has_record(content: RecordDict, key: str, kind: type[ArrayRecord | ConfigRecord | MetricRecord]) -> bool:
    """Whether ``content`` holds a ``kind`` named ``key`` (``key in content.<kind>_records``)."""
    return isinstance(content.get(key), kind)


def names_of(content: RecordDict, kind: type[ArrayRecord | ConfigRecord | MetricRecord]) -> list[str]:
    """The names of ``content``'s records of ``kind``, in order (``list(content.<kind>_records)``)."""
    return [name for name, record in content.items() if isinstance(record, kind)]


def config_with(base: ConfigRecord, changes: dict[str, Any]) -> ConfigRecord:
    """``base``'s values with ``changes`` on top, ``base`` left as it is: Flower's own copy of
    it (its values were checked when they were set; each list copied) with only the changes
    checked - a run config's ~90 values are not checked again in every round."""
    record = base.copy()
    for key, value in base.items():
        if type(value) is list:
            record[key] = list(value)  # type: ignore[assignment]
    for key, value in changes.items():
        record[key] = value
    return record


def arrays_in(content: RecordDict, key: str) -> ArrayRecord:
    return record_in(content, key, ArrayRecord)


def metrics_in(content: RecordDict, key: str) -> MetricRecord:
    return record_in(content, key, MetricRecord)


def config_in(content: RecordDict, key: str) -> ConfigRecord:
    return record_in(content, key, ConfigRecord)


def number(value: object) -> float:
    """A scalar metric or config value as a float (bool is not a number here)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


def integer(value: object) -> int:
    """An integer metric or config value (floats of integral value pass: metrics may arrive as floats)."""
    as_float = number(value)
    if not as_float.is_integer():
        raise TypeError(f"expected an integer, got {value!r}")
    return int(as_float)


def numbers(value: object) -> list[float]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of numbers, got {value!r}")
    return [number(v) for v in value]
