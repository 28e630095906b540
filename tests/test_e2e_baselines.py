"""The baselines' parts combined, in runs of 3 rounds: state that must survive between rounds
on a client (MOON's previous model, carried momentum) and on the server (FedExP, Flower's
FedAdam), in simulation on the in-process engine (the app's own ServerApp and ClientApp, each
node's Context.state kept between its messages as Flower's simulation keeps it) and in a real
Flower deployment, where every message runs in a fresh ClientApp process."""

from __future__ import annotations

import json

import pytest
import torch

from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.app.results import MODEL_FILE, load_arrays, read_rounds
from fedvls_flwr.config.run_config import parse_run_config
from tests.runs import DIGITS_RUN, deployed, run_here

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "num-server-rounds": 3, "moon-mu": 1.0}
RUNS = {
    "moon-sam-carry-fedexp": {"method": "moon", "local-optimizer": "sam", "optimizer-state": "carry",
                              "server-optimizer": "fedexp", "fedexp-eval": "average-last-two"},
    "fedprox-fedadam": {"method": "fedprox", "server-optimizer": "fedadam"},
    "fedlmd-fedavgm": {"method": "fedlmd", "server-optimizer": "fedavgm", "fedavgm-momentum": 0.9},
    "feddecorr-fedrs-yogi": {"method": "feddecorr", "server-optimizer": "fedyogi"},
}


def check_run(run_dir, config):
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for r in rounds[1:]:
        assert r["clients_accepted"] == r["clients_sampled"] and r["failures"] == [], r["failures"]
        assert 0.0 <= r["accuracy"] <= 1.0
    cfg = parse_run_config({**config, "output-dir": "/tmp", "run-name": "x"})
    model = build_run_model(cfg, (1, 8, 8), 10)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in load_arrays(run_dir / MODEL_FILE).items()})
    return rounds


def test_combined_parts_run_three_rounds_in_simulation(tmp_path):
    out = tmp_path / "runs"
    for name, parts in RUNS.items():
        config = {**BASE, **parts, "output-dir": str(out), "run-name": name}
        assert run_here(config, 3) == out / name
        rounds = check_run(out / name, config)
        if name.startswith("moon"):
            # round 1: no previous local model yet (term 0); later rounds read it from Context.state
            assert rounds[1]["train"]["train-con"] == 0.0
            assert rounds[2]["train"]["train-con"] > 0.0 and rounds[3]["train"]["train-con"] > 0.0
            assert all(r["server_step_size"] >= 1.0 for r in rounds[1:])
        if name.startswith("fedprox"):
            assert rounds[2]["train"]["train-prox"] > 0.0
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed"


def test_client_state_survives_between_rounds_in_deployment(tmp_path, node_env):
    """In deployment every message runs in a fresh ClientApp process: MOON's previous model
    and the carried momentum must come back through Flower's Context.state."""
    config = {**BASE, **RUNS["moon-sam-carry-fedexp"], "output-dir": str(tmp_path / "runs"), "run-name": "moon",
              "min-nodes": 2, "round-timeout": 300.0}
    run_dir = deployed(tmp_path, config, node_env)
    rounds = check_run(run_dir, config)
    assert rounds[1]["train"]["train-con"] == 0.0 and rounds[3]["train"]["train-con"] > 0.0
