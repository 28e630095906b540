"""FedConcat end to end: 4 rounds that cross the stage boundary (K-means from the sites'
shared label distributions, per-cluster FedAvg, then the head over the frozen encoders that
every node keeps in its Context.state), with plain CE and with FedVLS in stage 1, in
simulation on the in-process engine; in real Flower processes, killed in either stage and
resumed, equal to a straight run; and in a Flower deployment, where every message runs in a
fresh ClientApp process, including a SuperNode that joins in stage 2 and must be sent the
encoders."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedvls_flwr.app.results import MODEL_FILE, load_arrays, read_rounds
from fedvls_flwr.experiments.report import make_report
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.fault_injection import FAULT_ENV, fault_app
from tests.processes import assert_none_left, kill_now, processes_with_home, saved_round, wait_for_saved_round
from tests.runs import DIGITS_RUN, run_here

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "num-server-rounds": 4, "protocol": "fedconcat", "fedconcat-encoder-rounds": 2}


def check(run_dir, nodes, k=2):
    rounds = read_rounds(run_dir)
    assert [(r["round"], r["stage"]) for r in rounds] == [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2)]
    for r in rounds[1:]:
        assert r["clients_accepted"] == r["clients_sampled"] == nodes and r["failures"] == [], r["failures"]
    assert all(r["accuracy"] is None for r in rounds[:3])  # stage 1: K cluster models, nothing to test
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rounds[3:])
    about = json.loads((run_dir / "protocol.json").read_text())
    assert about["assignment_source"] == "k-means" and len(about["assignment"]) == nodes
    assert set(about["assignment"].values()) == set(range(k))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best_round"] >= 3
    assert summary["stages"]["1"]["rounds"] == 2 and summary["stages"]["2"]["rounds"] == 2
    return rounds


def test_fedconcat_four_rounds_in_simulation_plain_and_with_fedvls(tmp_path):
    out = tmp_path / "runs"
    runs = {"fedconcat": {"method": "fedavg"}, "fedconcat-fedvls": {"method": "fedvls"},
            "fedconcat-k4": {"method": "fedavg", "fedconcat-clusters": 4}}
    for name, parts in runs.items():
        run_here({**BASE, **parts, "output-dir": str(out), "run-name": name}, 4)
        rounds = check(out / name, 4, k=4 if name.endswith("k4") else 2)
        if name == "fedconcat-fedvls":  # stage 1 trains with FedVLS's terms, stage 2 the head's CE
            assert "train-cal" in rounds[1]["train"] and "train-head-ce" in rounds[3]["train"]
    # the report puts both stages' rounds and seconds beside each FedConcat cell
    stages = list(csv.DictReader(make_report(out, tmp_path / "report")["stages_csv"].open()))
    assert sorted((r["method"], r["stage"], r["rounds_mean"]) for r in stages) == sorted(
        (label, stage, "2.0") for label in ("FedConcat K=2", "FedVLS + FedConcat K=2", "FedConcat K=4")
        for stage in ("1", "2"))
    assert all(float(r["seconds_mean"]) > 0 for r in stages)
    assert all(r["end_accuracy_mean"] == "" for r in stages if r["stage"] == "1")
    assert all(0 <= float(r["end_accuracy_mean"]) <= 100 for r in stages if r["stage"] == "2")


def test_fedconcat_killed_in_either_stage_resumes_to_the_straight_runs_history(tmp_path):
    """Real processes (flwr run), killed mid-stage 1 and mid-stage 2: the resumed runs'
    rounds.jsonl and final model equal an uninterrupted run's bit for bit (deterministic=true).
    The uninterrupted run and the resumes run on the in-process engine, whose rounds and final
    model equal flwr run's bit for bit (tests/test_e2e_inprocess.py)."""
    cfg = {**BASE, "method": "fedavg", "num-server-rounds": 9, "fedconcat-encoder-rounds": 3, "deterministic": True,
           "run-name": "r"}
    federation = {"num-supernodes": 4, "client-resources-num-cpus": 1}
    run_here({**cfg, "output-dir": str(tmp_path / "straight")}, federation["num-supernodes"])
    reference = read_rounds(tmp_path / "straight" / "r")
    app = fault_app(tmp_path / "app")
    for stage, kill_at in ((1, 1), (2, 5)):
        out = tmp_path / f"stage{stage}"
        # round kill_at + 1 held: the kill lands while it trains, on any machine
        with LocalSuperLink(tmp_path / f"home-{stage}a", env_extra={FAULT_ENV: f"hold:*:{kill_at + 1}"}) as link:
            link.submit(app, run_config={**cfg, "output-dir": str(out)}, federation_config=federation)
            wait_for_saved_round(out / "r", kill_at)
            kill_now(processes_with_home(tmp_path / f"home-{stage}a"))
            killed_at = saved_round(out / "r")
        assert killed_at == kill_at and (killed_at < 3) == (stage == 1), killed_at
        assert not (out / "r" / "summary.json").exists()
        # what the kill left is read back by a new server: on the in-process engine (the kill,
        # not the transport, is this test's subject; the engines agree bit for bit)
        run_here({**cfg, "output-dir": str(out), "resume": True}, federation["num-supernodes"])
        rounds = read_rounds(out / "r")
        keys = ("round", "stage", "accuracy", "loss", "per_class_accuracy")
        assert [[r[k] for k in keys] for r in rounds] == [[r[k] for k in keys] for r in reference]
        assert json.loads((out / "r" / "summary.json").read_text())["resumed_after_round"] == killed_at
        got, want = load_arrays(out / "r" / MODEL_FILE), load_arrays(tmp_path / "straight" / "r" / MODEL_FILE)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
        print(f"FedConcat killed after round {killed_at} (stage {stage}), resumed: rounds 0-9 and the final model "
              "equal the straight run's")
    for home in ("home-1a", "home-2a"):
        assert_none_left((), tmp_path / home)


