"""Which data a node trains on, from its SuperNode's ``--node-config``.

One entry point, :func:`node_client_data`, handles two forms:

* **Partition form** (experiments, simulation): ``partition-id=<i> num-partitions=<n>``.
  The node takes partition ``i`` of the run's dataset (run config ``dataset``/``data-dir``).
  Every node recomputes the same split independently from (dataset, seed, number of
  partitions, partition settings), so no index list is ever shipped.
* **Node-local form** (real deployments): the node names its own data,
  ``dataset=folder data-dir=/data/site-a classes="cat,dog,..."`` for an ImageFolder-style
  tree (``<data-dir>/<class name>/*.png|jpg``), or ``dataset=<name> data-dir=...`` for a
  dataset in its own on-disk format (e.g. ``cifar10``: the node trains on the whole
  training pool of its local copy). ``classes`` (comma-separated, or ``classes-file`` with
  one name per line) fixes the label ids, so it must be the same list on every node; a
  class without a folder is a vacant class. Folder images take the run's dataset's
  representation (size, channels, normalisation; see :func:`fedvls_flwr.data.image_format`)
  so that the global model fits them. An optional ``partition-id=<i>`` names the site in
  results and seeds its batch order (default: a stable number derived from host and path).

Keys of both forms: ``test-fraction=<f>`` holds out a stratified fraction of the node's
data as a local test split (``ClientData.test_x``/``test_y``; default 0, none), and
``cache-dir=<path>`` moves the on-disk cache (``cache-dir=""`` turns it off).

Cost per message. In deployment mode every message starts a fresh ClientApp process, so
the prepared local data is cached on the node's disk: one ``.npz`` per node identity under
``cache-dir`` (default ``$FEDVLS_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedvls-flwr/node-data``,
else ``~/.cache/fedvls-flwr/node-data``), keyed by a hash of every input (dataset, data
folder listing with sizes and mtimes, class list, run representation, partition settings,
test fraction). A change of any input misses the cache and rebuilds it; files are written
atomically (temporary file + rename) and a stale file of the same node is replaced. Within
one process (a simulation actor serving many partitions) the dataset stays in memory, as
before, and the disk cache is only written when the dataset had to be loaded.

A node whose data is missing or unreadable raises :class:`NodeDataError` (or the loader's
:class:`~fedvls_flwr.data.DatasetNotFoundError`) with a message naming the node config, the
path and what was expected; Flower returns it in the node's error reply and logs it, and
the server goes on with the other nodes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import DATASETS, RunConfig, resolve_path
from .data import (
    DatasetBundle,
    DatasetNotFoundError,
    image_format,
    load_dataset,
    load_image_folder,
)
from .npz_cache import read_keyed_npz, write_keyed_npz
from .partition import partition_indices
from .synthetic import synthetic_dataset

logger = logging.getLogger("flwr")  # Flower's logger: shows up in the SuperNode's output

CACHE_VERSION = "node-data-v1"
FOLDER = "folder"
NODE_DATASETS = (FOLDER, *DATASETS)
NODE_CONFIG_KEYS = (
    "partition-id", "num-partitions", "dataset", "data-dir", "classes", "classes-file",
    "test-fraction", "cache-dir",
)
TEST_SPLIT_SALT = 0x7E57


class NodeDataError(ValueError):
    """A node's --node-config or local data cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class ClientData:
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    # Local held-out split (node config test-fraction > 0), else None.
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    # The node's id in results and batch seeding: partition-id (partition form) or the
    # site's partition-id / a stable derived number (node-local form).
    partition_id: int = 0
    source: str = ""  # a one-line description for logs

    @property
    def num_examples(self) -> int:
        return int(self.y.shape[0])


# ---------------------------------------------------------------------------
# the run's dataset (server) and the partition form (unchanged API)

_LOADED: set[tuple[str, str]] = set()  # datasets loaded into memory in this process


def dataset_for(cfg: RunConfig) -> DatasetBundle:
    if cfg.dataset == "synthetic":
        return synthetic_dataset(cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_clients, cfg.seed)[0]
    bundle = load_dataset(cfg.dataset, cfg.resolved_data_dir(), download=cfg.download, pool_size=cfg.train_pool_size)
    _LOADED.add((cfg.dataset, str(cfg.resolved_data_dir())))
    return bundle


@lru_cache(maxsize=8)
def _partition(
    dataset: str, data_dir: str, download: bool, pool_size: int, kind: str, num_partitions: int, seed: int,
    beta: float, shards: int, min_size: int,
) -> tuple[np.ndarray, ...]:
    bundle = load_dataset(dataset, data_dir, download=download, pool_size=pool_size)
    return tuple(
        partition_indices(
            bundle.train_y.numpy(), num_partitions, kind, seed,
            dirichlet_beta=beta, shards_per_client=shards, min_size=min_size,
        )
    )


