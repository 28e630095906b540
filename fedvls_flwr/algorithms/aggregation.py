"""Server-side aggregation on plain numpy arrays (no Flower), so it is testable alone.

Sample-weighted averaging (FedAvg's rule, also FedVLS Algorithm 1 with the weights
normalised over the clients that replied), after every reply is checked against the
global model's layout: a reply with missing/extra keys, other shapes or dtypes, or
non-finite values is rejected with a reason instead of poisoning the global model.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

ArrayDict = dict[str, np.ndarray]
#: Values per span, the unit of a sum: every reply is added into one span of the sum (2 MiB of
#: float64, it stays in the cache meanwhile) before the next, with no temporary array; one thread
#: takes a span at a time, and the spans are the same whatever the thread count. Chosen by a
#: scratch measurement of a ResNet-18's ten replies on one thread: 2^18 and 2^20 values alike,
#: the plain loop over whole arrays 1.4x slower, 2^13-2^16 as slow (the calls' own cost); bench/bench_reply_path.py
#: times the result.
SPAN = 1 << 18
T = TypeVar("T")


@dataclass(frozen=True)
class Reply:
    """One client's training reply, reduced to what aggregation needs."""

    client: str
    arrays: ArrayDict
    num_examples: float
    metrics: dict[str, float]


def check_reply(reply: Reply, reference: ArrayDict) -> str | None:
    """Why ``reply`` cannot be aggregated, or None when it can."""
    if not (np.isfinite(reply.num_examples) and reply.num_examples > 0):
        return f"num-examples must be a positive number, got {reply.num_examples!r}"
    missing = sorted(set(reference) - set(reply.arrays))
    extra = sorted(set(reply.arrays) - set(reference))
    if missing or extra:
        return f"array keys differ from the global model (missing {missing[:5]}, unexpected {extra[:5]})"
    floats: ArrayDict = {}  # the arrays before the first of another layout, whose values are checked
    layout = None
    for key, ref in reference.items():
        arr = reply.arrays[key]
        if arr.shape != ref.shape:
            layout = f"array '{key}' has shape {arr.shape}, expected {ref.shape}"
            break
        if arr.dtype != ref.dtype:
            layout = f"array '{key}' has dtype {arr.dtype}, expected {ref.dtype}"
            break
        if arr.dtype.kind in "fc":
            floats[key] = np.reshape(arr, -1)
    if (bad := _first_not_finite(floats)) is not None:
        return f"array '{bad}' contains NaN or inf"
    if layout is not None:
        return layout
    for name, value in reply.metrics.items():
        if isinstance(value, float) and not np.isfinite(value):
            return f"metric '{name}' is {value}"
    return None


def _first_not_finite(flat: ArrayDict) -> str | None:
    """The first of ``flat``'s (1-d) arrays, in their order, that holds a NaN or inf. Span by
    span on the aggregation threads (:func:`in_spans`): a ResNet-18 reply is 11 M values, checked
    for every reply of a round before the average reads them again."""
    bad = in_spans(flat, lambda key, lo, hi: None if np.isfinite(flat[key][lo:hi]).all() else key)
    return next((key for key in bad if key is not None), None)  # spans come back in order


def weighted_average(replies: list[Reply], reference: ArrayDict) -> ArrayDict:
    """sum_i (n_i / sum_j n_j) w_i per array, in float64, cast back to each dtype.

    Integer buffers (BatchNorm's ``num_batches_tracked``) are averaged and rounded so
    the global state keeps the layout the clients expect. Every output array has its
    reference's shape and dtype, 0-d arrays included (``np.rint`` of a 0-d array returns
    a numpy scalar, so rounding happens in place).

    Each value's sum is the plain loop's (``acc += w_i * x_i.astype(float64)``, in reply order),
    so the result does not depend on the spans or on how many threads add them.
    """
    if not replies:
        raise ValueError("weighted_average needs at least one reply")
    total = float(sum(r.num_examples for r in replies))
    weights = [r.num_examples / total for r in replies]
    sums = {key: np.zeros(ref.size, dtype=np.float64) for key, ref in reference.items()}
    flat = _flattened([r.arrays for r in replies], reference, list(reference), [f"reply {r.client}: " for r in replies])

    def add_up(key: str, lo: int, hi: int) -> None:
        block, term = sums[key][lo:hi], np.empty(hi - lo, dtype=np.float64)
        for values, weight in zip(flat[key], weights):  # reply order, as the plain loop adds them
            np.copyto(term, values[lo:hi], casting="unsafe")
            np.multiply(term, weight, out=term)
            np.add(block, term, out=block)

    in_spans(reference, add_up)
    out: ArrayDict = {}
    for key, ref in reference.items():
        if ref.dtype.kind in "iub":
            np.rint(sums[key], out=sums[key])
        out[key] = sums[key].reshape(ref.shape).astype(ref.dtype)
    return out


