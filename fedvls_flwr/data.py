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
import gzip
import hashlib
import os
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DATASETS",
    "FOLDER_IMAGE_EXTENSIONS",
    "FolderImages",
    "ImageFormat",
    "image_format",
    "folder_image_list",
    "load_image_folder",
    "DatasetBundle",
    "DatasetNotFoundError",
    "load_dataset",
    "clear_cache",
    "MNIST10K_SPLIT_SEED",
    "DIGITS_SPLIT_SEED",
    "TINYIMAGENET_URL",
    "TINYIMAGENET_CACHE_NAME",
]

DATASETS = ("digits", "mnist", "mnist10k", "fmnist", "cifar10", "cifar100", "tinyimagenet")

# Fixed split seeds: the train-pool/test split of these datasets is part of the
# dataset's definition and never depends on the run seed.
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_FRACTION = 0.2
MNIST10K_SPLIT_SEED = 0
MNIST10K_TEST_PER_CLASS = 200

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
# Fashion-MNIST's own training-set pixel statistics (of x / 255).
FMNIST_MEAN = 0.2860
FMNIST_STD = 0.3530
FMNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
# Per-channel statistics in [0, 1] units, the values the FedVLS authors' code uses
# (CIFAR-10: (125.3, 123.0, 113.9) / 255 and (63.0, 62.1, 66.7) / 255; CIFAR-100: the
# exact training-set statistics; TinyImageNet: 0.5 / 0.5).
CIFAR10_MEAN = (125.3 / 255.0, 123.0 / 255.0, 113.9 / 255.0)
CIFAR10_STD = (63.0 / 255.0, 62.1 / 255.0, 66.7 / 255.0)
CIFAR100_MEAN = (0.5070751592371323, 0.48654887331495095, 0.4409178433670343)
CIFAR100_STD = (0.2673342858792401, 0.2564384629170883, 0.27615047132568404)
TINYIMAGENET_MEAN = (0.5, 0.5, 0.5)
TINYIMAGENET_STD = (0.5, 0.5, 0.5)

TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINYIMAGENET_DIR = "tiny-imagenet-200"
TINYIMAGENET_CACHE_NAME = ".fedvls_cache_v1.npz"
TINYIMAGENET_SIZE = 64

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_TEST_FILES = MNIST_FILES[2:]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing (or unusable); the message says how to get them."""


@dataclass(frozen=True, eq=False)
class DatasetBundle:
    """A dataset held in memory: the training pool and the server's test set.

    ``eq=False``: bundles compare by identity (comparing tensors field by field is
    ambiguous); the dataclass is still frozen.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])

    def train_class_counts(self) -> np.ndarray:
        return np.bincount(self.train_y.numpy(), minlength=self.num_classes)

    def test_class_counts(self) -> np.ndarray:
        return np.bincount(self.test_y.numpy(), minlength=self.num_classes)


# ---------------------------------------------------------------------------
# public entry point


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


def clear_cache() -> None:
    """Forget the bundles cached in this process (tests, or to free memory)."""
    _load_cached.cache_clear()
    _subsampled_cached.cache_clear()


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


@functools.lru_cache(maxsize=None)
def _subsampled_cached(name: str, data_dir: str, download: bool, pool_size: int) -> DatasetBundle:
    full = _load_cached(name, data_dir, download)
    idx = torch.from_numpy(subsample_pool(full.train_y.numpy(), pool_size))
    return dataclasses.replace(full, train_x=full.train_x[idx], train_y=full.train_y[idx])


@functools.lru_cache(maxsize=None)
def _load_cached(name: str, data_dir: str, download: bool) -> DatasetBundle:
    root = Path(data_dir)
    loader = _LOADERS[name]
    bundle = loader(root, download)
    _check_bundle(bundle, root)
    return bundle


