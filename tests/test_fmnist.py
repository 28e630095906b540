"""Fashion-MNIST through the real loader on generated IDX files (no full dataset needed),
the training-pool subsample, and FedLC's CNN."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from fedvls_flwr.config.run_config import ConfigError, parse_run_config
from fedvls_flwr.data import datasets as D
from fedvls_flwr.models import build_model, count_parameters, default_model
from tests.tiny_data import idx_bytes, write_idx_dataset

pytestmark = pytest.mark.usefixtures("fresh_dataset_cache")


def _unnormalise(x: torch.Tensor) -> np.ndarray:
    return np.rint((x.numpy() * D.FMNIST_STD + D.FMNIST_MEAN) * 255.0).astype(np.uint8).reshape(x.shape[0], 28, 28)


@pytest.mark.parametrize("layout", ["torchvision", "flat-gz", "flat-raw"])
def test_fmnist_loads_idx_files_in_either_layout(tmp_path, layout):
    folder = tmp_path / "FashionMNIST" / "raw" if layout == "torchvision" else tmp_path
    src = write_idx_dataset(folder, gz=layout != "flat-raw")
    b = D.load_dataset("fmnist", tmp_path)
    assert b.name == "fmnist" and b.num_classes == 10 and b.input_shape == (1, 28, 28)
    assert b.train_x.shape == (60, 1, 28, 28) and b.test_x.shape == (20, 1, 28, 28)
    assert b.train_x.dtype == torch.float32 and b.train_y.dtype == torch.int64
    assert b.class_names[0] == "T-shirt/top" and b.class_names[9] == "Ankle boot"
    # normalised with Fashion-MNIST's own statistics, exactly invertible
    assert np.array_equal(_unnormalise(b.train_x), src["train"][0])
    assert np.array_equal(_unnormalise(b.test_x), src["t10k"][0])
    assert np.array_equal(b.train_y.numpy(), src["train"][1])
    assert D.image_format("fmnist").mean == (D.FMNIST_MEAN,)


def test_fmnist_missing_says_both_ways_to_get_it(tmp_path):
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset("fmnist", tmp_path)
    msg = str(ei.value)
    for fragment in ("download=true", "apt-get install dataset-fashion-mnist", D.FMNIST_DEBIAN_DIR,
                     str(tmp_path / "FashionMNIST" / "raw"), "train-images-idx3-ubyte"):
        assert fragment in msg, fragment
    assert not any(tmp_path.iterdir())


def test_fmnist_rejects_files_that_are_not_fashion_mnist(tmp_path):
    write_idx_dataset(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(np.full(20, 12, np.uint8)))
    with pytest.raises(D.DatasetNotFoundError, match="classes 0-9"):
        D.load_dataset("fmnist", tmp_path)


@pytest.fixture
def http_mirror(tmp_path):
    """A folder served over HTTP on 127.0.0.1 (stands in for the dataset's mirror)."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_fmnist_download_goes_through_torchvision(tmp_path, monkeypatch, http_mirror):
    """download=true fetches with torchvision's FashionMNIST (md5-checked) into the
    torchvision layout; a local HTTP mirror of generated files stands in for the internet."""
    from torchvision.datasets import FashionMNIST

    mirror, url = http_mirror
    src = write_idx_dataset(mirror)
    resources = [(f"{n}.gz", hashlib.md5((mirror / f"{n}.gz").read_bytes()).hexdigest()) for n in D.MNIST_FILES]
    monkeypatch.setattr(FashionMNIST, "mirrors", [url])
    monkeypatch.setattr(FashionMNIST, "resources", resources)
    root = tmp_path / "data"
    with pytest.raises(D.DatasetNotFoundError):
        D.load_dataset("fmnist", root)  # download=false: nothing fetched
    b = D.load_dataset("fmnist", root, download=True)
    assert (root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte.gz").is_file()
    assert np.array_equal(_unnormalise(b.test_x), src["t10k"][0])


def test_fmnist_download_failure_names_the_offline_way(tmp_path, monkeypatch, http_mirror):
    from torchvision.datasets import FashionMNIST

    monkeypatch.setattr(FashionMNIST, "mirrors", [http_mirror[1] + "missing/"])  # 404s
    with pytest.raises(D.DatasetNotFoundError) as ei:
        D.load_dataset("fmnist", tmp_path / "data", download=True)
    assert "download" in str(ei.value) and "apt-get install dataset-fashion-mnist" in str(ei.value)


def test_fmnist_debian_copy_when_installed():
    """The real dataset, where the Debian package is installed (CI installs it)."""
    if not Path(D.FMNIST_DEBIAN_DIR, "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("dataset-fashion-mnist is not installed")
    b = D.load_dataset("fmnist", D.FMNIST_DEBIAN_DIR)
    assert b.num_train == 60_000 and b.num_test == 10_000
    assert np.array_equal(b.train_class_counts(), np.full(10, 6000))
    assert np.array_equal(b.test_class_counts(), np.full(10, 1000))
    # its own statistics: normalised training pixels have mean ~0 and std ~1
    assert abs(float(b.train_x.mean())) < 1e-3 and abs(float(b.train_x.std()) - 1) < 1e-3


# --------------------------------------------------------------------------- pool subsample


def test_subsample_pool_is_stratified_fixed_and_nested():
    labels = np.repeat(np.arange(4), [50, 30, 15, 5])
    small, large = D.subsample_pool(labels, 20), D.subsample_pool(labels, 60)
    assert small.size == 20 and large.size == 60
    assert np.array_equal(np.bincount(labels[small], minlength=4), [10, 6, 3, 1])
    assert np.array_equal(np.bincount(labels[large], minlength=4), [30, 18, 9, 3])
    assert np.array_equal(small, D.subsample_pool(labels, 20))  # fixed seed
    assert set(small) <= set(large)  # nested
    assert np.all(np.diff(small) > 0)
    # largest remainder: sizes that do not divide evenly still sum exactly
    odd = D.subsample_pool(labels, 7)
    assert odd.size == 7 and np.bincount(labels[odd], minlength=4).tolist() == [4, 2, 1, 0]
    with pytest.raises(ValueError, match="between 1 and the pool's 100"):
        D.subsample_pool(labels, 101)


def test_train_pool_size_subsamples_the_pool_only(tmp_path):
    write_idx_dataset(tmp_path, n_train=100, n_test=20)
    full = D.load_dataset("fmnist", tmp_path)
    sub = D.load_dataset("fmnist", tmp_path, pool_size=30)
    assert sub.num_train == 30 and sub.num_test == 20
    assert np.array_equal(sub.train_class_counts(), np.full(10, 3))
    idx = D.subsample_pool(full.train_y.numpy(), 30)
    assert torch.equal(sub.train_x, full.train_x[idx]) and sub.test_x is full.test_x
    with pytest.raises(ValueError, match="train-pool-size"):
        D.load_dataset("fmnist", tmp_path, pool_size=500)


def test_train_pool_size_config():
    assert parse_run_config({"train-pool-size": 3000}).train_pool_size == 3000
    with pytest.raises(ConfigError, match="train-pool-size"):
        parse_run_config({"train-pool-size": -1})
    with pytest.raises(ConfigError, match="synthetic"):
        parse_run_config({"train-pool-size": 10, "dataset": "synthetic"})


# --------------------------------------------------------------------------- FedLC's CNN


def test_cnn_is_the_fedlc_papers_network():
    model = build_model("cnn", (1, 28, 28), 10)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(10, 1, 5, 5), (10,), (20, 10, 5, 5), (20,), (50, 320), (50,), (10, 50), (10,)]
    assert count_parameters(model) == 21_840
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert default_model("fmnist") == "mlp"  # the paper's MNIST protocol uses the MLP
    rgb = build_model("cnn", (3, 32, 32), 10)
    assert rgb(torch.zeros(2, 3, 32, 32)).shape == (2, 10) and rgb.fc1.in_features == 500
    with pytest.raises(ValueError, match="16x16"):
        build_model("cnn", (1, 8, 8), 10)