def average_metrics(replies: list[Reply]) -> dict[str, float]:
    """Sample-weighted mean of every numeric metric the replies share."""
    if not replies:
        return {}
    total = float(sum(r.num_examples for r in replies))
    shared = set.intersection(*(set(r.metrics) for r in replies))
    return {
        name: sum(r.num_examples * float(r.metrics[name]) for r in replies) / total
        for name in sorted(shared)
    }


def drift_diversity(updates: list[ArrayDict], reference: ArrayDict) -> float:
    """sum_i ||m_i||^2 / ||sum_i m_i||^2 with m_i = w_i - w_global (the paper's appendix).

    In float64, span by span as :func:`weighted_average`; the squared norms are sums
    added up in span order, so the value does not depend on the thread count, and may differ
    from a plain loop's in its last digits (summation order)."""
    floats = {key: ref.reshape(-1) for key, ref in reference.items() if ref.dtype.kind in "fc"}  # flattened once
    flat = _flattened(updates, reference, list(floats), [""] * len(updates))

    def norms(key: str, lo: int, hi: int) -> tuple[float, float]:
        num = 0.0
        g, m, total, square = (np.empty(hi - lo, dtype=np.float64) for _ in range(4))
        np.copyto(g, floats[key][lo:hi], casting="unsafe")
        total.fill(0.0)
        for values in flat[key]:  # numpy's own loops: BLAS's dot would start threads of its own here
            np.copyto(m, values[lo:hi], casting="unsafe")
            np.subtract(m, g, out=m)
            num += float(np.add.reduce(np.multiply(m, m, out=square)))
            np.add(total, m, out=total)
        return num, float(np.add.reduce(np.multiply(total, total, out=square)))

    parts = in_spans(floats, norms)
    num = math.fsum(p[0] for p in parts)
    den = math.fsum(p[1] for p in parts)
    return num / den if den > 0 else float("nan")


def _flattened(arrays: list[ArrayDict], reference: ArrayDict, keys: list[str], names: list[str]) -> dict[str, list[np.ndarray]]:
    """Each of ``arrays``' values of ``keys``, flattened (a view where it can be), once its shape is
    checked against ``reference``: check_reply's layout check, kept here for callers that skip it,
    as a span's copy of flat values would take a (2, 2) array for a (4,) one. ``names``: each
    one's prefix in the error."""
    for key in keys:
        for values, name in zip(arrays, names):
            if np.shape(values[key]) != reference[key].shape:
                raise ValueError(f"{name}array '{key}' has shape {np.shape(values[key])}, expected {reference[key].shape}")
    return {key: [np.reshape(values[key], -1) for values in arrays] for key in keys}


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_pool = threading.local()  # .yes on the pool's threads while they take spans


def in_spans(arrays: ArrayDict, work: Callable[[str, int, int], T]) -> list[T]:
    """``work(key, lo, hi)`` over every array cut into spans of ``SPAN`` values, on up to torch's
    intra-op thread count of threads (numpy's loops release the GIL); results in span order.
    Called from one of those threads (a ``work`` that sums spans itself) it runs on that thread:
    waiting there for the pool's other threads could wait forever. When a span raises, the
    threads take no further span and the first error is raised once all have stopped.

    A ResNet-18 round's average and drift diagnostic pass over 10 x 11 M values each, which
    is worth more cores than one; a model of under two spans (the MNIST MLP) stays on the
    calling thread."""
    spans = [(key, lo, min(ref.size, lo + SPAN)) for key, ref in arrays.items() for lo in range(0, max(ref.size, 1), SPAN)]
    threads = min(torch.get_num_threads(), len(spans), sum(hi - lo for _, lo, hi in spans) // SPAN)
    if threads <= 1 or getattr(_in_pool, "yes", False):
        return [work(*span) for span in spans]
    results: list[Any] = [None] * len(spans)
    order = itertools.count()  # the next span to take (next() of a count is atomic under the GIL)
    failed = threading.Event()

    def take() -> None:
        _in_pool.yes = True
        try:
            while not failed.is_set() and (i := next(order)) < len(spans):
                results[i] = work(*spans[i])
        except BaseException:
            failed.set()
            raise
        finally:
            _in_pool.yes = False

    tasks = [_threads().submit(take) for _ in range(threads)]
    wait(tasks)
    for task in tasks:
        task.result()  # the first error, now that every thread has stopped
    return results


def _threads() -> ThreadPoolExecutor:
    """The process's aggregation threads, started once (a forked child starts its own: the
    parent's threads do not exist there)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="fedvls-aggregate")
        return _pool


def _forget_pool_in_child() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the lock too: another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_pool_in_child)
