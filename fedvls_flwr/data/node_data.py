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
  representation (size, channels, normalisation; see :func:`fedvls_flwr.data.datasets.image_format`)
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
:class:`~fedvls_flwr.data.bundle.DatasetNotFoundError`) with a message naming the node config, the
path and what was expected; Flower returns it in the node's error reply and logs it, and
the server goes on with the other nodes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.cache import read_keyed_npz, write_keyed_npz
from fedvls_flwr.data.datasets import (
    DatasetBundle,
    DatasetNotFoundError,
    cache_generation,
    image_format,
    load_dataset,
    load_image_folder,
)
from fedvls_flwr.data.fingerprint import fingerprint
from fedvls_flwr.data.node_config import (
    FOLDER,
    NodeDataError,
    NodeSpec,
    check_partition,
    parse_node_config,
)
from fedvls_flwr.data.partition import class_counts, partition_indices
from fedvls_flwr.data.synthetic import synthetic_dataset

logger = logging.getLogger("flwr")  # Flower's logger: shows up in the SuperNode's output

CACHE_VERSION = "node-data-v1"
TEST_SPLIT_SALT = 0x7E57


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
_SAID: list[bool] = []  # whether this process has said where its node data came from


def _say(message: str, *args: object) -> None:
    """The first node data of a process at INFO, the rest at DEBUG: a deployment's ClientApp
    prepares one node's data per process (one line per message), but a simulation's Ray actor
    serves many partitions in every round, and a line per client and round (which Ray then
    folds into "[repeated 114x across cluster]") says nothing new."""
    logger.log(logging.DEBUG if _SAID else logging.INFO, message, *args)
    _SAID.append(True)


def node_data_lines_at_debug() -> None:
    """Every later node-data line of this process at DEBUG (a Ray actor's: see
    :mod:`fedvls_flwr.app.known_warnings`)."""
    _SAID.append(True)


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


def partition_class_counts(cfg: RunConfig, num_partitions: int) -> dict[int, list[int]]:
    """partition id -> its training samples per class, as a simulated node in partition form
    holds them. A simulation's server computes these from the split itself, so no site has
    to send its label distribution for the class-wise diagnostics."""
    if cfg.dataset == "synthetic":
        bundle, parts = synthetic_dataset(cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_clients, cfg.seed)
    else:
        bundle, parts = dataset_for(cfg), tuple(partitions_for(cfg, num_partitions))
    labels = bundle.train_y.numpy()
    return {pid: [int(c) for c in class_counts(labels, idx, bundle.num_classes)] for pid, idx in enumerate(parts)}


