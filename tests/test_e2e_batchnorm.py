"""Real `flwr run` simulations of the two ways small batches break BatchNorm, 3 rounds each:

* ``resnet18-imagenet`` on Fashion-MNIST-format data, 2 clients x 65 images, batch 64 (a
  last batch of one sample at the model's 1x1 map fails BatchNorm's training step);
* ``mobilenetv2`` on ``digits`` (8x8: a 1x1 map), 4 Dirichlet clients, batch 32: the
  client of 290 samples would have a last batch of 2, whose statistics blow the global
  model up after round 1.

Both must complete with every reply accepted, and the ServerApp must have warned about the
1x1 map (model and input size named) before the first round.
"""

import json
import math

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import LocalSuperLink

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


def test_batchnorm_models_with_short_last_batches_train_three_rounds(tmp_path):
    from tests.tiny_data import write_idx_dataset

    data_dir, out = tmp_path / "data", tmp_path / "runs"
    write_idx_dataset(data_dir / "FashionMNIST" / "raw", n_train=130, n_test=30)
    outcomes = {}
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        for name, (config, nodes, _) in RUNS.items():
            run_config = {
                **config, "data-dir": str(data_dir), "num-server-rounds": 3, "local-epochs": 1,
                "output-dir": str(out), "run-name": name,
            }
            federation = {"num-supernodes": nodes, "client-resources-num-cpus": 1}
            outcomes[name] = link.wait(link.submit(run_config=run_config, federation_config=federation), timeout=300)
        processes = list(link.processes)
    assert all(p.poll() is not None for p in processes)

    for name, (_, nodes, warning) in RUNS.items():
        outcome = outcomes[name]
        assert outcome.completed, f"{name}: run ended {outcome.status}\n{outcome.log[-4000:]}"
        assert f"model '{name}' {warning}" in outcome.log
        rounds = read_rounds(out / name)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3], name
        for r in rounds[1:]:
            assert r["clients_sampled"] == r["clients_accepted"] == nodes, (name, r["round"], r["failures"])
            assert r["failures"] == [], (name, r["round"], r["failures"])
            assert math.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0, (name, r)
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["model"] == name
