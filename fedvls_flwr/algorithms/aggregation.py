"""Server-side aggregation on plain numpy arrays (no Flower), so it is testable alone.

Sample-weighted averaging (FedAvg's rule, also FedVLS Algorithm 1 with the weights
normalised over the clients that replied), after every reply is checked against the
global model's layout: a reply with missing/extra keys, other shapes or dtypes, or
non-finite values is rejected with a reason instead of poisoning the global model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ArrayDict = dict[str, np.ndarray]


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
    for key, ref in reference.items():
        arr = reply.arrays[key]
        if arr.shape != ref.shape:
            return f"array '{key}' has shape {arr.shape}, expected {ref.shape}"
        if arr.dtype != ref.dtype:
            return f"array '{key}' has dtype {arr.dtype}, expected {ref.dtype}"
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            return f"array '{key}' contains NaN or inf"
    for name, value in reply.metrics.items():
        if isinstance(value, float) and not np.isfinite(value):
            return f"metric '{name}' is {value}"
    return None


def weighted_average(replies: list[Reply], reference: ArrayDict) -> ArrayDict:
    """sum_i (n_i / sum_j n_j) w_i per array, in float64, cast back to each dtype.

    Integer buffers (BatchNorm's ``num_batches_tracked``) are averaged and rounded so
    the global state keeps the layout the clients expect. Every output array has its
    reference's shape and dtype, 0-d arrays included (``np.rint`` of a 0-d array returns
    a numpy scalar, so rounding happens in place).
    """
    if not replies:
        raise ValueError("weighted_average needs at least one reply")
    total = float(sum(r.num_examples for r in replies))
    out: ArrayDict = {}
    for key, ref in reference.items():
        acc = np.zeros(ref.shape, dtype=np.float64)
        for r in replies:
            acc += (r.num_examples / total) * r.arrays[key].astype(np.float64)
        if ref.dtype.kind in "iub":
            np.rint(acc, out=acc)
        out[key] = acc.astype(ref.dtype)
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
    """sum_i ||m_i||^2 / ||sum_i m_i||^2 with m_i = w_i - w_global (the paper's appendix)."""
    num = 0.0
    summed: dict[str, np.ndarray] = {}
    for w in updates:
        for key, ref in reference.items():
            if ref.dtype.kind not in "fc":
                continue
            m = w[key].astype(np.float64) - ref.astype(np.float64)
            num += float(np.sum(m * m))
            summed[key] = summed.get(key, 0.0) + m
    den = float(sum(np.sum(v * v) for v in summed.values()))
    return num / den if den > 0 else float("nan")
