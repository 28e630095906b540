"""Datasets as in-memory tensors.

Every loader returns a :class:`DatasetBundle`: a training *pool* (the samples that
the partitioner spreads across clients) and the server's held-out test set, both as
whole tensors so that training takes batches by index (no per-sample ``__getitem__``).

Representation
--------------
* ``digits``, ``mnist``, ``mnist10k``, ``fmnist`` (small, grayscale): float32 ``(N, 1, H, W)``,
  already normalised; ``mean``/``std`` are ``None``.
* ``cifar10``, ``cifar100``, ``tinyimagenet`` (RGB): uint8 ``(N, 3, H, W)``;
  ``mean``/``std`` hold the per-channel statistics (in [0, 1] units) that the training
  code applies to batches after augmentation.

The real download/load paths are kept (torchvision's MNIST, CIFAR-10 and CIFAR-100
classes; TinyImageNet from its standard folder).  A missing dataset raises
:class:`DatasetNotFoundError`, whose message names the files looked for and how to get
them.  Nothing here downloads unless ``download=True``.

Node-local folders (``load_image_folder``): an ImageFolder-style tree
``root/<class name>/**/*.png|jpg|...`` read into the representation of a named dataset
(:func:`image_format`), so that a node's own images are interchangeable with that
dataset's: same size and channels, same normalisation, label ids fixed by a class list.

Loaded bundles are cached per process (keyed on name, resolved data directory and
``download``): clients in one process share the same tensors, which therefore must not
be modified in place.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedvls_flwr.config.run_config import IMAGE_DATASETS as DATASETS
from fedvls_flwr.data.bundle import DatasetBundle, DatasetNotFoundError, ImageFormat, check_bundle
from fedvls_flwr.data.cifar import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, load_cifar
from fedvls_flwr.data.digits import DIGITS_SPLIT_SEED, digits_split, load_digits
from fedvls_flwr.data.folder import (
    FOLDER_IMAGE_EXTENSIONS,
    FolderImages,
    folder_image_list,
    load_image_folder,
)
from fedvls_flwr.data.idx import (
    FMNIST_DEBIAN_DIR,
    FMNIST_MEAN,
    FMNIST_STD,
    MNIST10K_SPLIT_SEED,
    MNIST_FILES,
    MNIST_MEAN,
    MNIST_STD,
    load_fmnist,
    load_mnist,
    load_mnist10k,
)
from fedvls_flwr.data.tinyimagenet import (
    TINYIMAGENET_CACHE_NAME,
    TINYIMAGENET_MEAN,
    TINYIMAGENET_SIZE,
    TINYIMAGENET_STD,
    TINYIMAGENET_URL,
    load_tinyimagenet,
)

__all__ = [
    "DATASETS", "DatasetBundle", "DatasetNotFoundError", "load_dataset", "cache_generation", "clear_cache", "subsample_pool",
    "ImageFormat", "image_format", "FOLDER_IMAGE_EXTENSIONS", "FolderImages", "folder_image_list",
    "load_image_folder", "MNIST_MEAN", "MNIST_STD", "FMNIST_MEAN", "FMNIST_STD", "FMNIST_DEBIAN_DIR",
    "MNIST_FILES", "MNIST10K_SPLIT_SEED", "DIGITS_SPLIT_SEED", "TINYIMAGENET_URL", "TINYIMAGENET_CACHE_NAME",
]

@dataclass(frozen=True)
class DatasetSpec:
    """Everything the app needs to know about a named image dataset, in one entry.

    ``load(root, download)`` returns its DatasetBundle; ``image_format()`` its representation
    (a node's own images take it); ``folders(root)`` the files the loader reads (their listing
    keys the node-data cache). A new dataset: its loader module, one entry here, its name and
    default model in :mod:`fedvls_flwr.config.general`, and a test that loads generated files.
    """

    load: Callable[[Path, bool], DatasetBundle]
    image_format: Callable[[], ImageFormat]
    folders: Callable[[Path], list[Path]]


def _digits_format() -> ImageFormat:
    *_, mean, std, _names = digits_split()  # scikit-learn computes its statistics
    return ImageFormat("digits", (1, 8, 8), 10, True, (mean,), (std,))


def _idx_files(folder: Path) -> list[Path]:
    """IDX files directly in ``folder`` (Fashion-MNIST may sit there, e.g. Debian's copy)."""
    try:
        return sorted(Path(e.path) for e in os.scandir(folder) if e.is_file() and "-idx" in e.name)
    except OSError:
        return []


_TINY = TINYIMAGENET_SIZE
SPECS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(load_digits, _digits_format, lambda root: []),
    "mnist": DatasetSpec(load_mnist, lambda: ImageFormat("mnist", (1, 28, 28), 10, True, (MNIST_MEAN,), (MNIST_STD,)),
                         lambda root: [root / "MNIST" / "raw"]),
    "mnist10k": DatasetSpec(load_mnist10k,
                            lambda: ImageFormat("mnist10k", (1, 28, 28), 10, True, (MNIST_MEAN,), (MNIST_STD,)),
                            lambda root: [root / "MNIST" / "raw"]),
    "fmnist": DatasetSpec(load_fmnist,
                          lambda: ImageFormat("fmnist", (1, 28, 28), 10, True, (FMNIST_MEAN,), (FMNIST_STD,)),
                          lambda root: [root / "FashionMNIST" / "raw", *_idx_files(root)]),
    "cifar10": DatasetSpec(lambda root, download: load_cifar(root, download, "cifar10"),
                           lambda: ImageFormat("cifar10", (3, 32, 32), 10, False, CIFAR10_MEAN, CIFAR10_STD),
                           lambda root: [root / "cifar-10-batches-py"]),
    "cifar100": DatasetSpec(lambda root, download: load_cifar(root, download, "cifar100"),
                            lambda: ImageFormat("cifar100", (3, 32, 32), 100, False, CIFAR100_MEAN, CIFAR100_STD),
                            lambda root: [root / "cifar-100-python"]),
    "tinyimagenet": DatasetSpec(load_tinyimagenet,
                                lambda: ImageFormat("tinyimagenet", (3, _TINY, _TINY), 200, False, TINYIMAGENET_MEAN,
                                                    TINYIMAGENET_STD),
                                lambda root: [root / "tiny-imagenet-200"]),
}
assert tuple(SPECS) == DATASETS, "every image dataset of config.general needs exactly one entry here"


