"""The benchmark's plain reference loop and the app do the same work.

On a tiny configuration (digits, 3 clients, 2 rounds, 1 local epoch) the plain PyTorch
loop of ``bench/reference_loop.py`` and a simulation of the app (its ServerApp and
ClientApp on the in-process engine, which computes what a ``flwr run`` simulation computes,
bit for bit: tests/test_e2e_inprocess.py) reach the same test accuracy in every round
(round 0, the initial model, included), for FedAvg and FedVLS. So a speed ratio between
them compares equal work. The DataLoader variant of the reference loop (the "idiomatic"
baseline of the benchmark) draws the same batches and must agree as well.
"""

import pytest

from bench.reference_loop import RefConfig, run
from fedvls_flwr.app.results import read_rounds
from tests.runs import run_here

pytestmark = pytest.mark.e2e

TOL = 1e-4


def tiny(method: str, **changes) -> RefConfig:
    return RefConfig.make(
        method=method, dataset="digits", num_clients=3, num_server_rounds=2, local_epochs=1,
        dirichlet_beta=0.05, seed=0, **changes,
    )


def app_accuracies(cfg: RefConfig, out) -> list[float]:
    overrides = {**cfg.run_config(), "output-dir": str(out), "run-name": cfg.method,
                 "device": "cpu", "torch-threads": 1, "min-nodes": cfg.num_clients}
    run_here(overrides, cfg.num_clients)
    rounds = read_rounds(out / cfg.method)
    assert [r["round"] for r in rounds] == list(range(cfg.num_server_rounds + 1))
    return [r["accuracy"] for r in rounds]


@pytest.mark.parametrize("method", ["fedavg", "fedvls"])
def test_reference_loop_matches_the_app(tmp_path, method):
    cfg = tiny(method)
    reference = run(cfg)
    ref_acc = [r["accuracy"] for r in reference["rounds"]]
    if method == "fedvls":
        # the configuration must exercise the teacher (>= 2 vacant classes on some client)
        from fedvls_flwr.data.datasets import load_dataset
        from fedvls_flwr.data.partition import class_counts, partition_indices

        y = load_dataset("digits", cfg.data_dir).train_y.numpy()
        parts = partition_indices(y, cfg.num_clients, "dirichlet", cfg.seed, dirichlet_beta=cfg.dirichlet_beta)
        assert any((class_counts(y, p, 10) == 0).sum() >= 2 for p in parts)

    app_acc = app_accuracies(cfg, tmp_path / "runs")
    assert len(app_acc) == len(ref_acc) == 3
    for r, (a, b) in enumerate(zip(app_acc, ref_acc)):
        assert abs(a - b) < TOL, f"round {r}: app {a} vs reference {b} (all: {app_acc} vs {ref_acc})"
    assert ref_acc[-1] > ref_acc[0]  # it learned something


@pytest.mark.parametrize("method", ["fedavg", "fedvls"])
def test_dataloader_variant_draws_the_same_batches(method):
    index = run(tiny(method))
    loader = run(tiny(method, loader="dataloader"))
    for a, b in zip(index["rounds"], loader["rounds"]):
        assert abs(a["accuracy"] - b["accuracy"]) < TOL
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)

