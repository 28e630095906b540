"""A SuperNode's ``--node-config``, validated into a :class:`NodeSpec` (no data is read).

Two forms: the partition form ``partition-id=<i> num-partitions=<n>`` (a partition of the run's
dataset) and the node-local form ``dataset=... data-dir=... [classes=...]`` (the node's own data);
``test-fraction`` and ``cache-dir`` apply to both. :mod:`fedvls_flwr.data.node_data` loads the data.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedvls_flwr.config.run_config import DATASETS, resolve_path

FOLDER = "folder"


NODE_DATASETS = (FOLDER, *DATASETS)


NODE_CONFIG_KEYS = (
    "partition-id", "num-partitions", "dataset", "data-dir", "classes", "classes-file",
    "test-fraction", "cache-dir",
)


class NodeDataError(ValueError):
    """A node's --node-config or local data cannot work; the message says how to fix it."""


def check_partition(partition_id: int, num_partitions: int) -> None:
    if num_partitions < 1:
        raise NodeDataError(f"node config num-partitions={num_partitions} must be >= 1")
    if not 0 <= partition_id < num_partitions:
        raise NodeDataError(
            f"node config partition-id={partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions={num_partitions})"
        )


def node_partition(node_config: dict[str, Any]) -> tuple[int, int]:
    """(partition-id, num-partitions) from a node config, with a clear error if absent."""
    try:
        return int(node_config["partition-id"]), int(node_config["num-partitions"])
    except KeyError as missing:
        raise NodeDataError(
            f"node config lacks {missing}; start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>' (a partition of the run's dataset) "
            "or --node-config 'dataset=folder data-dir=<path> classes=\"a,b,...\"' (its own data)"
        ) from None


@dataclass(frozen=True)
class NodeSpec:
    """A parsed, validated node config."""

    form: str  # "partition" or "local"
    dataset: str
    data_dir: str  # resolved
    partition_id: int
    num_partitions: int  # 0 in the node-local form
    classes: tuple[str, ...] | None
    test_fraction: float
    cache_dir: str | None  # None: no disk cache

    def describe(self) -> str:
        if self.form == "partition":
            return f"partition {self.partition_id}/{self.num_partitions} of {self.dataset or 'the run dataset'}"
        return f"node-local {self.dataset} data in {self.data_dir}"


