"""The reference loop's data: the datasets read from their files, and the label-skew partitions.

Written from the documented formats and rules, with no code of the app: the IDX format of
MNIST and Fashion-MNIST (LeCun's page: a big-endian magic number whose last byte is the rank,
the dimensions, then the bytes), CIFAR's python pickles (Krizhevsky's page: ``data`` is N x 3072
uint8, the red, green and blue planes of a 32x32 image one after the other; ``labels``, or
``fine_labels`` for CIFAR-100), scikit-learn's bundled digits, and the splits and partitions as
docs/running.md ("What a seed fixes") and docs/datasets-and-models.md state them.

Representation (docs/datasets-and-models.md): the grayscale sets are held normalised, float32
``(N, 1, H, W)`` as ``(x / 255 - mean) / std``; the RGB sets as uint8 ``(N, 3, 32, 32)`` with their
per-channel statistics, normalised per batch (the reference trains them with ``augment = false``
only: the app's batched augmentation draws are its own).
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.reference_settings import NotCovered

# Pixel statistics (of x / 255): MNIST's training set (0.1307, 0.3081, as PyTorch's MNIST
# example normalises); Fashion-MNIST's training set (0.2860, 0.3530); CIFAR-10 as the FedVLS
# authors' code normalises ((125.3, 123.0, 113.9) / 255, (63.0, 62.1, 66.7) / 255); CIFAR-100's
# exact training-set statistics.
MNIST_STATS = (0.1307, 0.3081)
FMNIST_STATS = (0.2860, 0.3530)
CIFAR10_STATS = ((125.3 / 255, 123.0 / 255, 113.9 / 255), (63.0 / 255, 62.1 / 255, 66.7 / 255))
CIFAR100_STATS = ((0.5070751592371323, 0.48654887331495095, 0.4409178433670343),
                  (0.2673342858792401, 0.2564384629170883, 0.27615047132568404))
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
FMNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class Data:
    """A training pool and a test set in memory (``mean``/``std``: per-batch normalisation of uint8 images)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def load(name: str, data_dir: str | Path, pool_size: int = 0) -> Data:
    """Dataset ``name`` from ``data_dir`` (``pool_size`` > 0: the stratified subsample of the pool)."""
    root = Path(data_dir).expanduser()
    loaders = {"digits": _digits, "mnist": _mnist, "mnist10k": _mnist10k, "fmnist": _fmnist,
               "cifar10": lambda r: _cifar(r, "cifar10"), "cifar100": lambda r: _cifar(r, "cifar100")}
    if name not in loaders:
        raise NotCovered(f"the reference loop reads no dataset {name!r} (it reads {', '.join(loaders)})")
    data = loaders[name](root)
    if pool_size:
        keep = torch.from_numpy(pool_subsample(data.train_y.numpy(), pool_size))
        data = Data(data.train_x[keep], data.train_y[keep], data.test_x, data.test_y, data.num_classes,
                    data.mean, data.std)
    return data


def normalised(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W): x / 255, minus the mean, over the std (float32)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) / 255.0
    return ((x - mean) / std).unsqueeze(1).contiguous()


def normalise_batch(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32, ``(x / 255 - mean) / std`` per channel (ToTensor + Normalize)."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x.to(torch.float32) / 255.0 - m) / s


# --------------------------------------------------------------------------- the files


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not): magic 0x00 0x00 0x08 rank, the dimensions (big-endian
    uint32), then unsigned bytes."""
    raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * rank).reshape(shape)


def _idx(folder: Path, name: str) -> Path | None:
    for path in (folder / f"{name}.gz", folder / name):
        if path.is_file():
            return path
    return None


def _idx_set(folders: list[Path], names: tuple[str, ...], what: str) -> list[np.ndarray]:
    for folder in folders:
        paths = [_idx(folder, n) for n in names]
        if all(p is not None for p in paths):
            return [read_idx(p) for p in paths if p is not None]
    raise FileNotFoundError(f"{what}: no folder of {[str(f) for f in folders]} holds {', '.join(names)} (.gz or not)")


def _digits(root: Path) -> Data:
    """scikit-learn's 1,797 8x8 digits, pixels / 16; a stratified 80/20 split
    (``train_test_split(..., test_size=0.2, stratify=y, random_state=0)``); both normalised by
    the training pool's mean and std."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    pool, test = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0, shuffle=True)
    mean, std = float(x[pool].mean()), float(x[pool].std())
    xn = (x - mean) / std

    def tensor(idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(xn[idx], dtype=np.float32)).unsqueeze(1)

    return Data(tensor(pool), torch.from_numpy(y[pool]), tensor(test), torch.from_numpy(y[test]), 10)