def test_a_node_that_joins_in_stage_two_gets_the_encoders(tmp_path, node_env):
    """Deployment: two SuperNodes (partitions 0 and 1 of 3) are clustered by k-means and run
    stage 1 (2 rounds); every message runs in a fresh ClientApp process, so the head rounds
    work only if each node kept its encoders in its Context.state. Once a stage-2 round is
    saved, a third SuperNode (partition 2) starts. It took no part in the clustering or stage
    1; from the first stage-2 round that samples it, it trains the head over the K encoders it
    is sent, and no reply in the run fails or is rejected."""
    run_dir = tmp_path / "runs" / "late"
    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    try:
        link.start(insecure=True)
        for i in range(2):
            link.start_supernode(f"node-{i}", {"partition-id": i, "num-partitions": 3})
        run_id = link.submit(run_config={**BASE, "method": "fedavg", "num-server-rounds": 6, "min-nodes": 2,
                                         "round-timeout": 120.0, "output-dir": str(tmp_path / "runs"),
                                         "run-name": "late"})
        wait_for_saved_round(run_dir, 3, timeout=300, explain=lambda: link.status(run_id))
        link.start_supernode("node-2", {"partition-id": 2, "num-partitions": 3})
        outcome = link.wait(run_id, timeout=300, poll=1.0)
    finally:
        link.stop()
    assert_none_left(link.started_pids, tmp_path)
    rounds = read_rounds(run_dir)
    assert outcome.completed, f"{outcome.status}\n{outcome.log[-4000:]}"
    assert [r["stage"] for r in rounds] == [1, 1, 1, 2, 2, 2, 2]
    for r in rounds[1:]:
        assert r["failures"] == [] and r["clients_accepted"] == r["clients_sampled"], r
    assert all(set(r["sampled_partitions"]) == {0, 1} for r in rounds[1:4])  # before it started
    late = [r for r in rounds[4:] if 2 in r["sampled_partitions"]]
    assert late and all(0.0 <= r["accuracy"] <= 1.0 for r in late), [r["sampled_partitions"] for r in rounds]
    assert all(r["accuracy"] is None for r in rounds[:3])  # stage 1: K cluster models, nothing to test
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rounds[3:])
    about = json.loads((run_dir / "protocol.json").read_text())
    assert about["assignment_source"] == "k-means" and set(about["assignment"].values()) == {0, 1}
    assert set(about["assignment"]) == {"0", "1"}  # clustered before it joined
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best_round"] >= 3
    assert summary["stages"]["1"]["rounds"] == 2 and summary["stages"]["2"]["rounds"] == 4