def _check_bundle(b: DatasetBundle, root: Path | None = None) -> None:
    """Internal consistency of a freshly built bundle (cheap). Labels outside the classes
    come from the files (damaged, or another dataset's): DatasetNotFoundError."""
    for split, x, y in (("train", b.train_x, b.train_y), ("test", b.test_x, b.test_y)):
        if x.shape[0] != y.shape[0]:
            raise AssertionError(f"{b.name}: {split} has {x.shape[0]} images but {y.shape[0]} labels")
        if tuple(x.shape[1:]) != b.input_shape:
            raise AssertionError(f"{b.name}: {split} images have shape {tuple(x.shape[1:])}, expected {b.input_shape}")
        if y.dtype != torch.int64:
            raise AssertionError(f"{b.name}: {split} labels are {y.dtype}, expected int64")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= b.num_classes):
            bad = int(((y < 0) | (y >= b.num_classes)).sum())
            where = f" read from {root}" if root is not None else ""
            raise DatasetNotFoundError(
                f"{b.name}: the {split} split{where} has labels {int(y.min())}..{int(y.max())}, {bad} of them "
                f"outside the {b.num_classes} classes 0..{b.num_classes - 1}: the dataset's label files "
                f"there are damaged or are not {b.name}'s. Replace them with intact copies (or point "
                "data-dir elsewhere)."
            )
    if len(b.class_names) != b.num_classes:
        raise AssertionError(f"{b.name}: {len(b.class_names)} class names for {b.num_classes} classes")


def _normalise_gray(x_uint8: np.ndarray, mean: float = MNIST_MEAN, std: float = MNIST_STD) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W), ``(x / 255 - mean) / std`` (MNIST's by default)."""
    x = torch.from_numpy(np.array(x_uint8, dtype=np.uint8, order="C")).to(torch.float32).div_(255.0)
    x.sub_(mean).div_(std)
    return x.unsqueeze(1).contiguous()


def _labels(y) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.int64).clone()


# ---------------------------------------------------------------------------
# digits (scikit-learn, bundled: no download)


