"""Simulations of every model of the zoo, 3 rounds each, on generated data in the CIFAR-10
and Fashion-MNIST formats (augmentation on for CIFAR), on the in-process engine (the app's
own ServerApp and ClientApp in this process; the ServerApp's log is this process's).

The data are a tiny folder in the real CIFAR-10 python format, written here and read by
the project's real loader (torchvision's ``CIFAR10`` class). torchvision checks every
file against the md5 sums of the real release, which generated files cannot match, so the
test points the expected md5 sums at the generated files (a monkeypatch of the class's
attributes, as tests/test_data.py does; the apps run in this process). The integrity check
itself still runs; the project code is unchanged.
"""

import json
import logging
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from tests.runs import run_here
from tests.tiny_data import write_tiny_cifar10

pytestmark = pytest.mark.e2e


def _load_final_into_fresh_model(run_dir: Path, model: str, input_shape, num_classes: int = 10) -> None:
    """The saved global state_dict must load, strictly, into a freshly built model."""
    import torch

    from fedvls_flwr.app.results import MODEL_FILE, load_arrays
    from fedvls_flwr.models import build_model

    state = {k: torch.from_numpy(v) for k, v in load_arrays(run_dir / MODEL_FILE).items()}
    fresh = build_model(model, input_shape, num_classes)
    fresh.load_state_dict(state, strict=True)
    for key, value in fresh.state_dict().items():  # shapes and dtypes as the model's own
        assert state[key].shape == value.shape and state[key].dtype == value.dtype, key


# Every model of the zoo, each on data in a format it is meant for (all of them fit CIFAR's 3x32x32).
ZOO = [
    ("mobilenetv2", "cifar10"),
    ("resnet18", "cifar10"),
    ("resnet18-imagenet", "cifar10"),
    ("resnet32", "cifar10"),
    ("logreg", "cifar10"),
    ("mlp", "fmnist"),
    ("cnn", "fmnist"),
]


def test_every_model_trains_three_rounds_with_every_reply_accepted(tmp_path, monkeypatch, caplog):
    """Round 2 is where state that crossed a round (the aggregated BatchNorm buffers) is
    checked against the clients' replies; a one-round run cannot see that bug."""
    import torchvision.datasets as tvd

    from tests.tiny_data import write_idx_dataset

    data_dir, out = tmp_path / "data", tmp_path / "runs"
    sums = write_tiny_cifar10(data_dir)
    write_idx_dataset(data_dir / "FashionMNIST" / "raw", n_train=80, n_test=30)
    cifar = tvd.CIFAR10
    monkeypatch.setattr(cifar, "train_list", [[n, sums[n]] for n, _ in cifar.train_list])
    monkeypatch.setattr(cifar, "test_list", [[n, sums[n]] for n, _ in cifar.test_list])
    monkeypatch.setattr(cifar, "meta", {**cifar.meta, "md5": sums[cifar.meta["filename"]]})
    base = {
        "data-dir": str(data_dir), "method": "fedvls", "partition": "dirichlet", "dirichlet-beta": 0.5,
        "num-server-rounds": 3, "local-epochs": 1, "batch-size": 16, "eval-batch-size": 64,
        "augment": True, "amp": True,  # amp is accepted on the CPU and ignored there
        "output-dir": str(out),
    }
    logs = {}
    for model, dataset in ZOO:
        run_config = {**base, "model": model, "dataset": dataset, "run-name": model}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="flwr"):
            run_here(run_config, 2)
        logs[model] = caplog.text

    for model, dataset in ZOO:
        run_dir = out / model
        rounds = read_rounds(run_dir)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3], model
        for r in rounds[1:]:
            assert r["clients_sampled"] == r["clients_accepted"] == 2, (model, r["round"], r["failures"])
            assert r["failures"] == [] and r["clients_rejected"] == 0, (model, r["round"], r["failures"])
            assert 0.0 <= r["accuracy"] <= 1.0 and len(r["per_class_accuracy"]) == 10
            assert {"train-loss", "train-cal", "train-dis", "train-logit"} <= set(r["train"])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["model"] == model and summary["status"] == "completed"
        shape = (3, 32, 32) if dataset == "cifar10" else (1, 28, 28)
        _load_final_into_fresh_model(run_dir, model, shape)

    summary = json.loads((out / "mobilenetv2" / "summary.json").read_text())
    assert summary["config"]["dataset"] == "cifar10" and summary["config"]["augment"] is True
    assert summary["num_train_pool"] == 5 * 24 and summary["num_test"] == 40
    assert (out / "mobilenetv2" / "model_final.npz").stat().st_size > 1_000_000  # ~2.3M parameters
    assert "round 3/3: accuracy" in logs["mobilenetv2"]