def spec_of(name: str) -> DatasetSpec:
    if name not in SPECS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return SPECS[name]


def load_dataset(name: str, data_dir: str | Path, download: bool = False, pool_size: int = 0) -> DatasetBundle:
    """Load dataset ``name`` from ``data_dir`` (cached per process).

    ``pool_size > 0`` keeps a stratified subsample of that many training images (see
    :func:`subsample_pool`); the test set is unchanged. Raises ``ValueError`` for an
    unknown name or a pool size larger than the pool, and :class:`DatasetNotFoundError`
    when the files are missing (and ``download`` is false or the download failed).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    resolved = str(Path(data_dir).expanduser().resolve())
    if pool_size:
        return _subsampled_cached(name, resolved, bool(download), int(pool_size))
    return _load_cached(name, resolved, bool(download))


#: How many times this process's bundles were forgotten (:func:`clear_cache`): what was worked
#: out from a bundle holds while this has not changed.
_generation = [0]


def cache_generation() -> int:
    return _generation[0]


def clear_cache() -> None:
    """Forget the bundles cached in this process (tests, or to free memory)."""
    _load_cached.cache_clear()
    _subsampled_cached.cache_clear()
    _generation[0] += 1


#: Seed of the training-pool subsample: part of the subsample's definition, never the run seed,
#: so every run (method, seed) at one pool size sees the same images.
POOL_SUBSAMPLE_SEED = 0


def subsample_pool(labels: np.ndarray, size: int, seed: int = POOL_SUBSAMPLE_SEED) -> np.ndarray:
    """Indices (ascending) of a stratified subsample of ``size`` of ``labels``.

    Class c keeps ``k_c`` samples, ``k_c`` the largest-remainder rounding of ``size * n_c / n``
    (so the class proportions of the pool are kept), namely the first ``k_c`` of a fixed
    per-class permutation: pools of different sizes are nested up to that rounding.
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    if not 1 <= size <= n:
        raise ValueError(f"train-pool-size = {size}: must be between 1 and the pool's {n} images (0 = all)")
    classes, counts = np.unique(labels, return_counts=True)
    exact = size * counts / n
    quota = np.floor(exact).astype(np.int64)
    # largest remainders first; ties by class id, so the result is deterministic
    for i in np.lexsort((classes, -(exact - quota)))[: size - int(quota.sum())]:
        quota[i] += 1
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, quota)]
    return np.sort(np.concatenate(keep))


@functools.cache
def _subsampled_cached(name: str, data_dir: str, download: bool, pool_size: int) -> DatasetBundle:
    full = _load_cached(name, data_dir, download)
    idx = torch.from_numpy(subsample_pool(full.train_y.numpy(), pool_size))
    return dataclasses.replace(full, train_x=full.train_x[idx], train_y=full.train_y[idx])


@functools.cache
def _load_cached(name: str, data_dir: str, download: bool) -> DatasetBundle:
    root = Path(data_dir)
    bundle = SPECS[name].load(root, download)
    check_bundle(bundle, root)
    return bundle




def image_format(name: str) -> ImageFormat:
    """The representation of dataset ``name`` (digits needs scikit-learn for its statistics)."""
    return spec_of(name).image_format()