@functools.lru_cache(maxsize=1)
def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float, tuple[str, ...]]:
    """(images in [0, 1], labels, pool indices, test indices, pool mean, pool std, class names)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float64) / 16.0).astype(np.float32)  # (1797, 8, 8) in [0, 1]
    y = d.target.astype(np.int64)
    idx = np.arange(len(y))
    tr, te = train_test_split(
        idx, test_size=DIGITS_TEST_FRACTION, stratify=y, random_state=DIGITS_SPLIT_SEED, shuffle=True
    )
    names = tuple(str(int(c)) for c in d.target_names)
    return x, y, tr, te, float(x[tr].mean()), float(x[tr].std()), names


def _load_digits(root: Path, download: bool) -> DatasetBundle:
    x, y, tr, te, mean, std, names = _digits_split()
    xn = (x - mean) / std
    to_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).unsqueeze(1)  # noqa: E731
    return DatasetBundle(
        name="digits",
        train_x=to_t(xn[tr]),
        train_y=torch.from_numpy(y[tr].copy()),
        test_x=to_t(xn[te]),
        test_y=torch.from_numpy(y[te].copy()),
        num_classes=10,
        class_names=names,
        input_shape=(1, 8, 8),
        mean=None,
        std=None,
    )


# ---------------------------------------------------------------------------
# MNIST (torchvision) and mnist10k (the official test split, re-split)


def _ensure_gunzipped(raw: Path, names: tuple[str, ...]) -> None:
    """Decompress ``name.gz`` -> ``name`` where only the archive is present.

    torchvision's MNIST reads the decompressed files; decompressing an archive that is
    already on disk is not a download.  Raises OSError (read-only folder, bad archive).
    """
    for n in names:
        target = raw / n
        if target.is_file():
            continue
        fd, tmp = tempfile.mkstemp(dir=raw, prefix=f".{n}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, gzip.open(raw / (n + ".gz"), "rb") as src:
                shutil.copyfileobj(src, out)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _mnist_help(root: Path) -> str:
    return (
        f"Get it by running with download=true (dataset setting) on a machine with internet "
        f"(torchvision fetches it into {root / 'MNIST' / 'raw'}), or copy the four files "
        f"(.gz or decompressed) there. Offline, use dataset 'mnist10k' (the 10,000-image test "
        f"split only, e.g. data-dir ../shared/data) or 'digits' (bundled with scikit-learn)."
    )


def _load_mnist(root: Path, download: bool) -> DatasetBundle:
    from torchvision.datasets import MNIST

    raw = root / "MNIST" / "raw"
    missing = [n for n in MNIST_FILES if _find_idx(raw, n) is None]
    if missing and not download:
        raise DatasetNotFoundError(
            f"MNIST not found: looked in {raw} for {', '.join(missing)} (or the same names with .gz). "
            + _mnist_help(root)
        )
    if not missing:
        try:
            _ensure_gunzipped(raw, MNIST_FILES)
        except (OSError, EOFError) as e:
            raise DatasetNotFoundError(
                f"MNIST: could not decompress the .gz files in {raw} ({e}); decompress them there "
                f"(gunzip -k) or copy the folder somewhere writable. " + _mnist_help(root)
            ) from e
    try:
        train = MNIST(root=str(root), train=True, download=download)
        test = MNIST(root=str(root), train=False, download=download)
    except Exception as e:  # network failure, corrupt archive, ...
        raise DatasetNotFoundError(
            f"MNIST could not be loaded/downloaded into {raw}: {type(e).__name__}: {e}. " + _mnist_help(root)
        ) from e
    return DatasetBundle(
        name="mnist",
        train_x=_normalise_gray(train.data.numpy()),
        train_y=_labels(train.targets),
        test_x=_normalise_gray(test.data.numpy()),
        test_y=_labels(test.targets),
        num_classes=10,
        class_names=tuple(str(i) for i in range(10)),
        input_shape=(1, 28, 28),
        mean=None,
        std=None,
    )


def _read_idx(path: Path, expected_magic: int) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: too short for an IDX file")
    magic = int.from_bytes(buf[0:4], "big")
    if magic != expected_magic:
        raise ValueError(f"{path}: IDX magic number {magic}, expected {expected_magic}")
    ndim = magic & 0xFF
    dims = [int.from_bytes(buf[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    arr = np.frombuffer(buf, dtype=np.uint8, offset=offset)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of data, header says {dims}")
    return arr.reshape(dims)


def _find_idx(raw: Path, name: str) -> Path | None:
    for candidate in (raw / (name + ".gz"), raw / name):
        if candidate.is_file():
            return candidate
    return None


def _mnist10k_help(root: Path) -> str:
    return (
        f"Point data-dir at a folder holding MNIST/raw/t10k-images-idx3-ubyte.gz and "
        f"MNIST/raw/t10k-labels-idx1-ubyte.gz (the official MNIST test split; decompressed "
        f"files are accepted too), e.g. ../shared/data, or set download=true on a machine "
        f"with internet to fetch them into {root / 'MNIST' / 'raw'}."
    )


def _download_mnist_test_split(raw: Path) -> None:
    """Fetch only the two t10k files, through torchvision's own download helper."""
    from torchvision.datasets import MNIST
    from torchvision.datasets.utils import download_and_extract_archive

    raw.mkdir(parents=True, exist_ok=True)
    for filename, md5 in MNIST.resources:
        if not filename.startswith("t10k"):
            continue
        errors = []
        for mirror in MNIST.mirrors:
            try:
                download_and_extract_archive(mirror + filename, download_root=str(raw), filename=filename, md5=md5)
                break
            except Exception as e:  # noqa: BLE001 - collected and reported
                errors.append(f"{mirror}: {type(e).__name__}: {e}")
        else:
            raise RuntimeError(f"could not download {filename}: " + "; ".join(errors))


def _load_mnist10k(root: Path, download: bool) -> DatasetBundle:
    raw = root / "MNIST" / "raw"
    paths = [_find_idx(raw, n) for n in MNIST_TEST_FILES]
    if any(p is None for p in paths) and download:
        try:
            _download_mnist_test_split(raw)
        except Exception as e:  # noqa: BLE001
            raise DatasetNotFoundError(
                f"mnist10k: download of the MNIST test split into {raw} failed ({e}). " + _mnist10k_help(root)
            ) from e
        paths = [_find_idx(raw, n) for n in MNIST_TEST_FILES]
    if any(p is None for p in paths):
        missing = [n for n, p in zip(MNIST_TEST_FILES, paths) if p is None]
        raise DatasetNotFoundError(
            f"mnist10k not found: looked in {raw} for "
            + ", ".join(f"{n}.gz (or {n})" for n in missing)
            + ". "
            + _mnist10k_help(root)
        )
    try:
        images = _read_idx(paths[0], 2051)
        labels = _read_idx(paths[1], 2049).astype(np.int64)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetNotFoundError(f"mnist10k: unreadable IDX file in {raw}: {e}. " + _mnist10k_help(root)) from e
    if images.shape[0] != labels.shape[0]:
        raise DatasetNotFoundError(f"mnist10k: {images.shape[0]} images but {labels.shape[0]} labels in {raw}")

    pool_idx, test_idx = _balanced_split(labels, MNIST10K_TEST_PER_CLASS, 10, MNIST10K_SPLIT_SEED)
    return DatasetBundle(
        name="mnist10k",
        train_x=_normalise_gray(images[pool_idx]),
        train_y=torch.from_numpy(labels[pool_idx].copy()),
        test_x=_normalise_gray(images[test_idx]),
        test_y=torch.from_numpy(labels[test_idx].copy()),
        num_classes=10,
        class_names=tuple(str(i) for i in range(10)),
        input_shape=(1, 28, 28),
        mean=None,
        std=None,
    )


