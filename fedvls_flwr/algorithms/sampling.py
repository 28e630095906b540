"""Which clients train in a round: a seeded draw over the nodes ordered by partition id.

Flower's node ids are random per run. Ordered by partition id (the same every run), two runs
with the same seed - two methods, say - train the same clients in every round, whatever ids
Flower gave the nodes. Plain Python; no Flower, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Mapping


def clients_per_round(fraction_train: float, nodes: int) -> int:
    """How many of ``nodes`` nodes a round trains (``fraction-train`` of them, at least one)."""
    return max(1, int(nodes * fraction_train + 1e-9))


def sample_nodes(node_ids: list[int], partitions: Mapping[int, int], fraction_train: float, seed: int,
                 server_round: int) -> list[int]:
    """A seeded sample of ``fraction_train`` of ``node_ids`` (at least one), sorted by node id.

    ``partitions``: node id -> partition id, where known; nodes whose partition is not known
    yet come last, by node id.
    """
    k = clients_per_round(fraction_train, len(node_ids))
    if k >= len(node_ids):
        return sorted(node_ids)
    ordered = sorted(node_ids, key=lambda n: (n not in partitions, partitions.get(n, 0), n))
    rng = random.Random(seed * 1_000_003 + server_round)
    return sorted(rng.sample(ordered, k))
