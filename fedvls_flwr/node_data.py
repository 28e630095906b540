"""Which data a node trains on: its partition of the training pool.

Every node recomputes the same split independently from (dataset, seed, number of
partitions, partition settings), so no index list is ever shipped. Both the dataset and
the split are cached per process: a simulation actor serving many clients over many
rounds loads and partitions once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from .config import RunConfig
from .data import DatasetBundle, load_dataset
from .partition import partition_indices


@dataclass(frozen=True)
class ClientData:
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def dataset_for(cfg: RunConfig) -> DatasetBundle:
    return load_dataset(cfg.dataset, cfg.resolved_data_dir(), download=cfg.download)


@lru_cache(maxsize=8)
def _partition(
    dataset: str, data_dir: str, download: bool, kind: str, num_partitions: int, seed: int,
    beta: float, shards: int, min_size: int,
) -> tuple[np.ndarray, ...]:
    bundle = load_dataset(dataset, data_dir, download=download)
    return tuple(
        partition_indices(
            bundle.train_y.numpy(), num_partitions, kind, seed,
            dirichlet_beta=beta, shards_per_client=shards, min_size=min_size,
        )
    )


def partitions_for(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    return _partition(
        cfg.dataset, str(cfg.resolved_data_dir()), cfg.download, cfg.partition, num_partitions,
        cfg.seed, cfg.dirichlet_beta, cfg.shards_per_client, cfg.min_partition_size,
    )


def client_data(cfg: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"node config partition-id={partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions={num_partitions})"
        )
    bundle = dataset_for(cfg)
    idx = torch.from_numpy(partitions_for(cfg, num_partitions)[partition_id])
    return ClientData(bundle.train_x[idx], bundle.train_y[idx], bundle.num_classes, bundle.mean, bundle.std)


def node_partition(node_config: dict[str, Any]) -> tuple[int, int]:
    """(partition-id, num-partitions) from a node config, with a clear error if absent."""
    try:
        return int(node_config["partition-id"]), int(node_config["num-partitions"])
    except KeyError as missing:
        raise ValueError(
            f"node config lacks {missing}; start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None