def _balanced_split(labels: np.ndarray, per_class: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-balanced test set of ``per_class`` per class; the rest is the pool.

    The pool keeps every remaining sample, so its class proportions follow the source
    (stratified).  Both index arrays are shuffled with the same fixed-seed generator.
    """
    rng = np.random.default_rng(seed)
    test_parts = []
    for c in range(num_classes):
        idx_c = np.flatnonzero(labels == c)
        if idx_c.size <= per_class:
            raise DatasetNotFoundError(
                f"class {c} has only {idx_c.size} samples; need more than {per_class} for the balanced split"
            )
        test_parts.append(rng.choice(idx_c, size=per_class, replace=False))
    test_idx = np.concatenate(test_parts)
    in_test = np.zeros(labels.shape[0], dtype=bool)
    in_test[test_idx] = True
    pool_idx = np.flatnonzero(~in_test)
    return rng.permutation(pool_idx), rng.permutation(test_idx)


# ---------------------------------------------------------------------------
# Fashion-MNIST: torchvision's download, or IDX files already on disk (e.g. Debian's
# dataset-fashion-mnist package in /usr/share/datasets/fashion-mnist)

FMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)


def _fmnist_dirs(root: Path) -> list[Path]:
    """Where Fashion-MNIST's four IDX files may lie: torchvision's layout, or data-dir itself."""
    return [root / "FashionMNIST" / "raw", root]


def _fmnist_help(root: Path) -> str:
    return (
        f"Get it either way: (1) run with download=true on a machine with internet (torchvision "
        f"fetches it into {root / 'FashionMNIST' / 'raw'}); or (2) on Debian/Ubuntu, "
        f"'sudo apt-get install dataset-fashion-mnist' and set data-dir={FMNIST_DEBIAN_DIR} "
        f"(any folder holding the four files, .gz or decompressed, works)."
    )


def _find_fmnist(root: Path) -> list[Path] | None:
    """The four files (train images, train labels, test images, test labels) from the first
    folder that holds all of them, else None."""
    for folder in _fmnist_dirs(root):
        paths = [_find_idx(folder, n) for n in MNIST_FILES]
        if all(p is not None for p in paths):
            return paths
    return None


def _load_fmnist(root: Path, download: bool) -> DatasetBundle:
    paths = _find_fmnist(root)
    if paths is None and download:
        from torchvision.datasets import FashionMNIST

        try:  # torchvision's own download (md5-checked), into root/FashionMNIST/raw
            FashionMNIST(root=str(root), train=True, download=True)
        except Exception as e:  # noqa: BLE001 - offline, mirror down, md5 mismatch
            raise DatasetNotFoundError(
                f"fmnist: download into {root / 'FashionMNIST' / 'raw'} failed ({type(e).__name__}: {e}). "
                + _fmnist_help(root)
            ) from e
        paths = _find_fmnist(root)
    if paths is None:
        looked = " and ".join(str(d) for d in _fmnist_dirs(root))
        raise DatasetNotFoundError(
            f"fmnist (Fashion-MNIST) not found: looked in {looked} for "
            + ", ".join(f"{n}.gz (or {n})" for n in MNIST_FILES) + ". " + _fmnist_help(root)
        )
    try:
        train_x, train_y, test_x, test_y = (
            _read_idx(p, magic) for p, magic in zip(paths, (2051, 2049, 2051, 2049))
        )
    except (OSError, ValueError, EOFError) as e:
        raise DatasetNotFoundError(f"fmnist: unreadable IDX file in {paths[0].parent}: {e}. " + _fmnist_help(root)) from e
    for split, x, y in (("training", train_x, train_y), ("test", test_x, test_y)):
        if x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28):
            raise DatasetNotFoundError(
                f"fmnist: the {split} files in {paths[0].parent} hold {x.shape[0]} images of shape "
                f"{x.shape[1:]} and {y.shape[0]} labels; expected as many 28x28 images as labels"
            )
        if y.size and int(y.max()) >= 10:
            raise DatasetNotFoundError(
                f"fmnist: the {split} labels in {paths[0].parent} reach {int(y.max())}; Fashion-MNIST has classes 0-9"
            )
    return DatasetBundle(
        name="fmnist",
        train_x=_normalise_gray(train_x, FMNIST_MEAN, FMNIST_STD),
        train_y=_labels(train_y.astype(np.int64)),
        test_x=_normalise_gray(test_x, FMNIST_MEAN, FMNIST_STD),
        test_y=_labels(test_y.astype(np.int64)),
        num_classes=10,
        class_names=FMNIST_CLASSES,
        input_shape=(1, 28, 28),
        mean=None,
        std=None,
    )


# ---------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (torchvision)


def _load_cifar(root: Path, download: bool, which: str) -> DatasetBundle:
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if which == "cifar10" else tvd.CIFAR100
    folder = root / cls.base_folder
    needed = [n for n, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    missing = [n for n in needed if not (folder / n).is_file()]
    help_text = (
        f"Get it by running with download=true (dataset setting) on a machine with internet "
        f"(torchvision fetches {cls.url} and unpacks it into {root}), or unpack "
        f"{cls.filename} there yourself."
    )
    if missing and not download:
        raise DatasetNotFoundError(
            f"{which} not found: looked in {folder} for {', '.join(missing)}. " + help_text
        )
    try:
        train = cls(root=str(root), train=True, download=download)
        test = cls(root=str(root), train=False, download=download)
    except Exception as e:  # noqa: BLE001 - torchvision raises RuntimeError on md5 mismatch, URLError offline
        if isinstance(e, RuntimeError) and "corrupted" in str(e):
            why = (
                f"the files in {folder} failed torchvision's md5 integrity check (a partial or "
                f"corrupted copy); delete {folder} and fetch it again"
            )
        else:
            why = f"download into {root} failed ({type(e).__name__}: {e})"
        raise DatasetNotFoundError(f"{which} could not be loaded: {why}. " + help_text) from e

    def to_nchw(data: np.ndarray) -> torch.Tensor:
        arr = np.asarray(data, dtype=np.uint8)  # torchvision keeps (N, 32, 32, 3)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(0, 3, 1, 2)))

    return DatasetBundle(
        name=which,
        train_x=to_nchw(train.data),
        train_y=_labels(train.targets),
        test_x=to_nchw(test.data),
        test_y=_labels(test.targets),
        num_classes=len(train.classes),
        class_names=tuple(str(c) for c in train.classes),
        input_shape=(3, 32, 32),
        mean=CIFAR10_MEAN if which == "cifar10" else CIFAR100_MEAN,
        std=CIFAR10_STD if which == "cifar10" else CIFAR100_STD,
    )


# ---------------------------------------------------------------------------
# TinyImageNet (local folder in the standard layout, decoded once into a cache)


def _tiny_help(root: Path) -> str:
    return (
        f"TinyImageNet is not downloaded automatically. On a machine with internet: download "
        f"{TINYIMAGENET_URL} and unzip it into {root} (giving {root / TINYIMAGENET_DIR}/wnids.txt, "
        f"train/<wnid>/images/*.JPEG, val/images/*.JPEG and val/val_annotations.txt), then copy "
        f"the folder here."
    )


def _tiny_file_lists(base: Path) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """(wnids, [(relative train path, label)], [(relative val path, label)]), sorted."""
    wnids = [w.strip() for w in (base / "wnids.txt").read_text().split() if w.strip()]
    if not wnids:
        raise DatasetNotFoundError(f"{base / 'wnids.txt'} lists no classes. " + _tiny_help(base.parent))
    if len(set(wnids)) != len(wnids):
        raise DatasetNotFoundError(f"{base / 'wnids.txt'} lists a class twice")
    index = {w: i for i, w in enumerate(wnids)}
    train: list[tuple[str, int]] = []
    missing_dirs = []
    for w in wnids:
        d = base / "train" / w / "images"
        if not d.is_dir():
            missing_dirs.append(str(d))
            continue
        names = sorted(e.name for e in os.scandir(d) if e.is_file() and e.name.lower().endswith((".jpeg", ".jpg")))
        train.extend((f"train/{w}/images/{n}", index[w]) for n in names)
    if missing_dirs:
        shown = ", ".join(missing_dirs[:3]) + (f" and {len(missing_dirs) - 3} more" if len(missing_dirs) > 3 else "")
        raise DatasetNotFoundError(f"tinyimagenet: missing training folders {shown}. " + _tiny_help(base.parent))
    val: list[tuple[str, int]] = []
    for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) < 2:
            continue
        fname, wnid = parts[0], parts[1]
        if wnid not in index:
            raise DatasetNotFoundError(f"tinyimagenet: val_annotations.txt names class {wnid!r} not in wnids.txt")
        val.append((f"val/images/{fname}", index[wnid]))
    val.sort()
    return wnids, train, val


def _tiny_fingerprint(base: Path, train: list[tuple[str, int]], val: list[tuple[str, int]], wnids: list[str]) -> str:
    """Hash of the class list and every (path, label, size, mtime) the cache was built from."""
    h = hashlib.sha256()
    h.update(f"v1 size={TINYIMAGENET_SIZE}\n".encode())
    h.update(("\n".join(wnids) + "\n").encode())
    for rel, label in train + val:
        st = os.stat(base / rel)
        h.update(f"{rel}\t{label}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _decode_image(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")  # a few TinyImageNet images are grayscale
        if im.size != (TINYIMAGENET_SIZE, TINYIMAGENET_SIZE):
            im = im.resize((TINYIMAGENET_SIZE, TINYIMAGENET_SIZE), Image.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


def _decode_all(base: Path, rels: list[str]) -> np.ndarray:
    out = np.empty((len(rels), 3, TINYIMAGENET_SIZE, TINYIMAGENET_SIZE), dtype=np.uint8)
    if not rels:
        return out

    def work(i: int) -> None:
        out[i] = _decode_image(base / rels[i]).transpose(2, 0, 1)

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as ex:  # PIL releases the GIL while decoding
        list(ex.map(work, range(len(rels))))
    return out


def _load_tinyimagenet(root: Path, download: bool) -> DatasetBundle:
    base = root / TINYIMAGENET_DIR
    required = [base / "wnids.txt", base / "train", base / "val" / "images", base / "val" / "val_annotations.txt"]
    missing = [str(p) for p in required if not p.exists()]
    if missing:
        extra = " (download=true does not fetch TinyImageNet.)" if download else ""
        raise DatasetNotFoundError(
            f"tinyimagenet not found: looked for {', '.join(missing)}. " + _tiny_help(root) + extra
        )
    wnids, train, val = _tiny_file_lists(base)
    if not train or not val:
        raise DatasetNotFoundError(f"tinyimagenet: no images found under {base}. " + _tiny_help(root))
    key = _tiny_fingerprint(base, train, val, wnids)
    cache = base / TINYIMAGENET_CACHE_NAME

    arrays = _read_tiny_cache(cache, key, len(train), len(val))
    if arrays is None:
        train_x = _decode_all(base, [r for r, _ in train])
        test_x = _decode_all(base, [r for r, _ in val])
        _write_tiny_cache(cache, key, train_x, test_x)
    else:
        train_x, test_x = arrays

    class_names = _tiny_class_names(base, wnids)
    return DatasetBundle(
        name="tinyimagenet",
        train_x=torch.from_numpy(train_x),
        train_y=torch.tensor([y for _, y in train], dtype=torch.int64),
        test_x=torch.from_numpy(test_x),
        test_y=torch.tensor([y for _, y in val], dtype=torch.int64),
        num_classes=len(wnids),
        class_names=class_names,
        input_shape=(3, TINYIMAGENET_SIZE, TINYIMAGENET_SIZE),
        mean=TINYIMAGENET_MEAN,
        std=TINYIMAGENET_STD,
    )


def _tiny_class_names(base: Path, wnids: list[str]) -> tuple[str, ...]:
    """Human-readable names from words.txt when present (first synonym), else the wnids."""
    words = base / "words.txt"
    names = {}
    if words.is_file():
        for line in words.read_text(errors="replace").splitlines():
            parts = line.split("\t", 1)
            if len(parts) == 2:
                names[parts[0]] = parts[1].split(",")[0].strip()
    return tuple(names.get(w, w) or w for w in wnids)


def _read_tiny_cache(cache: Path, key: str, n_train: int, n_test: int) -> tuple[np.ndarray, np.ndarray] | None:
    if not cache.is_file():
        return None
    try:
        with np.load(cache, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            train_x, test_x = z["train_x"], z["test_x"]
    except Exception:  # noqa: BLE001 - an unreadable cache is rebuilt
        return None
    shape = (3, TINYIMAGENET_SIZE, TINYIMAGENET_SIZE)
    if train_x.shape != (n_train, *shape) or test_x.shape != (n_test, *shape) or train_x.dtype != np.uint8:
        return None
    return train_x, test_x


def _write_tiny_cache(cache: Path, key: str, train_x: np.ndarray, test_x: np.ndarray) -> None:
    """Write atomically (temp file + rename); a read-only folder only costs a warning."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name + ".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, key=np.array(key), train_x=train_x, test_x=test_x)
        os.replace(tmp, cache)
        tmp = None
    except OSError as e:
        warnings.warn(f"could not write the TinyImageNet cache {cache}: {e}; images will be decoded again next time")
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