def _mnist(root: Path) -> Data:
    x, y, tx, ty = _idx_set([root / "MNIST" / "raw"], IDX_NAMES, "mnist")
    return Data(normalised(x, *MNIST_STATS), torch.from_numpy(y.astype(np.int64)),
                normalised(tx, *MNIST_STATS), torch.from_numpy(ty.astype(np.int64)), 10)


def _mnist10k(root: Path) -> Data:
    """The official 10,000-image test split, re-split: 200 images of each class drawn for the
    test set (``default_rng(0).choice(..., replace=False)``, class by class), the rest is the
    pool; then the pool's and the test set's indices each shuffled by the same generator."""
    images, labels = _idx_set([root / "MNIST" / "raw"], IDX_NAMES[2:], "mnist10k")
    labels = labels.astype(np.int64)
    rng = np.random.default_rng(0)
    test = np.concatenate([rng.choice(np.flatnonzero(labels == c), size=200, replace=False) for c in range(10)])
    pool = np.setdiff1d(np.arange(labels.size), test)
    pool, test = rng.permutation(pool), rng.permutation(test)
    return Data(normalised(images[pool], *MNIST_STATS), torch.from_numpy(labels[pool]),
                normalised(images[test], *MNIST_STATS), torch.from_numpy(labels[test]), 10)


def _fmnist(root: Path) -> Data:
    x, y, tx, ty = _idx_set([root / "FashionMNIST" / "raw", root], IDX_NAMES, "fmnist")
    return Data(normalised(x, *FMNIST_STATS), torch.from_numpy(y.astype(np.int64)),
                normalised(tx, *FMNIST_STATS), torch.from_numpy(ty.astype(np.int64)), 10)


