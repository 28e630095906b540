"""Tests for fedvls_flwr.data: offline, fast, no download.

Real data used: scikit-learn's bundled digits and the MNIST test split in
../shared/data (tests skip when it is absent).  CIFAR-10/100, full MNIST and
TinyImageNet are exercised on tiny folders in their real on-disk formats written here.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedvls_flwr.data import datasets as D
from tests.tiny_data import pickle_file, write_idx_dataset

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
HAVE_MNIST10K = (SHARED / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").is_file() and (
    SHARED / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
).is_file()
needs_mnist10k = pytest.mark.skipif(not HAVE_MNIST10K, reason=f"{SHARED}/MNIST/raw not present")
pytestmark = pytest.mark.usefixtures("fresh_dataset_cache")


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------
# general


def test_unknown_name_lists_datasets(tmp_path):
    with pytest.raises(ValueError) as ei:
        D.load_dataset("imagenet", tmp_path)
    for n in D.DATASETS:
        assert n in str(ei.value)


def test_bundle_is_frozen():
    b = D.load_dataset("digits", "/nonexistent-is-fine-for-digits")
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        b.num_classes = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------
# digits


def test_digits_shapes_dtypes_normalisation():
    from sklearn.datasets import load_digits

    b = D.load_dataset("digits", ".")
    assert b.name == "digits"
    assert b.train_x.dtype == torch.float32 and b.test_x.dtype == torch.float32
    assert b.train_y.dtype == torch.int64 and b.test_y.dtype == torch.int64
    assert b.input_shape == (1, 8, 8)
    assert b.train_x.shape[1:] == (1, 8, 8) and b.test_x.shape[1:] == (1, 8, 8)
    assert b.num_train + b.num_test == 1797
    assert b.num_test == 360 and b.num_train == 1437  # 20 % test, rounded up by sklearn
    assert b.num_classes == 10 and b.class_names == tuple(str(i) for i in range(10))
    assert b.mean is None and b.std is None
    # normalised with the pool's statistics
    assert abs(float(b.train_x.mean())) < 1e-5
    assert abs(float(b.train_x.std(unbiased=False)) - 1.0) < 1e-4
    assert abs(float(b.test_x.mean())) < 0.1
    # stratified: each class's share in test within one sample of 20 %
    total = np.bincount(load_digits().target, minlength=10)
    test_counts = b.test_class_counts()
    assert np.all(np.abs(test_counts - 0.2 * total) <= 1.0)
    assert np.array_equal(b.train_class_counts() + test_counts, total)
    # the pool and test images together are the 1,797 images (as a multiset)
    x = torch.cat([b.train_x, b.test_x]).reshape(-1, 64).numpy()
    pixels = load_digits().images.reshape(-1, 64)
    # undo the affine normalisation: values map back onto the integers 0..16
    lo, hi = x.min(), x.max()
    back = np.rint((x - lo) / (hi - lo) * 16).astype(np.int64)
    assert back.min() == 0 and back.max() == 16
    assert sorted(map(tuple, back)) == sorted(map(tuple, pixels.astype(np.int64)))


def test_digits_deterministic_and_cached():
    a = D.load_dataset("digits", ".")
    assert D.load_dataset("digits", ".") is a  # per-process cache
    D.clear_cache()
    b = D.load_dataset("digits", ".")
    assert b is not a
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, f), getattr(b, f))


# ---------------------------------------------------------------------------
# mnist10k (real data from ../shared/data)


def _read_raw_test_split():
    with gzip.open(SHARED / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 28 * 28)
    with gzip.open(SHARED / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    return images, labels


def _unnormalise_mnist(x: torch.Tensor) -> np.ndarray:
    u = np.rint((x.numpy() * D.MNIST_STD + D.MNIST_MEAN) * 255.0)
    assert np.abs((x.numpy() * D.MNIST_STD + D.MNIST_MEAN) * 255.0 - u).max() < 1e-3
    return u.astype(np.uint8).reshape(x.shape[0], -1)


@needs_mnist10k
def test_mnist10k_split():
    b = D.load_dataset("mnist10k", SHARED)
    assert b.num_train == 8000 and b.num_test == 2000
    assert b.train_x.shape == (8000, 1, 28, 28) and b.test_x.shape == (2000, 1, 28, 28)
    assert b.train_x.dtype == torch.float32 and b.train_y.dtype == torch.int64
    assert b.input_shape == (1, 28, 28) and b.num_classes == 10
    assert b.mean is None and b.std is None
    assert np.array_equal(b.test_class_counts(), np.full(10, 200))
    src_counts = np.array([980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert np.array_equal(b.train_class_counts(), src_counts - 200)
    # normalisation (x/255 - 0.1307) / 0.3081
    assert float(b.train_x.min()) == pytest.approx(-0.1307 / 0.3081, abs=1e-6)
    assert float(b.train_x.max()) == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-5)
    # pool + test are disjoint and together the 10,000 (image, label) pairs: compare multisets
    images, labels = _read_raw_test_split()
    got = np.concatenate([_unnormalise_mnist(b.train_x), _unnormalise_mnist(b.test_x)])
    got_y = torch.cat([b.train_y, b.test_y]).numpy()
    key = lambda im, y: [row.tobytes() + bytes([lab]) for row, lab in zip(im, y)]  # noqa: E731
    assert sorted(key(got, got_y)) == sorted(key(images, labels))


@needs_mnist10k
def test_mnist10k_deterministic_and_gunzipped_files_accepted(tmp_path):
    a = D.load_dataset("mnist10k", SHARED)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for n in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(SHARED / "MNIST" / "raw" / (n + ".gz")) as src, open(raw / n, "wb") as dst:
            shutil.copyfileobj(src, dst)
    b = D.load_dataset("mnist10k", tmp_path)  # un-gzipped copy, fresh load
    assert b is not a
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, f), getattr(b, f))


@needs_mnist10k
def test_mnist10k_cache_key_resolves_path(monkeypatch):
    a = D.load_dataset("mnist10k", SHARED)
    monkeypatch.chdir(SHARED.parent)
    assert D.load_dataset("mnist10k", "data") is a
    assert D.load_dataset("mnist10k", Path("data") / ".." / "data") is a


# ---------------------------------------------------------------------------
# missing data: clear errors


@pytest.mark.parametrize(
    "name, expected",
    [
        ("mnist", ["train-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "download=true", "mnist10k"]),
        ("mnist10k", ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "MNIST/raw", "download=true"]),
        ("cifar10", ["data_batch_1", "test_batch", "batches.meta", "download=true", "cifar-10-python.tar.gz"]),
        ("cifar100", ["cifar-100-python", "train", "meta", "download=true"]),
        ("tinyimagenet", ["wnids.txt", D.TINYIMAGENET_URL, "unzip"]),
    ],
)
def test_missing_dataset_error(tmp_path, name, expected):
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset(name, tmp_path)
    msg = str(ei.value)
    assert isinstance(ei.value, FileNotFoundError)
    assert str(tmp_path) in msg
    for e in expected:
        assert e in msg, (e, msg)
    assert not any(tmp_path.iterdir())  # nothing written, nothing fetched


def test_mnist_partial_folder_names_missing_files(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(b"x")
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"x")
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset("mnist", tmp_path)
    msg = str(ei.value)
    assert "train-images-idx3-ubyte" in msg and "train-labels-idx1-ubyte" in msg
    listed = msg.split(" for ", 1)[1].split(" (or", 1)[0]
    assert "train-images-idx3-ubyte" in listed and "t10k" not in listed


def test_failed_load_is_not_cached(tmp_path):
    with pytest.raises(D.DatasetNotFoundError):
        D.load_dataset("mnist", tmp_path)
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=30, n_test=20)
    assert D.load_dataset("mnist", tmp_path).num_train == 30


# ---------------------------------------------------------------------------
# full MNIST through torchvision's loader, on a tiny IDX folder


def test_mnist_through_torchvision(tmp_path):
    src = write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=50, n_test=20)
    b = D.load_dataset("mnist", tmp_path)  # .gz only: decompressed in place, then torchvision reads
    assert (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    assert b.train_x.shape == (50, 1, 28, 28) and b.test_x.shape == (20, 1, 28, 28)
    assert b.train_x.dtype == torch.float32 and b.train_y.dtype == torch.int64
    assert b.mean is None and b.input_shape == (1, 28, 28)
    assert np.array_equal(_unnormalise_mnist(b.train_x), src["train"][0].reshape(50, -1))
    assert np.array_equal(_unnormalise_mnist(b.test_x), src["t10k"][0].reshape(20, -1))
    assert np.array_equal(b.train_y.numpy(), src["train"][1])


# ---------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 through torchvision's loader, on tiny folders in the real format


def _write_fake_cifar10(root: Path, per_batch: int = 6, n_test: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    xs, ys = [], []
    for i in range(1, 6):
        x = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        pickle_file(folder / f"data_batch_{i}", {
            "batch_label": f"training batch {i} of 5", "labels": y, "data": x,
            "filenames": [f"img_{i}_{j}.png" for j in range(per_batch)],
        })
        xs.append(x)
        ys += y
    xt = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    yt = [int(v) for v in rng.integers(0, 10, size=n_test)]
    pickle_file(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": yt, "data": xt,
                                    "filenames": [f"t_{j}.png" for j in range(n_test)]})
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    pickle_file(folder / "batches.meta", {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072})
    return np.concatenate(xs), np.array(ys), xt, np.array(yt), names


def _write_fake_cifar100(root: Path, n_train: int = 12, n_test: int = 6, seed: int = 1):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size=n)]
        pickle_file(folder / split, {"filenames": [f"{split}_{j}.png" for j in range(n)], "batch_label": split,
                                 "fine_labels": fine, "coarse_labels": [f // 5 for f in fine], "data": x})
        out += [x, np.array(fine)]
    names = [f"class_{i:02d}" for i in range(100)]
    pickle_file(folder / "meta", {"fine_label_names": names, "coarse_label_names": [f"super_{i}" for i in range(20)]})
    return (*out, names)


def _accept_generated_files(monkeypatch, cls, folder: Path) -> None:
    """Point torchvision's expected md5 sums at the generated files.

    torchvision's CIFAR classes verify every batch file and the meta file against md5
    sums held as class attributes (``train_list``, ``test_list``, ``meta``).  The real
    loader runs unchanged - including that verification - against these sums.
    """
    monkeypatch.setattr(cls, "train_list", [[n, _md5(folder / n)] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, _md5(folder / n)] for n, _ in cls.test_list])
    meta = dict(cls.meta)
    meta["md5"] = _md5(folder / meta["filename"])
    monkeypatch.setattr(cls, "meta", meta)


def test_cifar10_through_torchvision(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    x, y, xt, yt, names = _write_fake_cifar10(tmp_path)
    _accept_generated_files(monkeypatch, tvd.CIFAR10, tmp_path / "cifar-10-batches-py")
    b = D.load_dataset("cifar10", tmp_path)
    assert b.train_x.dtype == torch.uint8 and b.train_x.shape == (30, 3, 32, 32)
    assert b.test_x.shape == (8, 3, 32, 32) and b.input_shape == (3, 32, 32)
    assert b.train_y.dtype == torch.int64
    # CIFAR rows are channel-major (R plane, G plane, B plane): exactly NCHW
    assert np.array_equal(b.train_x.numpy(), x.reshape(-1, 3, 32, 32))
    assert np.array_equal(b.test_x.numpy(), xt.reshape(-1, 3, 32, 32))
    assert np.array_equal(b.train_y.numpy(), y) and np.array_equal(b.test_y.numpy(), yt)
    assert b.train_x.is_contiguous()
    assert b.num_classes == 10 and b.class_names == tuple(names)
    assert b.mean == pytest.approx((0.4914, 0.4824, 0.4467), abs=1e-3)
    assert b.std == pytest.approx((0.2471, 0.2435, 0.2616), abs=1e-3)


def test_cifar100_through_torchvision(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    x, y, xt, yt, names = _write_fake_cifar100(tmp_path)
    _accept_generated_files(monkeypatch, tvd.CIFAR100, tmp_path / "cifar-100-python")
    b = D.load_dataset("cifar100", tmp_path)
    assert b.train_x.shape == (12, 3, 32, 32) and b.test_x.shape == (6, 3, 32, 32)
    assert b.train_x.dtype == torch.uint8
    assert np.array_equal(b.train_x.numpy(), x.reshape(-1, 3, 32, 32))
    assert np.array_equal(b.train_y.numpy(), y) and np.array_equal(b.test_y.numpy(), yt)
    assert b.num_classes == 100 and b.class_names == tuple(names)
    assert b.mean == pytest.approx((0.5071, 0.4865, 0.4409), abs=1e-3)
    assert b.std == pytest.approx((0.2673, 0.2564, 0.2762), abs=1e-3)


def test_cifar10_integrity_check_is_real(tmp_path):
    """Without the test's md5 override, torchvision rejects the generated files."""
    _write_fake_cifar10(tmp_path)
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset("cifar10", tmp_path)
    assert "md5" in str(ei.value) and "corrupted" in str(ei.value)