# ---------------------------------------------------------------------------
# Node-local image folders (ImageFolder layout), in a named dataset's representation

FOLDER_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff")


@dataclass(frozen=True)
class ImageFormat:
    """How dataset ``name`` holds its images, so images from elsewhere can match it.

    ``normalised``: stored float32 as ``(pixel / 255 - mean) / std`` (the grayscale sets;
    the bundle's ``mean``/``std`` are then ``None``); otherwise stored uint8 and
    ``mean``/``std`` (per channel, [0, 1] units) are applied per batch by the training code.
    """

    name: str
    shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    normalised: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]


def image_format(name: str) -> ImageFormat:
    """The representation of dataset ``name`` (digits needs scikit-learn for its statistics)."""
    if name == "digits":
        *_, mean, std, _names = _digits_split()
        return ImageFormat(name, (1, 8, 8), 10, True, (mean,), (std,))
    if name in ("mnist", "mnist10k"):
        return ImageFormat(name, (1, 28, 28), 10, True, (MNIST_MEAN,), (MNIST_STD,))
    if name == "fmnist":
        return ImageFormat(name, (1, 28, 28), 10, True, (FMNIST_MEAN,), (FMNIST_STD,))
    if name == "cifar10":
        return ImageFormat(name, (3, 32, 32), 10, False, CIFAR10_MEAN, CIFAR10_STD)
    if name == "cifar100":
        return ImageFormat(name, (3, 32, 32), 100, False, CIFAR100_MEAN, CIFAR100_STD)
    if name == "tinyimagenet":
        s = TINYIMAGENET_SIZE
        return ImageFormat(name, (3, s, s), 200, False, TINYIMAGENET_MEAN, TINYIMAGENET_STD)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