def _cifar(root: Path, which: str) -> Data:
    if which == "cifar10":
        folder, train_files, test_file, key, stats, classes = (
            root / "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels",
            CIFAR10_STATS, 10)
    else:
        folder, train_files, test_file, key, stats, classes = (
            root / "cifar-100-python", ["train"], "test", "fine_labels", CIFAR100_STATS, 100)

    def batches(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for name in names:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            xs.append(np.asarray(entry["data"], np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(entry[key], np.int64))
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    (x, y), (tx, ty) = batches(train_files), batches([test_file])
    return Data(x, y, tx, ty, classes, *stats)


def pool_subsample(labels: np.ndarray, size: int) -> np.ndarray:
    """``train-pool-size``: a stratified subsample (ascending indices). Class c keeps the
    largest-remainder rounding of size * n_c / n (remainders tied: the smaller class id first),
    namely the first of a permutation of its indices drawn from ``default_rng(0)``, class by class."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = [size * int(c) / labels.size for c in counts]
    keep = [int(np.floor(e)) for e in exact]
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(exact[i] - keep[i]), int(classes[i])))
    for i in by_remainder[: size - sum(keep)]:
        keep[i] += 1
    rng = np.random.default_rng(0)
    chosen = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, keep)]
    return np.sort(np.concatenate(chosen))


# --------------------------------------------------------------------------- partitions


def partition(labels: np.ndarray, clients: int, kind: str, seed: int, *, beta: float, shards: int,
              min_size: int) -> list[np.ndarray]:
    """Each client's pool indices (ascending), drawn from ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    if kind == "iid":
        parts = np.array_split(rng.permutation(labels.size), clients)
    elif kind == "shards":
        parts = shard_split(labels, clients, shards, rng)
    elif kind == "noniid-labeldir":
        parts = label_dir_split(labels, clients, shards, rng)
    elif kind == "dirichlet":
        parts = dirichlet_split(labels, clients, beta, min_size, rng)
    else:
        raise NotCovered(f"the reference loop has no partition {kind!r}")
    return [np.sort(np.asarray(p, np.int64)) for p in parts]


def shard_split(labels: np.ndarray, clients: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """FedAvg's pathological non-IID split (McMahan et al. 2017): the pool sorted by label (ties in
    pool order), cut into clients * s shards of near-equal size, s random shards per client
    (a permutation of the shards, read row by row)."""
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, clients * per_client)
    deal = rng.permutation(clients * per_client).reshape(clients, per_client)
    return [np.concatenate([pieces[s] for s in row]) for row in deal]


def label_dir_split(labels: np.ndarray, clients: int, per_client: int, rng: np.random.Generator,
                    redraws: int = 1000) -> list[np.ndarray]:
    """The FedVLS authors' ``noniid-labeldir`` split: each client takes s classes; class c (in
    order) goes to the first int(N / C * s) clients with a class slot left; its samples, in pool
    order, are cut among them in sizes drawn uniformly from [int(max(n_c / k / 10, 10 / C)),
    int(n_c)) for C <= 10 classes, [.., int(n_c / k)) beyond (k holders), the last holder taking
    the rest; a draw that leaves the last holder a negative count is drawn again."""
    num_classes = int(labels.max()) + 1
    holders_per_class = int(clients / num_classes * per_client)
    slots = [per_client] * clients
    out: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c in range(num_classes):
        holders = [j for j in range(clients) if slots[j] > 0][:holders_per_class]
        if not holders:
            raise ValueError(f"noniid-labeldir: no client has a slot for class {c}")
        members = np.flatnonzero(labels == c)
        k = len(holders)
        low = int(max(members.size / k / 10, 10 / num_classes))
        high = int(members.size) if num_classes <= 10 else int(members.size / k)
        for _ in range(redraws):
            sizes = [int(s) for s in rng.integers(low, max(high, low + 1), k - 1)] if k > 1 else []
            sizes.append(members.size - sum(sizes))
            if sizes[-1] >= 0:
                break
        else:
            raise ValueError(f"noniid-labeldir: class {c} could not be cut among {k} clients")
        bounds = np.cumsum([0, *sizes])
        for j, a, b in zip(holders, bounds[:-1], bounds[1:]):
            out[j].append(members[a:b])
            slots[j] -= 1
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in out]


def dirichlet_split(labels: np.ndarray, clients: int, beta: float, min_size: int, rng: np.random.Generator,
                    redraws: int = 1000) -> list[np.ndarray]:
    """NIID-Bench's Dirichlet split (Li et al., ICDE 2022, ``partition_data``): for each class
    present (ascending), shuffle its indices, draw proportions ~ Dir(beta, ..., beta), zero them
    for the clients already holding >= n / N samples, renormalise, and cut the shuffled indices
    at floor(cumsum * n_c); redraw the whole split until every client holds >= min_size. (A draw
    whose open proportions all underflow to 0 is a failed draw.)"""
    cap = labels.size / clients
    for _ in range(redraws):
        held: list[list[np.ndarray]] = [[] for _ in range(clients)]
        sizes = np.zeros(clients, np.int64)
        failed = False
        for c in np.unique(labels):
            members = np.flatnonzero(labels == c)
            rng.shuffle(members)
            share = rng.dirichlet(np.full(clients, float(beta)))
            share = np.where(sizes < cap, share, 0.0)
            if not share.sum() > 0:
                failed = True
                break
            share = share / share.sum()
            cuts = (np.cumsum(share) * members.size).astype(int)[:-1]
            for j, piece in enumerate(np.split(members, cuts)):
                held[j].append(piece)
                sizes[j] += piece.size
        if not failed and sizes.min() >= min_size:
            return [np.concatenate(h) for h in held]
    raise ValueError(f"dirichlet: no split with every client holding >= {min_size} samples")
