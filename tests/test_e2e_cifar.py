"""Real `flwr run` simulations of every model of the zoo, 3 rounds each, on generated data
in the CIFAR-10 and Fashion-MNIST formats (augmentation on for CIFAR).

The data are a tiny folder in the real CIFAR-10 python format, written here and read by
the project's real loader (torchvision's ``CIFAR10`` class). torchvision checks every
file against the md5 sums of the real release, which generated files cannot match, and
the ServerApp/ClientApps run in processes that Flower starts (a monkeypatch here does
not reach them). So the test, and only the test, puts a ``sitecustomize.py`` on the
``PYTHONPATH`` of the SuperLink it starts (inherited by every process below it; Flower's
Ray backend forwards ``PYTHONPATH`` to its actors): when ``torchvision.datasets.cifar``
is imported it replaces the expected md5 sums with those of the generated files, the same
substitution tests/test_data.py makes in-process. The integrity check itself still runs.
The project code is unchanged; without the environment variable the hook does nothing.
"""

import json
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.tiny_data import MD5_ENV, SITECUSTOMIZE, write_tiny_cifar10

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


def test_every_model_trains_three_rounds_with_every_reply_accepted(tmp_path):
    """Round 2 is where state that crossed a round (the aggregated BatchNorm buffers) is
    checked against the clients' replies; a one-round run cannot see that bug."""
    from tests.tiny_data import write_idx_dataset

    data_dir, out = tmp_path / "data", tmp_path / "runs"
    sums = write_tiny_cifar10(data_dir)
    write_idx_dataset(data_dir / "FashionMNIST" / "raw", n_train=80, n_test=30)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    base = {
        "data-dir": str(data_dir), "method": "fedvls", "partition": "dirichlet", "dirichlet-beta": 0.5,
        "num-server-rounds": 3, "local-epochs": 1, "batch-size": 16, "eval-batch-size": 64,
        "augment": True, "amp": True,  # amp is accepted on the CPU and ignored there
        "output-dir": str(out),
    }
    federation = {"num-supernodes": 2, "client-resources-num-cpus": 1}
    env = {"PYTHONPATH": str(shim), MD5_ENV: json.dumps({"CIFAR10": sums})}
    outcomes = {}
    with LocalSuperLink(tmp_path / "flwr-home", env_extra=env) as link:
        for model, dataset in ZOO:
            run_config = {**base, "model": model, "dataset": dataset, "run-name": model}
            run_id = link.submit(run_config=run_config, federation_config=federation)
            outcomes[model] = link.wait(run_id, timeout=300)
        processes = list(link.processes)
    assert all(p.poll() is not None for p in processes)

    for model, dataset in ZOO:
        outcome = outcomes[model]
        assert outcome.completed, f"{model}: run ended {outcome.status}\n{outcome.log[-4000:]}"
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
    assert "round 3/3: accuracy" in outcomes["mobilenetv2"].log
