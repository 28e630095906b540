"""Simulations of the two ways small batches break BatchNorm, 3 rounds each, on the in-process
engine (the app's own ServerApp and ClientApp; the ServerApp's log is this process's):

* ``resnet18-imagenet`` on Fashion-MNIST-format data, 2 clients x 65 images, batch 64 (a
  last batch of one sample at the model's 1x1 map fails BatchNorm's training step);
* ``mobilenetv2`` on ``digits`` (8x8: a 1x1 map), 4 Dirichlet clients, batch 32: the
  client of 290 samples would have a last batch of 2, whose statistics blow the global
  model up after round 1.

Both must complete with every reply accepted, and the ServerApp must have warned about the
1x1 map (model and input size named) before the first round.
"""

import json
import logging
import math

import pytest

from fedvls_flwr.app.results import read_rounds
from tests.runs import run_here

pytestmark = pytest.mark.e2e

RUNS = {
    "resnet18-imagenet": (
        {"dataset": "fmnist", "model": "resnet18-imagenet", "train-pool-size": 130, "partition": "iid"},
        2, "reduces 1x28x28 inputs to a 1x1 feature map",
    ),
    "mobilenetv2": (
        {"dataset": "digits", "model": "mobilenetv2", "batch-size": 32},  # app defaults: Dirichlet 0.05
        4, "reduces 1x8x8 inputs to a 1x1 feature map",
    ),
}


def test_batchnorm_models_with_short_last_batches_train_three_rounds(tmp_path, caplog):
    from tests.tiny_data import write_idx_dataset

    data_dir, out = tmp_path / "data", tmp_path / "runs"
    write_idx_dataset(data_dir / "FashionMNIST" / "raw", n_train=130, n_test=30)
    for name, (config, nodes, warning) in RUNS.items():
        run_config = {
            **config, "data-dir": str(data_dir), "num-server-rounds": 3, "local-epochs": 1,
            "output-dir": str(out), "run-name": name,
        }
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="flwr"):
            run_here(run_config, nodes)
        assert f"model '{name}' {warning}" in caplog.text, caplog.text[-4000:]
        rounds = read_rounds(out / name)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3], name
        for r in rounds[1:]:
            assert r["clients_sampled"] == r["clients_accepted"] == nodes, (name, r["round"], r["failures"])
            assert r["failures"] == [], (name, r["round"], r["failures"])
            assert math.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0, (name, r)
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["model"] == name
