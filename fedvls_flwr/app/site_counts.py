"""The sites' class counts the server may use, and only those.

A site's class counts are its label distribution. No training method needs them on the
server every round (FedConcat asks once, before round 1, through its declared shares), so a
training reply carries them only under the diagnostic ``share-class-counts``. The server's
class-wise views (clients.json, the vacant/minority/majority local-update view, the mean
number of vacant classes) then take them from:

* a simulation: the split itself, rebuilt on the server from the run config (every node is
  a partition of the run's dataset, and no message carries anything);
* a deployment: what the sites sent under ``share-class-counts``, else nothing (the views are
  absent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import INFO
from typing import Any

from flwr.common.logger import log

from fedvls_flwr.app import keys
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.datasets import DatasetNotFoundError
from fedvls_flwr.data.node_config import NodeDataError
from fedvls_flwr.data.node_data import partition_class_counts


class KnownClassCounts:
    """partition id -> class counts, for the server's diagnostics (see the module docstring)."""

    def __init__(self, cfg: RunConfig, simulation: bool, num_nodes: Callable[[], int]) -> None:
        self.cfg, self.simulation, self.num_nodes = cfg, simulation, num_nodes
        self._split: dict[int, list[int]] | None = None

    def split(self) -> dict[int, list[int]]:
        """A simulation's partition, rebuilt once (empty in a deployment, or where the server
        cannot rebuild it: then the class-wise views are left out, and the log says why)."""
        if self._split is None:
            self._split = {}
            if self.simulation:
                try:
                    self._split = partition_class_counts(self.cfg, self.num_nodes())
                except (DatasetNotFoundError, NodeDataError, OSError, ValueError) as err:
                    log(INFO, "class-wise diagnostics left out: the server cannot rebuild the split (%s)",
                        str(err).splitlines()[0])
        return self._split

    def of(self, clients: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
        """The counts of this round's clients: what they sent, else the rebuilt split."""
        split = self.split()
        known: dict[int, list[int]] = {}
        for c in clients:
            pid = c.get("partition_id")
            if pid is None:
                continue
            if "class_counts" in c:
                known[pid] = list(c["class_counts"])
            elif pid in split:
                known[pid] = split[pid]
        return known


def with_mean_vacant(train: Mapping[str, float], clients: Sequence[Mapping[str, Any]],
                     counts: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """The round's training metrics with the clients' vacant classes averaged by samples, as
    a reply's ``num-vacant`` would have been, when the replies did not carry it."""
    if not train or keys.NUM_VACANT in train:
        return dict(train)
    weighted = [(float(c["num_examples"]), sum(1 for n in counts[c["partition_id"]] if n == 0))
                for c in clients if c.get("partition_id") in counts and "num_examples" in c]
    total = sum(w for w, _ in weighted)
    if not weighted or len(weighted) != len(clients) or total <= 0:
        return dict(train)
    return dict(sorted({**train, keys.NUM_VACANT: sum(w * v for w, v in weighted) / total}.items()))
