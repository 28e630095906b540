"""Tiny datasets in their real on-disk formats, written for a test and read by the project's
real loaders: IDX files (MNIST, Fashion-MNIST), CIFAR-10's python pickles, and image folders
of scikit-learn's digits (a node's own data)."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np

#: The ten digit classes as a node config's ``classes`` list.
DIGITS = ",".join(str(i) for i in range(10))


def idx_bytes(arr: np.ndarray) -> bytes:
    """``arr`` (uint8) as an IDX file: magic (0x08 = unsigned byte, then the rank), shape, data."""
    return struct.pack(">I", 0x0800 | arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape) + arr.tobytes()


def write_idx_dataset(folder: Path, n_train: int = 60, n_test: int = 20, gz: bool = True,
                      seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The four IDX files of MNIST and Fashion-MNIST (both use the same names), gzipped like
    torchvision's downloads (or not, ``gz=False``): random 28x28 images, labels 0..9 in turn.
    Returns {"train" | "t10k": (images, labels)}."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        for kind, arr in (("images-idx3", x), ("labels-idx1", y)):
            name = f"{split}-{kind}-ubyte"
            if gz:
                with gzip.open(folder / f"{name}.gz", "wb") as f:
                    f.write(idx_bytes(arr))
            else:
                (folder / name).write_bytes(idx_bytes(arr))
        out[split] = (x, y)
    return out


def pickle_file(path: Path, obj: object) -> str:
    """``obj`` pickled as CIFAR's python batches are (protocol 2); returns the file's md5."""
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_tiny_cifar10(root: Path, per_batch: int = 24, n_test: int = 40, seed: int = 0) -> dict[str, str]:
    """Five training batches, a test batch and the meta file; returns {file name: md5}."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    sums = {}

    def batch(n, label):
        labels = [int(v) for v in rng.integers(0, 10, n)]
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        return {"batch_label": label, "labels": labels, "data": data, "filenames": [f"img_{i}.png" for i in range(n)]}

    for i in range(1, 6):
        sums[f"data_batch_{i}"] = pickle_file(folder / f"data_batch_{i}", batch(per_batch, f"training batch {i} of 5"))
    sums["test_batch"] = pickle_file(folder / "test_batch", batch(n_test, "testing batch 1 of 1"))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    sums["batches.meta"] = pickle_file(
        folder / "batches.meta", {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072}
    )
    return sums


def write_digit_folder(root: Path, classes: list[int], per_class: int = 25) -> None:
    """A node's image folder: the first ``per_class`` of scikit-learn's digits of each class as
    8-bit grayscale PNGs, ``root/<class>/<k>.png``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for c in classes:
        (root / str(c)).mkdir(parents=True, exist_ok=True)
        for k, img in enumerate(d.images[d.target == c][:per_class]):
            Image.fromarray(np.rint(img / 16 * 255).astype(np.uint8), mode="L").save(root / str(c) / f"{k}.png")
