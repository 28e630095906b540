"""A real `flwr run` simulation end to end (the README's command: own FLWR_HOME, own ports,
every process stopped), and the GPU check of clients that Ray gives no GPU; what the app
computes in a simulation (the synthetic benchmark, partial participation) on the in-process
engine, the same ServerApp and ClientApp in this process."""

import json

import pytest
import torch

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.data.node_data import client_data
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.runs import run_here

pytestmark = pytest.mark.e2e


def test_flwr_run_simulation_completes_and_writes_results(tmp_path):
    out = tmp_path / "runs"
    run_config = {
        "dataset": "digits",
        "method": "fedvls",
        "num-server-rounds": 3,
        "local-epochs": 1,
        "dirichlet-beta": 0.5,
        "output-dir": str(out),
        "run-name": "e2e",
    }
    federation = {"num-supernodes": 3, "client-resources-num-cpus": 1}
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        run_id = link.submit(run_config=run_config, federation_config=federation)
        outcome = link.wait(run_id, timeout=300)
        processes = list(link.processes)
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert all(p.poll() is not None for p in processes)

    run_dir = out / "e2e"
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for r in rounds[1:]:
        assert 0.0 <= r["accuracy"] <= 1.0 and len(r["per_class_accuracy"]) == 10
        assert r["clients_accepted"] == 3 and r["clients_failed"] == 0
        assert {"train-loss", "train-cal", "train-dis", "train-logit"} <= set(r["train"])
        # every reply names its device; no client asked Ray for a GPU, so none has one
        assert sum(r["devices"].values()) == 3 and all(d.startswith("cpu") for d in r["devices"]), r["devices"]
        assert r["peak_gpu_mb"] is None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["method"] == "fedvls"
    assert summary["final_round"] == 3
    assert summary["best_accuracy"] == max(r["accuracy"] for r in rounds[1:])
    assert (run_dir / "model_final.npz").stat().st_size > 0
    assert "round 3/3: accuracy" in outcome.log and "clients 3/3 on cpu" in outcome.log
    # no reply carried the sites' label distribution; the server rebuilt the split for its
    # class-wise views: clients.json and the mean of vacant classes, as the clients hold them
    assert summary["reply_metrics"] and not {"class-counts", "num-vacant"} & set(summary["reply_metrics"])
    cfg = parse_run_config({**run_config, "dataset": "digits"})
    held = {pid: torch.bincount(client_data(cfg, pid, 3).y, minlength=10).tolist() for pid in range(3)}
    clients = json.loads((run_dir / "clients.json").read_text())["clients"]
    assert {c["partition_id"]: c["class_counts"] for c in clients} == held
    sizes = {pid: sum(c) for pid, c in held.items()}
    vacant = sum(sizes[p] * held[p].count(0) for p in held) / sum(sizes.values())
    assert all(r["train"]["num-vacant"] == pytest.approx(vacant) for r in rounds[1:])


def test_device_cuda_for_clients_without_a_gpu_stops_before_round_1(tmp_path):
    """device='cuda' where the clients see no CUDA (this machine has none; on a GPU host Ray
    hides it from clients that ask for no GPU): the server asks every node first and stops
    with the fix, instead of every client failing in round 1."""
    cfg = {"dataset": "digits", "device": "cuda", "num-server-rounds": 3, "local-epochs": 1,
           "output-dir": str(tmp_path / "runs"), "run-name": "cuda"}
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        outcome = link.wait(link.submit(run_config=cfg, federation_config={"num-supernodes": 2}), timeout=300)
    assert outcome.status == "finished:failed", outcome.status
    assert "device = 'cuda' but 2 of 2 clients see no CUDA device" in outcome.log, outcome.log[-3000:]
    assert "round 1/3" not in outcome.log and "Fix:" in outcome.log
    assert not (tmp_path / "runs" / "cuda" / "rounds.jsonl").exists()


def test_synthetic_benchmark_runs_with_one_client_per_node(tmp_path):
    cfg = {
        "dataset": "synthetic", "synthetic-clients": 4, "synthetic-alpha": 1.0, "synthetic-beta": 1.0,
        "method": "fedlc", "num-server-rounds": 2, "local-epochs": 1, "batch-size": 10,
        "fraction-train": 0.5, "output-dir": str(tmp_path / "runs"), "run-name": "synthetic",
    }
    run_here(cfg, 4)
    rounds = read_rounds(tmp_path / "runs" / "synthetic")
    assert [r["clients_accepted"] for r in rounds[1:]] == [2, 2]
    assert json.loads((tmp_path / "runs" / "synthetic" / "summary.json").read_text())["model"] == "logreg"


def test_partial_participation_pairs_runs_of_different_methods(tmp_path):
    """fraction-train < 1: the server asks each node its partition once (a query message)
    and samples by partition id, so two methods with the same seed train the same clients
    in every round, although the nodes get other random ids in every run (as Flower gives them)."""
    base = {"dataset": "digits", "num-server-rounds": 3, "local-epochs": 1, "dirichlet-beta": 0.5,
            "fraction-train": 0.5, "seed": 3, "output-dir": str(tmp_path / "runs")}
    for m in ("fedavg", "fedvls"):
        run_here({**base, "method": m, "run-name": m}, 6)
    sampled = [[r["sampled_partitions"] for r in read_rounds(tmp_path / "runs" / m)[1:]] for m in ("fedavg", "fedvls")]
    assert sampled[0] == sampled[1]
    assert all(len(s) == 3 and None not in s for s in sampled[0])