def client_data(cfg: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Partition ``partition_id`` of the run's dataset (in memory; no disk cache)."""
    check_partition(partition_id, num_partitions)
    bundle = dataset_for(cfg)
    idx = torch.from_numpy(partitions_for(cfg, num_partitions)[partition_id])
    return ClientData(
        bundle.train_x[idx], bundle.train_y[idx], bundle.num_classes, bundle.mean, bundle.std,
        partition_id=partition_id,
        source=f"partition {partition_id}/{num_partitions} of {cfg.dataset}",
    )



# ---------------------------------------------------------------------------
# the on-disk cache


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


def _cache_path(cache_dir: str, identity: dict[str, Any], key: str) -> Path:
    name = identity["dataset"]
    return Path(cache_dir) / f"{name}-{_digest(identity)[:12]}-{key[:16]}.npz"


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


def _split_test(
    x: torch.Tensor, y: torch.Tensor, fraction: float, seed: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
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


#: Partitions this process prepared from a dataset it holds in memory (a Ray actor or the
#: in-process engine serving many messages): node identity -> (the dataset it was cut from,
#: its data). The partitions of one split hold each sample once, so this holds at most one
#: more copy of the training pool per split; a dataset loaded again (its cache cleared) is a
#: new object, and its partitions are cut again.
_PREPARED: dict[str, tuple[DatasetBundle, ClientData]] = {}
_PREPARED_MAX = 512


def _prepare(spec: NodeSpec, cfg: RunConfig, answer_key: tuple[Any, ...] | None = None) -> ClientData:
    """This process's prepared partition, a disk cache hit, or build (and write the cache); a
    partition found prepared is kept as the answer to ``answer_key`` (:func:`node_client_data`)."""
    t0 = time.perf_counter()
    identity, settings = _inputs(spec, cfg)
    data_name, data_dir = identity["dataset"], identity["data-dir"]
    in_memory = (data_name, data_dir) in _LOADED
    memory_key = _digest({**identity, **settings}) if spec.form == "partition" and in_memory else None
    if memory_key is not None and memory_key in _PREPARED:
        source, prepared = _PREPARED[memory_key]
        if source is dataset_for(cfg):
            if answer_key is not None:
                _keep_answer(answer_key, (cache_generation(), memory_key, prepared))
            return prepared

    def key_now() -> str:
        return _digest({"v": CACHE_VERSION, **identity, **settings, "files": fingerprint(data_name, data_dir, spec.classes)})

    if spec.cache_dir is not None and not in_memory:
        key = key_now()
        path = _cache_path(spec.cache_dir, identity, key)
        cached = _read_cache(path, key)
        if cached is not None:
            if answer_key is not None:  # the same tensors for the node's next messages of this run
                _keep_answer(answer_key, (cache_generation(), None, cached))
            _say(
                "node data: %s - %d samples, %d held out, from the cache %s in %.2fs",
                cached.source, cached.num_examples, 0 if cached.test_y is None else int(cached.test_y.shape[0]),
                path, time.perf_counter() - t0,
            )
            return cached
    data = _build_partition(spec, cfg) if spec.form == "partition" else _build_local(spec, cfg)
    if spec.form == "local" and spec.dataset != FOLDER:
        _LOADED.add((spec.dataset, spec.data_dir))
    if spec.form == "partition":
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[_digest({**identity, **settings})] = (dataset_for(cfg), data)
    written = ""
    if spec.cache_dir is not None and not in_memory:
        # Key computed after the load: a loader may add files once (e.g. unzip MNIST).
        key = key_now()
        path = _cache_path(spec.cache_dir, identity, key)
        _write_cache(path, key, data)
        written = f", cached at {path}"
    _say(
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


#: node_client_data's answers for partitions this process holds in memory (``_PREPARED``, or -
#: memory key None - read from the disk cache, as a client worker of the in-process engine or a
#: Ray actor that never loads the whole dataset does: until 2026-11-29 such a process read the
#: node's .npz again for every message, and FedConcat's kept features, which belong to the
#: tensors, were computed again every head round: 67 ms against 18 a head round; what it keeps
#: is at most the training pool once, the partitions being disjoint - less than a process that
#: cut them itself holds, the whole dataset beside them), by the
#: raw inputs they were worked out from: the run, the node config's items, the run settings a
#: partition depends on, the working directory and the environment variables its paths are
#: resolved with. A node whose data this process holds then costs a dictionary lookup, not its
#: node config parsed, two paths resolved on the file system and a digest (0.1-0.2 ms a message,
#: a tenth of a FedConcat head round's client). An answer holds for one run (a process that
#: serves several runs, a sweep's, works each node's data out again in the next: a data-dir that
#: is a symbolic link pointed elsewhere between runs is seen), while the
#: dataset cache is the one it was cut from
#: (:func:`~fedvls_flwr.data.datasets.cache_generation`) and ``_PREPARED`` still keeps it.
_ANSWERED: dict[tuple[Any, ...], tuple[int, str | None, ClientData]] = {}
_PATH_ENVIRONMENT = ("FEDVLS_BASE_DIR", "HOME", "FEDVLS_CACHE_DIR", "XDG_CACHE_HOME")


def _keep_answer(key: tuple[Any, ...], answer: tuple[int, str | None, ClientData]) -> None:
    """``answer`` kept for ``key`` (:func:`_answer_key`, the run first). The answers kept are all
    of one run: the first one of another run drops them, as no later message of theirs comes (a
    sweep's worker runs many runs one after another); at most ``_PREPARED_MAX``, the oldest dropped."""
    if _ANSWERED and next(iter(_ANSWERED))[0] != key[0]:
        _ANSWERED.clear()
    elif len(_ANSWERED) >= _PREPARED_MAX:
        _ANSWERED.pop(next(iter(_ANSWERED)))
    _ANSWERED[key] = answer



def _answer_key(cfg: RunConfig, node_config: dict[str, Any], run_id: int | None) -> tuple[Any, ...] | None:
    if cfg.dataset == "synthetic":
        return None
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: worked out every time
        return None
    key = (run_id, cwd, tuple(sorted(node_config.items())), tuple(os.environ.get(name) for name in _PATH_ENVIRONMENT),
           cfg.dataset, cfg.data_dir, cfg.download, cfg.train_pool_size, cfg.partition, cfg.seed,
           cfg.dirichlet_beta, cfg.shards_per_client, cfg.min_partition_size)
    try:
        hash(key)
    except TypeError:  # a node config value that is a list: worked out every time
        return None
    return key


def node_client_data(cfg: RunConfig, node_config: dict[str, Any], *, run_id: int | None = None) -> ClientData:
    """This node's training data (and optional local test split), either form. ``run_id``: the
    run asking (Flower's ``Context.run_id``); what was worked out for one run is not the answer
    in another.

    Raises :class:`NodeDataError` / :class:`~fedvls_flwr.data.bundle.DatasetNotFoundError` with a
    message that names the node config and says what to fix.
    """
    key = _answer_key(cfg, node_config, run_id)
    answered = None if key is None else _ANSWERED.get(key)
    if answered is not None:
        generation, memory_key, data = answered
        if memory_key is None:  # read from the disk cache for this run: this process keeps it
            return data
        kept = _PREPARED.get(memory_key)
        if generation == cache_generation() and kept is not None and kept[1] is data:
            return data
    spec = parse_node_config(node_config)
    if cfg.dataset == "synthetic":
        return _synthetic_client(spec, cfg)
    try:
        if spec.form == "local":
            return _local_in_memory(spec, cfg)
        return _prepare(spec, cfg, key)
    except (NodeDataError, DatasetNotFoundError):
        raise
    except (OSError, ValueError) as e:
        raise NodeDataError(f"{spec.describe()}: {type(e).__name__}: {e}") from e