def partitions_for(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    return _partition(
        cfg.dataset, str(cfg.resolved_data_dir()), cfg.download, cfg.train_pool_size, cfg.partition, num_partitions,
        cfg.seed, cfg.dirichlet_beta, cfg.shards_per_client, cfg.min_partition_size,
    )


def _check_partition(partition_id: int, num_partitions: int) -> None:
    if num_partitions < 1:
        raise NodeDataError(f"node config num-partitions={num_partitions} must be >= 1")
    if not 0 <= partition_id < num_partitions:
        raise NodeDataError(
            f"node config partition-id={partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions={num_partitions})"
        )


def client_data(cfg: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Partition ``partition_id`` of the run's dataset (in memory; no disk cache)."""
    _check_partition(partition_id, num_partitions)
    bundle = dataset_for(cfg)
    idx = torch.from_numpy(partitions_for(cfg, num_partitions)[partition_id])
    return ClientData(
        bundle.train_x[idx], bundle.train_y[idx], bundle.num_classes, bundle.mean, bundle.std,
        partition_id=partition_id,
        source=f"partition {partition_id}/{num_partitions} of {cfg.dataset}",
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


# ---------------------------------------------------------------------------
# node config -> NodeSpec


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
    _check_partition(partition_id, num_partitions)
    return NodeSpec("partition", "", "", partition_id, num_partitions, None, test_fraction, cache_dir)


# ---------------------------------------------------------------------------
# fingerprints and the on-disk cache


def _dataset_roots(name: str, root: Path) -> list[Path]:
    """The folders a loader reads (their listing is part of the cache key)."""
    return {
        "digits": [],
        "mnist": [root / "MNIST" / "raw"],
        "mnist10k": [root / "MNIST" / "raw"],
        "fmnist": [root / "FashionMNIST" / "raw", *_idx_files(root)],
        "cifar10": [root / "cifar-10-batches-py"],
        "cifar100": [root / "cifar-100-python"],
        "tinyimagenet": [root / "tiny-imagenet-200"],
    }[name]


def _idx_files(folder: Path) -> list[Path]:
    """IDX files directly in ``folder`` (Fashion-MNIST may sit there, e.g. Debian's copy)."""
    try:
        return sorted(Path(e.path) for e in os.scandir(folder) if e.is_file() and "-idx" in e.name)
    except OSError:
        return []


def _listing(folder: Path) -> list[str]:
    """Every non-hidden file below ``folder`` (or ``folder`` itself, a file): relative path,
    size, mtime (ns)."""
    if folder.is_file():
        st = folder.stat()
        return [f"{folder.name}\t{st.st_size}\t{st.st_mtime_ns}"]
    if not folder.is_dir():
        return [f"missing {folder}"]
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fname in filenames:
            if fname.startswith("."):
                continue
            path = os.path.join(dirpath, fname)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append(f"{os.path.relpath(path, folder)}\t{st.st_size}\t{st.st_mtime_ns}")
    out.sort()
    return out


def _fingerprint(name: str, data_dir: str, classes: tuple[str, ...] | None = None) -> str:
    h = hashlib.sha256()
    if name == FOLDER:
        # What the folder loader reads: the class folders present, and their contents.
        root = Path(data_dir)
        try:
            folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        except OSError:
            folders = ["<unreadable>"]
        h.update(("\n".join(folders) + "\n").encode())
        for name_c in classes or ():
            h.update(f"[{name_c}]\n".encode())
            h.update("\n".join(_listing(root / name_c)).encode())
        return h.hexdigest()
    if name == "digits":
        try:
            h.update(f"scikit-learn {metadata.version('scikit-learn')}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(b"scikit-learn missing\n")
    for folder in _dataset_roots(name, Path(data_dir)):
        h.update(f"[{folder}]\n".encode())
        h.update("\n".join(_listing(folder)).encode())
    return h.hexdigest()


def _inputs(spec: NodeSpec, cfg: RunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity of the node's cache file, everything else its content depends on)."""
    if spec.form == "partition":
        identity = {
            "form": "partition", "dataset": cfg.dataset, "data-dir": str(cfg.resolved_data_dir()),
            "partition-id": spec.partition_id, "num-partitions": spec.num_partitions,
        }
        settings = {
            "partition": cfg.partition, "seed": cfg.seed, "dirichlet-beta": cfg.dirichlet_beta,
            "shards-per-client": cfg.shards_per_client, "min-partition-size": cfg.min_partition_size,
        }
        if cfg.train_pool_size:  # only when set, so that existing cache keys stay valid
            settings["train-pool-size"] = cfg.train_pool_size
    else:
        identity = {"form": "local", "dataset": spec.dataset, "data-dir": spec.data_dir}
        settings = {"classes": list(spec.classes or ()), "site": spec.partition_id}
        if spec.dataset == FOLDER:
            settings["format-of"] = cfg.dataset  # the run's representation the images take
    settings["test-fraction"] = spec.test_fraction
    return identity, settings


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _cache_path(spec: NodeSpec, identity: dict[str, Any], key: str) -> Path:
    name = identity["dataset"]
    return Path(spec.cache_dir) / f"{name}-{_digest(identity)[:12]}-{key[:16]}.npz"


def _read_cache(path: Path, key: str) -> ClientData | None:
    def warn(err: Exception) -> None:
        logger.warning("node data: ignoring unreadable cache %s (%s)", path, err)

    arrays = read_keyed_npz(path, key, on_error=warn)
    if arrays is None:
        return None
    try:
        meta = json.loads(str(arrays["meta"]))
        x, y, test_x, test_y = (torch.from_numpy(arrays[k]) for k in ("x", "y", "test_x", "test_y"))
    except (KeyError, ValueError) as err:
        warn(err)
        return None
    has_test = bool(meta["has_test"])
    return ClientData(
        x, y, int(meta["num_classes"]),
        tuple(meta["mean"]) if meta["mean"] is not None else None,
        tuple(meta["std"]) if meta["std"] is not None else None,
        test_x=test_x if has_test else None,
        test_y=test_y if has_test else None,
        partition_id=int(meta["partition_id"]),
        source=str(meta["source"]),
    )


def _write_cache(path: Path, key: str, data: ClientData) -> None:
    """Atomic; stale files of the same node are removed. A cache that cannot be written
    only costs a warning."""
    meta = {
        "num_classes": data.num_classes, "mean": data.mean, "std": data.std,
        "has_test": data.test_x is not None, "partition_id": data.partition_id, "source": data.source,
    }
    try:
        write_keyed_npz(path, key, {
            "meta": np.array(json.dumps(meta)),
            "x": data.x.numpy(), "y": data.y.numpy(),
            "test_x": (data.test_x if data.test_x is not None else data.x[:0]).numpy(),
            "test_y": (data.test_y if data.test_y is not None else data.y[:0]).numpy(),
        })
        slot = path.name.rsplit("-", 1)[0] + "-"
        for other in path.parent.glob(slot + "*.npz"):
            if other != path:
                other.unlink(missing_ok=True)
    except OSError as e:
        logger.warning("node data: could not write the cache %s: %s (data will be prepared again next time)", path, e)


# ---------------------------------------------------------------------------
# building a node's data


def _split_test(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: list[int]):
    """Stratified hold-out: floor(fraction * n_c) samples of every class c, seeded."""
    if fraction <= 0:
        return x, y, None, None
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    labels = y.numpy()
    test_parts = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = int(np.floor(fraction * idx.size))
        if k:
            test_parts.append(rng.choice(idx, size=k, replace=False))
    test_idx = np.sort(np.concatenate(test_parts)) if test_parts else np.zeros(0, dtype=np.int64)
    keep = np.ones(labels.shape[0], dtype=bool)
    keep[test_idx] = False
    tr = torch.from_numpy(np.flatnonzero(keep))
    te = torch.from_numpy(test_idx.astype(np.int64))
    return x[tr], y[tr], x[te], y[te]


def _build_partition(spec: NodeSpec, cfg: RunConfig) -> ClientData:
    base = client_data(cfg, spec.partition_id, spec.num_partitions)
    x, y, tx, ty = _split_test(base.x, base.y, spec.test_fraction, [cfg.seed, spec.partition_id, TEST_SPLIT_SALT])
    return ClientData(x, y, base.num_classes, base.mean, base.std, tx, ty, spec.partition_id, base.source)


def _build_local(spec: NodeSpec, cfg: RunConfig) -> ClientData:
    try:
        fmt = image_format(cfg.dataset)
    except ValueError as e:
        raise NodeDataError(f"run config dataset={cfg.dataset!r}: {e}") from e
    where = f"node config dataset={spec.dataset} data-dir={spec.data_dir}"
    if spec.dataset == FOLDER:
        assert spec.classes is not None
        if len(spec.classes) != fmt.num_classes:
            raise NodeDataError(
                f"{where}: classes lists {len(spec.classes)} names but the run's model "
                f"(run config dataset={cfg.dataset}) has {fmt.num_classes} outputs; give all "
                f"{fmt.num_classes} class names, in the same order on every node"
            )
        images = load_image_folder(Path(spec.data_dir), spec.classes, fmt)
        x, y, mean, std = images.x, images.y, images.mean, images.std
        num_classes = len(spec.classes)
    else:
        bundle = load_dataset(spec.dataset, spec.data_dir)
        if tuple(bundle.input_shape) != fmt.shape or bundle.num_classes != fmt.num_classes:
            raise NodeDataError(
                f"{where}: images {tuple(bundle.input_shape)} with {bundle.num_classes} classes do not fit "
                f"the run's model (run config dataset={cfg.dataset}: {fmt.shape}, {fmt.num_classes} classes)"
            )
        if spec.classes is not None and tuple(spec.classes) != tuple(bundle.class_names):
            raise NodeDataError(
                f"{where}: classes={','.join(spec.classes)} differs from the dataset's own class list "
                f"{','.join(bundle.class_names)}"
            )
        x, y, mean, std, num_classes = bundle.train_x, bundle.train_y, bundle.mean, bundle.std, bundle.num_classes
    x, y, tx, ty = _split_test(x, y, spec.test_fraction, [spec.partition_id, TEST_SPLIT_SALT])
    return ClientData(x, y, num_classes, mean, std, tx, ty, spec.partition_id, spec.describe())


@lru_cache(maxsize=4)
def _local_in_memory(spec: NodeSpec, cfg: RunConfig) -> ClientData:
    return _prepare(spec, cfg)


def _prepare(spec: NodeSpec, cfg: RunConfig) -> ClientData:
    """Disk cache hit, or build (and write the cache)."""
    t0 = time.perf_counter()
    identity, settings = _inputs(spec, cfg)
    data_name, data_dir = identity["dataset"], identity["data-dir"]
    in_memory = (data_name, data_dir) in _LOADED

    def key_now() -> str:
        return _digest({"v": CACHE_VERSION, **identity, **settings, "files": _fingerprint(data_name, data_dir, spec.classes)})

    if spec.cache_dir is not None and not in_memory:
        key = key_now()
        path = _cache_path(spec, identity, key)
        cached = _read_cache(path, key)
        if cached is not None:
            logger.info(
                "node data: %s - %d samples, %d held out, from the cache %s in %.2fs",
                cached.source, cached.num_examples, 0 if cached.test_y is None else int(cached.test_y.shape[0]),
                path, time.perf_counter() - t0,
            )
            return cached
    data = _build_partition(spec, cfg) if spec.form == "partition" else _build_local(spec, cfg)
    if spec.form == "local" and spec.dataset != FOLDER:
        _LOADED.add((spec.dataset, spec.data_dir))
    written = ""
    if spec.cache_dir is not None and not in_memory:
        # Key computed after the load: a loader may add files once (e.g. unzip MNIST).
        key = key_now()
        path = _cache_path(spec, identity, key)
        _write_cache(path, key, data)
        written = f", cached at {path}"
    logger.info(
        "node data: %s - %d samples, %d held out, prepared in %.2fs%s",
        data.source, data.num_examples, 0 if data.test_y is None else int(data.test_y.shape[0]),
        time.perf_counter() - t0, written,
    )
    return data


def _synthetic_client(spec: NodeSpec, cfg: RunConfig) -> ClientData:
    """Client ``partition-id`` of the generated federation (generated in memory, cheap)."""
    if spec.form != "partition" or spec.num_partitions != cfg.synthetic_clients:
        raise NodeDataError(
            f"{spec.describe()}: dataset 'synthetic' has synthetic-clients={cfg.synthetic_clients} "
            "clients, one per node: run with as many SuperNodes (num-supernodes) as synthetic-clients, "
            "each with partition-id=<i> num-partitions=<synthetic-clients>"
        )
    bundle, parts = synthetic_dataset(cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_clients, cfg.seed)
    idx = torch.from_numpy(parts[spec.partition_id])
    return ClientData(
        bundle.train_x[idx], bundle.train_y[idx], bundle.num_classes, None, None,
        partition_id=spec.partition_id, source=f"synthetic client {spec.partition_id}",
    )


def node_client_data(cfg: RunConfig, node_config: dict[str, Any]) -> ClientData:
    """This node's training data (and optional local test split), either form.

    Raises :class:`NodeDataError` / :class:`~fedvls_flwr.data.DatasetNotFoundError` with a
    message that names the node config and says what to fix.
    """
    spec = parse_node_config(node_config)
    if cfg.dataset == "synthetic":
        return _synthetic_client(spec, cfg)
    try:
        if spec.form == "local":
            return _local_in_memory(spec, cfg)
        return _prepare(spec, cfg)
    except (NodeDataError, DatasetNotFoundError):
        raise
    except (OSError, ValueError) as e:
        raise NodeDataError(f"{spec.describe()}: {type(e).__name__}: {e}") from e