def default_cache_dir() -> Path:
    if env := os.environ.get("FEDVLS_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedvls-flwr" / "node-data"


def _classes_from(node_config: dict[str, Any]) -> tuple[str, ...] | None:
    raw = node_config.get("classes")
    path = node_config.get("classes-file")
    if raw is not None and path is not None:
        raise NodeDataError("node config: give either classes or classes-file, not both")
    if path is not None:
        file = resolve_path(str(path))
        try:
            names = [line.strip() for line in file.read_text().splitlines()]
        except OSError as e:
            raise NodeDataError(f"node config classes-file={path}: cannot read {file}: {e}") from e
        names = [n for n in names if n and not n.startswith("#")]
    elif raw is None:
        return None
    elif isinstance(raw, str):
        names = [n.strip() for n in raw.split(",")]
    elif isinstance(raw, (list, tuple)):
        names = [str(n).strip() for n in raw]
    else:
        raise NodeDataError(f"node config classes={raw!r}: expected a quoted comma-separated string")
    if not names or any(not n for n in names):
        raise NodeDataError(
            f"node config classes={raw if path is None else path!r}: empty class name; write "
            'classes="name0,name1,..." (quoted, no empty entries)'
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NodeDataError(f"node config classes: {', '.join(twice)} listed more than once")
    return tuple(names)


def _site_id(dataset: str, data_dir: str) -> int:
    digest = hashlib.sha256(f"{socket.gethostname()}\n{dataset}\n{data_dir}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def parse_node_config(node_config: dict[str, Any]) -> NodeSpec:
    """Validate a SuperNode's node config (either form) into a :class:`NodeSpec`."""
    node_config = dict(node_config)
    known = set(NODE_CONFIG_KEYS)
    for key in node_config:
        norm = key.replace("_", "-").lower()
        if key not in known and norm in known:
            raise NodeDataError(f"node config key {key!r}: did you mean {norm!r}?")

    try:
        test_fraction = float(node_config.get("test-fraction", 0.0))
    except (TypeError, ValueError):
        raise NodeDataError(f"node config test-fraction={node_config['test-fraction']!r}: expected a number") from None
    if not 0.0 <= test_fraction < 1.0:
        raise NodeDataError(f"node config test-fraction={test_fraction}: must be in [0, 1)")

    if "cache-dir" in node_config:
        raw_cache = str(node_config["cache-dir"]).strip()
        cache_dir = None if raw_cache.lower() in ("", "none", "off", "false") else str(resolve_path(raw_cache))
    else:
        cache_dir = str(default_cache_dir())

    def as_int(key: str) -> int:
        value = node_config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise NodeDataError(f"node config {key}={value!r}: expected an integer")
        try:
            number = float(value)
        except ValueError:
            raise NodeDataError(f"node config {key}={value!r}: expected an integer") from None
        if number != int(number):
            raise NodeDataError(f"node config {key}={value!r}: expected an integer")
        return int(number)

    if "dataset" in node_config or "data-dir" in node_config:
        dataset = str(node_config.get("dataset", FOLDER))
        if dataset not in NODE_DATASETS:
            raise NodeDataError(
                f"node config dataset={dataset!r} is not known; choose one of {', '.join(NODE_DATASETS)}"
            )
        if "data-dir" not in node_config:
            raise NodeDataError(f"node config dataset={dataset!r} needs data-dir=<path to this node's data>")
        if "num-partitions" in node_config:
            raise NodeDataError(
                "node config mixes the node-local form (dataset/data-dir) with num-partitions; "
                "drop num-partitions (a node-local dataset is used whole) or drop dataset/data-dir"
            )
        data_dir = str(resolve_path(str(node_config["data-dir"])))
        classes = _classes_from(node_config)
        if dataset == FOLDER and classes is None:
            raise NodeDataError(
                f"node config dataset=folder data-dir={data_dir} needs the class list, e.g. "
                'classes="cat,dog,bird" (its order fixes the label ids, so use the same list on every node) '
                "or classes-file=<file with one name per line>"
            )
        site = as_int("partition-id") if "partition-id" in node_config else _site_id(dataset, data_dir)
        return NodeSpec("local", dataset, data_dir, site, 0, classes, test_fraction, cache_dir)

    partition_id, num_partitions = node_partition(node_config)
    partition_id, num_partitions = as_int("partition-id"), as_int("num-partitions")
    check_partition(partition_id, num_partitions)
    return NodeSpec("partition", "", "", partition_id, num_partitions, None, test_fraction, cache_dir)


def check_distinct_sites(specs: list[NodeSpec]) -> None:
    """Two SuperNodes of one federation must not be the same partition (or site): the server
    would average that data twice and sample by a partition id it cannot tell apart."""
    seen: dict[int, int] = {}
    for i, spec in enumerate(specs):
        if spec.partition_id in seen:
            raise NodeDataError(
                f"node {seen[spec.partition_id]} and node {i} are both partition-id={spec.partition_id} "
                f"({spec.describe()}): give each SuperNode its own partition-id (0..n-1)"
            )
        seen[spec.partition_id] = i


def check_node_folders(specs: list[NodeSpec]) -> None:
    """Each node-local image folder lists as a class tree (no image is read): a missing or
    empty folder, a class folder outside the class list, a symbolic-link loop fail here,
    before a launcher starts anything. Raises ValueError / DatasetNotFoundError naming the node."""
    from fedvls_flwr.data.folder_tree import folder_image_list

    for i, spec in enumerate(specs):
        if spec.form == "local" and spec.dataset == FOLDER and spec.classes is not None:
            try:
                folder_image_list(Path(spec.data_dir), spec.classes)
            except ValueError as err:
                raise NodeDataError(f"node {i} ({spec.describe()}): {err}") from None