@dataclass(frozen=True, eq=False)
class FolderImages:
    """Images of a folder tree in ``fmt``'s representation; ``y`` indexes ``class_names``."""

    x: torch.Tensor  # float32 (N, C, H, W) normalised, or uint8 (N, C, H, W)
    y: torch.Tensor  # int64 (N,)
    class_names: tuple[str, ...]
    files: tuple[str, ...]  # paths relative to the root, in the order of x
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def _folder_help(root: Path, classes: tuple[str, ...]) -> str:
    shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
    return (
        f"Expected an ImageFolder-style tree: {root}/<class name>/<image>"
        f"({'|'.join(e.lstrip('.') for e in FOLDER_IMAGE_EXTENSIONS[:3])}|...), one folder per class "
        f"of the class list ({shown}); sub-folders inside a class folder are read too."
    )


def folder_image_list(root: Path, classes: tuple[str, ...] | list[str]) -> list[tuple[str, int]]:
    """``[(path relative to root, label)]`` for every image of the tree, sorted.

    A class of ``classes`` without a folder is a vacant class (no error); a class folder
    whose name is not in ``classes`` is an error (its label would be undefined). Hidden
    entries (``.name``) and files directly under ``root`` are ignored.
    """
    root = Path(root)
    classes = tuple(classes)
    if not classes:
        raise ValueError("folder dataset: the class list is empty; give classes=\"name0,name1,...\"")
    if len(set(classes)) != len(classes):
        twice = sorted({c for c in classes if classes.count(c) > 1})
        raise ValueError(f"folder dataset: the class list names {', '.join(twice)} more than once")
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"folder dataset not found: {root} does not exist or is not a folder. " + _folder_help(root, classes)
        )
    try:
        folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise DatasetNotFoundError(f"folder dataset: cannot list {root}: {e}") from e
    unknown = [f for f in folders if f not in classes]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ValueError(
            f"folder dataset {root}: class folder(s) {shown} are not in the class list "
            f"({len(classes)} names); add them to the list (its order fixes the label ids, "
            f"so every node must use the same list) or move the folders out"
        )
    out: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        base = root / name
        if not base.is_dir():
            continue  # vacant class on this node
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(root)
            for fname in sorted(filenames):
                if not fname.startswith(".") and fname.lower().endswith(FOLDER_IMAGE_EXTENSIONS):
                    out.append(((rel_dir / fname).as_posix(), label))
    if not out:
        raise DatasetNotFoundError(f"folder dataset {root}: no images found. " + _folder_help(root, classes))
    out.sort()
    return out


