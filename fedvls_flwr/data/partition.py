"""Label-skew partitioning of a labelled pool across federated clients (numpy only).

Three schemes, all deterministic from ``seed`` so that every node can recompute the
same split independently (nothing has to be shipped between processes):

``dirichlet``
    The NIID-Bench procedure (Li et al., "Federated Learning on Non-IID Data Silos",
    ICDE 2022) used by the FedVLS paper: for every class, shuffle its indices, draw
    proportions ~ Dir(beta * 1_N), give proportion 0 to every client that already holds
    at least ``len(labels) / N`` samples, renormalise and cut the class's indices at the
    cumulative proportions. The whole split is redrawn until every client holds at least
    ``min_size`` samples. Small ``beta`` means strong skew (clients with vacant classes).
``shards``
    The FedAvg "pathological non-IID" scheme: indices sorted by label (stable sort, so
    within a class the original order is kept), cut into ``N * shards_per_client``
    contiguous shards, each client receives ``shards_per_client`` random shards. When the
    pool size is not a multiple of the number of shards, shard sizes differ by at most one
    (``np.array_split``) so that no sample is dropped.
``noniid-labeldir``
    The split of the FedVLS authors' code for its quantity-skew table (named so there):
    every client holds ``shards_per_client`` (s) classes, assigned in a fixed order - class
    0 to the first ``int(N / C * s)`` clients that still take classes, class 1 to the
    next ones with room, and so on - and each class's samples (in pool order) are cut among
    its holders at random, unequal sizes: all but the last holder draw a size uniformly in
    [max(n_c / k / 10, 10 / C), n_c) for 10-class datasets or [.., n_c / k) otherwise
    (n_c the class's samples, k its holders), the last holder takes the rest. Where the
    authors' draw would leave the last holder a negative count (possible with more than
    two holders per class on 10-class data) the class's sizes are drawn again.
``iid``
    A random permutation cut into ``N`` near-equal parts.

Every client's index array is returned sorted ascending (dtype int64).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

PARTITIONS = ("dirichlet", "shards", "noniid-labeldir", "iid")

__all__ = ["PARTITIONS", "PartitionError", "class_counts", "partition_indices"]


class PartitionError(ValueError):
    """A partition cannot be built with the requested settings.

    The message says which parameter is wrong or which step failed, and how to fix it.
    """


def _as_labels(labels: object) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise PartitionError(f"labels must be a 1-D array of class ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(f"labels must hold integer class ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise PartitionError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise PartitionError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    kind: str,
    seed: int,
    *,
    dirichlet_beta: float = 0.5,
    shards_per_client: int = 2,
    min_size: int = 10,
    max_redraws: int = 1000,
) -> list[np.ndarray]:
    """Split ``range(len(labels))`` into ``num_partitions`` disjoint client index sets.

    Args:
        labels: 1-D integer class ids of the pool to split.
        num_partitions: number of clients N (1 <= N <= len(labels)).
        kind: one of :data:`PARTITIONS`.
        seed: seed of ``np.random.default_rng``; the same inputs give the same split.
        dirichlet_beta: concentration of the Dirichlet prior (``dirichlet`` only, > 0).
        shards_per_client: shards given to each client (``shards``), classes held by each
            client (``noniid-labeldir``); >= 1.
        min_size: every client must end with at least this many samples (``dirichlet``
            only; ``iid`` and ``shards`` give every client at least one sample by
            construction; ``noniid-labeldir`` can leave clients empty: with int(N / C * s)
            holders per class, the clients past the C classes' slots hold nothing, e.g.
            the last 2 of 12 clients for 10 classes and s = 2).
        max_redraws: how many whole-split draws the ``dirichlet`` scheme may try before
            giving up (>= 1).

    Returns:
        A list of N sorted int64 index arrays whose union is ``range(len(labels))``.

    Raises:
        PartitionError: invalid arguments, or no valid split found.
    """
    y = _as_labels(labels)
    n = int(y.size)
    if kind not in PARTITIONS:
        raise PartitionError(f"kind must be one of {PARTITIONS}, got {kind!r}")
    if n == 0:
        raise PartitionError("labels is empty: there is nothing to partition")
    num_partitions = _check_int("num_partitions", num_partitions, 1)
    if num_partitions > n:
        raise PartitionError(
            f"num_partitions={num_partitions} exceeds the pool size {n}: "
            "use fewer clients or a larger dataset"
        )
    if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(int(seed))

    if kind == "iid":
        parts = np.array_split(rng.permutation(n), num_partitions)
    elif kind == "shards":
        parts = _shards(y, num_partitions, shards_per_client, rng)
    elif kind == "noniid-labeldir":
        parts = _label_dir(y, num_partitions, shards_per_client, max_redraws, rng)
    else:
        parts = _dirichlet(y, num_partitions, dirichlet_beta, min_size, max_redraws, rng)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _shards(y: np.ndarray, num_partitions: int, shards_per_client: object, rng: np.random.Generator) -> list[np.ndarray]:
    shards_per_client = _check_int("shards_per_client", shards_per_client, 1)
    num_shards = num_partitions * shards_per_client
    if num_shards > y.size:
        raise PartitionError(
            f"shards: {num_partitions} clients x shards_per_client={shards_per_client} = "
            f"{num_shards} shards, but the pool has only {y.size} samples: "
            "use fewer shards per client or fewer clients"
        )
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_partitions, shards_per_client)
    return [np.concatenate([shards[s] for s in row]) for row in assignment]


def _label_dir(
    y: np.ndarray, num_partitions: int, classes_per_client: object, max_redraws: int, rng: np.random.Generator
) -> list[np.ndarray]:
    classes_per_client = _check_int("shards_per_client", classes_per_client, 1)
    num_classes = int(y.max()) + 1
    holders_per_class = int(num_partitions / num_classes * classes_per_client)
    if holders_per_class < 1:
        raise PartitionError(
            f"noniid-labeldir: {num_partitions} clients x {classes_per_client} classes each cannot cover "
            f"{num_classes} classes (int(N / C * s) = 0 holders per class): use more clients or shards_per_client"
        )
    room = [classes_per_client] * num_partitions
    parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for c in range(num_classes):
        holders = [j for j in range(num_partitions) if room[j] > 0][:holders_per_class]
        if not holders:
            raise PartitionError(
                f"noniid-labeldir: no client has room left for class {c} ({num_partitions} clients x "
                f"{classes_per_client} classes for {num_classes} classes): raise shards_per_client or the clients"
            )
        idx = np.flatnonzero(y == c)
        k = len(holders)
        per = idx.size / k
        low, high = int(max(per / 10, 10 / num_classes)), int(idx.size if num_classes <= 10 else per)
        for _ in range(max_redraws):
            sizes = rng.integers(low, max(high, low + 1), k - 1).tolist() if k > 1 else []
            sizes.append(idx.size - sum(sizes))
            if sizes[-1] >= 0:
                break
        else:
            raise PartitionError(
                f"noniid-labeldir: class {c} ({idx.size} samples) could not be cut among {k} clients "
                f"after max_redraws={max_redraws} draws: use fewer clients per class"
            )
        start = 0
        for j, size in zip(holders, sizes):
            parts[j].append(idx[start : start + size])
            start += size
            room[j] -= 1
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


def _dirichlet(
    y: np.ndarray, num_partitions: int, beta: object, min_size: object, max_redraws: object, rng: np.random.Generator
) -> list[np.ndarray]:
    if isinstance(beta, bool) or not isinstance(beta, Real) or not math.isfinite(beta) or beta <= 0:
        raise PartitionError(f"dirichlet_beta must be a finite number > 0, got {beta!r}")
    min_size = _check_int("min_size", min_size, 0)
    max_redraws = _check_int("max_redraws", max_redraws, 1)
    n = y.size
    if min_size * num_partitions > n:
        raise PartitionError(
            f"dirichlet: min_size={min_size} for each of {num_partitions} clients needs "
            f"{min_size * num_partitions} samples, the pool has {n}: "
            "lower min_size or use fewer clients"
        )
    classes = np.unique(y)
    class_idx = [np.flatnonzero(y == k) for k in classes]
    cap = n / num_partitions  # NIID-Bench: clients at or above N_total / N get no more
    alpha = np.full(num_partitions, float(beta))
    smallest = 0
    for _ in range(max_redraws):
        batches: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        sizes = np.zeros(num_partitions, dtype=np.int64)
        ok = True
        for idx in class_idx:
            idx = idx.copy()
            rng.shuffle(idx)
            p = rng.dirichlet(alpha)
            p = p * (sizes < cap)
            total = p.sum()
            if not total > 0:
                # Every open client drew an exact 0 (float underflow at tiny beta): the
                # reference code would divide by zero here; treat it as a failed draw.
                ok = False
                break
            p = p / total
            cuts = (np.cumsum(p) * idx.size).astype(int)[:-1]
            for j, piece in enumerate(np.split(idx, cuts)):
                batches[j].append(piece)
                sizes[j] += piece.size
        if not ok:
            continue
        smallest = int(sizes.min())
        if smallest >= min_size:
            return [np.concatenate(b) if b else np.empty(0, np.int64) for b in batches]
    raise PartitionError(
        f"dirichlet: no split with every client holding >= min_size={min_size} samples "
        f"after max_redraws={max_redraws} draws (beta={beta}, {num_partitions} clients, "
        f"{n} samples; smallest client in the last draw: {smallest}): use a larger "
        "dirichlet_beta, fewer clients, a smaller min_size or a larger max_redraws"
    )


def class_counts(labels: np.ndarray, indices: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class sample counts of ``labels[indices]`` as an int64 array of shape (C,).

    Raises ValueError when a selected label lies outside ``[0, num_classes)``.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    y = _as_labels(labels)
    sel = y[np.asarray(indices, dtype=np.int64)]
    if sel.size and (sel.min() < 0 or sel.max() >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}); found range "
            f"[{int(sel.min())}, {int(sel.max())}]: check num_classes"
        )
    return np.bincount(sel, minlength=num_classes).astype(np.int64)