# ---------------------------------------------------------------------------
# TinyImageNet on a tiny folder in the real layout


WNIDS = ["n01443537", "n01629819", "n01641577"]


def _save_jpeg(path: Path, rng, gray: bool = False, size: int = 64) -> None:
    from PIL import Image

    if gray:
        Image.fromarray(rng.integers(0, 256, size=(size, size), dtype=np.uint8), mode="L").save(path, "JPEG")
    else:
        Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8), mode="RGB").save(path, "JPEG")


def _write_fake_tiny(root: Path, per_class: int = 4, val_per_class: int = 2, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "test" / "images").mkdir(parents=True)  # unlabelled split, ignored
    (base / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    (base / "words.txt").write_text(
        "n01443537\tgoldfish, Carassius auratus\nn01629819\tEuropean fire salamander, Salamandra salamandra\n"
        "n01641577\tbullfrog, Rana catesbeiana\nn99999999\tunused\n"
    )
    for w in WNIDS:
        d = base / "train" / w / "images"
        d.mkdir(parents=True)
        boxes = []
        for j in range(per_class):
            _save_jpeg(d / f"{w}_{j}.JPEG", rng, gray=(j == 1))  # one grayscale image per class
            boxes.append(f"{w}_{j}.JPEG\t0\t0\t63\t63")
        (base / "train" / w / f"{w}_boxes.txt").write_text("\n".join(boxes) + "\n")
    lines = []
    k = 0
    for _ in range(val_per_class):
        for w in reversed(WNIDS):
            _save_jpeg(base / "val" / "images" / f"val_{k}.JPEG", rng)
            lines.append(f"val_{k}.JPEG\t{w}\t0\t0\t63\t63")
            k += 1
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    _save_jpeg(base / "test" / "images" / "test_0.JPEG", rng)
    return base


def _pil_rgb(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def test_tinyimagenet_loads_real_layout(tmp_path):
    base = _write_fake_tiny(tmp_path)
    b = D.load_dataset("tinyimagenet", tmp_path)
    assert b.train_x.dtype == torch.uint8 and b.train_x.shape == (12, 3, 64, 64)
    assert b.test_x.shape == (6, 3, 64, 64) and b.input_shape == (3, 64, 64)
    assert b.train_y.dtype == torch.int64 and b.num_classes == 3
    assert np.array_equal(b.train_class_counts(), [4, 4, 4])
    assert np.array_equal(b.test_class_counts(), [2, 2, 2])
    assert b.class_names == ("goldfish", "European fire salamander", "bullfrog")
    assert b.mean is not None and len(b.mean) == 3 and len(b.std) == 3
    # train: sorted by class then file name; pixels equal PIL's own decode
    assert b.train_y.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert np.array_equal(b.train_x[5].numpy(), _pil_rgb(base / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_1.JPEG"))
    g = b.train_x[1].numpy()  # a grayscale JPEG, expanded to 3 equal channels
    assert np.array_equal(g[0], g[1]) and np.array_equal(g[1], g[2])
    # val read in place with labels from val_annotations.txt (sorted by file name)
    ann = dict(line.split("\t")[:2] for line in (base / "val" / "val_annotations.txt").read_text().splitlines())
    for i, fname in enumerate(sorted(ann)):
        assert b.test_y[i].item() == WNIDS.index(ann[fname])
        assert np.array_equal(b.test_x[i].numpy(), _pil_rgb(base / "val" / "images" / fname))
    assert (base / D.TINYIMAGENET_CACHE_NAME).is_file()


def test_tinyimagenet_cache_reused_and_invalidated(tmp_path, monkeypatch):
    base = _write_fake_tiny(tmp_path)
    cache = base / D.TINYIMAGENET_CACHE_NAME
    from fedvls_flwr.data import tinyimagenet

    real_decode = tinyimagenet._decode_image
    calls = []

    def counting_decode(path):
        calls.append(Path(path).name)
        return real_decode(path)

    monkeypatch.setattr(tinyimagenet, "_decode_image", counting_decode)
    first = D.load_dataset("tinyimagenet", tmp_path)
    assert len(calls) == 18 and cache.is_file()

    # same process: the bundle itself is cached
    assert D.load_dataset("tinyimagenet", tmp_path) is first

    # new "process": the .npz is reused, no JPEG decoded
    D.clear_cache()
    calls.clear()
    stamp = cache.stat().st_mtime_ns
    second = D.load_dataset("tinyimagenet", tmp_path)
    assert calls == []
    assert cache.stat().st_mtime_ns == stamp
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, f), getattr(second, f))

    # a new training image changes the file list: cache rebuilt
    _save_jpeg(base / "train" / WNIDS[2] / "images" / f"{WNIDS[2]}_9.JPEG", np.random.default_rng(5))
    D.clear_cache()
    calls.clear()
    third = D.load_dataset("tinyimagenet", tmp_path)
    assert len(calls) == 19 and third.num_train == 13
    assert np.array_equal(third.train_class_counts(), [4, 4, 5])

    # reused again after the rebuild
    D.clear_cache()
    calls.clear()
    assert D.load_dataset("tinyimagenet", tmp_path).num_train == 13 and calls == []

    # a changed val annotation (relabelling) also invalidates it
    ann = base / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text().replace(WNIDS[0], WNIDS[1]))
    D.clear_cache()
    calls.clear()
    fourth = D.load_dataset("tinyimagenet", tmp_path)
    assert np.array_equal(fourth.test_class_counts(), [0, 4, 2])
    # removing an image as well
    (base / "val" / "images" / "val_0.JPEG").unlink()
    ann.write_text("\n".join(line for line in ann.read_text().splitlines() if not line.startswith("val_0.")) + "\n")
    D.clear_cache()
    calls.clear()
    assert D.load_dataset("tinyimagenet", tmp_path).num_test == 5 and len(calls) == 18

    # a corrupt cache file is rebuilt, not trusted
    cache.write_bytes(b"not an npz")
    D.clear_cache()
    calls.clear()
    assert D.load_dataset("tinyimagenet", tmp_path).num_test == 5 and len(calls) == 18


def test_tinyimagenet_missing_class_folder(tmp_path):
    base = _write_fake_tiny(tmp_path)
    shutil.rmtree(base / "train" / WNIDS[1])
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset("tinyimagenet", tmp_path)
    assert WNIDS[1] in str(ei.value) and D.TINYIMAGENET_URL in str(ei.value)