def _decode_folder_image(path: Path, size: tuple[int, int], mode: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert(mode)
        if im.size != (size[1], size[0]):
            im = im.resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def load_image_folder(root: Path, classes: tuple[str, ...] | list[str], fmt: ImageFormat) -> FolderImages:
    """Read an ImageFolder-style tree into ``fmt``'s representation.

    Every image is converted to ``fmt``'s channels (``L`` for 1, ``RGB`` for 3) and
    resized (bilinear, aspect ratio not kept) to ``fmt``'s height x width, e.g. 8x8 for
    digits, 28x28 for MNIST, 32x32 for CIFAR, 64x64 for TinyImageNet. Grayscale formats
    are stored normalised float32 with ``fmt``'s statistics; RGB formats stay uint8 with
    ``fmt.mean``/``fmt.std`` returned for the training code to apply. Labels are indices
    into ``classes``.
    """
    root = Path(root)
    classes = tuple(classes)
    items = folder_image_list(root, classes)
    channels, height, width = fmt.shape
    if channels not in (1, 3):
        raise ValueError(f"folder dataset: {channels} channels are not supported (1 or 3)")
    mode = "L" if channels == 1 else "RGB"
    raw = np.empty((len(items), channels, height, width), dtype=np.uint8)

    def work(i: int) -> None:
        path = root / items[i][0]
        try:
            raw[i] = _decode_folder_image(path, (height, width), mode)
        except Exception as e:  # noqa: BLE001 - PIL raises many types for a bad file
            raise DatasetNotFoundError(f"folder dataset: cannot read image {path}: {type(e).__name__}: {e}") from e

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as ex:  # PIL releases the GIL while decoding
        list(ex.map(work, range(len(items))))
    y = torch.tensor([label for _, label in items], dtype=torch.int64)
    if fmt.normalised:
        x = torch.from_numpy(raw).to(torch.float32).div_(255.0)
        mean = torch.tensor(fmt.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(fmt.std, dtype=torch.float32).view(1, -1, 1, 1)
        x = x.sub_(mean).div_(std).contiguous()
        return FolderImages(x, y, classes, tuple(r for r, _ in items), None, None)
    return FolderImages(torch.from_numpy(raw), y, classes, tuple(r for r, _ in items), fmt.mean, fmt.std)


_LOADERS = {
    "digits": _load_digits,
    "mnist": _load_mnist,
    "mnist10k": _load_mnist10k,
    "fmnist": _load_fmnist,
    "cifar10": lambda root, download: _load_cifar(root, download, "cifar10"),
    "cifar100": lambda root, download: _load_cifar(root, download, "cifar100"),
    "tinyimagenet": _load_tinyimagenet,
}
