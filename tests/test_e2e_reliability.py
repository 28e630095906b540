"""Failures in simulations. On the in-process engine (the app's own ServerApp and ClientApp,
a ClientApp that raises is a failed reply as in Flower's simulation): a raising client, a
NaN client, and a run folder moved between two sessions that resumes bit-identically.
Through real `flwr run` processes: a killed server and resume, an invalid run config that
fails the run with a message naming the key in Flower's log, an unknown key that Flower's
SuperLink refuses naming it only in its log, and min-nodes above the simulation's nodes."""

import json
import shutil

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import PROJECT_DIR, LocalSuperLink
from tests.fault_injection import FAULT_ENV, fault_app, fault_client_app
from tests.processes import assert_none_left, kill_now, processes_with_home, saved_round, wait_for_saved_round
from tests.runs import DIGITS_RUN, run_here

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "method": "fedvls"}
NODES = 3
FEDERATION = {"num-supernodes": NODES, "client-resources-num-cpus": 1}


def test_raising_and_nan_clients_are_dropped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "raise:1:1,nan:0:2")
    cfg = {**BASE, "num-server-rounds": 2, "min-fit-fraction": 0.3, "output-dir": str(tmp_path), "run-name": "faults"}
    run_here(cfg, NODES, client_app=fault_client_app())
    r1, r2 = read_rounds(tmp_path / "faults")[1:]
    assert (r1["clients_accepted"], r1["clients_failed"], r1["clients_rejected"]) == (2, 1, 0)
    assert "injected fault" in r1["failures"][0]["reason"]
    assert (r2["clients_accepted"], r2["clients_failed"], r2["clients_rejected"]) == (2, 0, 1)
    assert "NaN" in r2["failures"][0]["reason"]
    assert r2["accuracy"] is not None  # the global model stayed finite and evaluable


def test_killed_server_resumes_with_every_round_once(tmp_path):
    n = 6
    cfg = {**BASE, "num-server-rounds": n, "output-dir": str(tmp_path), "run-name": "resumed", "resume": True}
    run_dir = tmp_path / "resumed"
    # round 3 held: the kill lands while it trains, however fast the digits rounds go
    with LocalSuperLink(tmp_path / "home1", env_extra={FAULT_ENV: "hold:*:3"}) as link:
        link.submit(fault_app(tmp_path / "app"), run_config={**cfg, "resume": False}, federation_config=FEDERATION)
        wait_for_saved_round(run_dir, 2, timeout=240)
        # SIGKILL, no grace period: every process of this run (SuperLink, SuperExec, the
        # simulation with the ServerApp, Ray and its actors) dies mid-run.
        kill_now(processes_with_home(tmp_path / "home1"))
    killed_at = saved_round(run_dir)
    assert killed_at == 2 and not (run_dir / "summary.json").exists()

    with LocalSuperLink(tmp_path / "home2") as link:
        outcome = link.wait(link.submit(run_config=cfg, federation_config=FEDERATION), timeout=300)
    assert outcome.completed, outcome.log[-3000:]
    assert [r["round"] for r in read_rounds(run_dir)] == list(range(n + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == n and summary["status"] == "completed"
    assert summary["resumed_after_round"] == killed_at


def test_invalid_run_config_fails_the_run_with_the_key_named(tmp_path):
    cfg = {**BASE, "dirichlet-beta": -1.0, "output-dir": str(tmp_path)}
    with LocalSuperLink(tmp_path / "home") as link:
        outcome = link.wait(link.submit(run_config=cfg, federation_config=FEDERATION), timeout=120)
    assert outcome.status == "finished:failed"
    assert "'dirichlet-beta' = -1.0: must be > 0" in outcome.log


def test_moved_run_folder_resumes_bit_identical_to_an_uninterrupted_run(tmp_path):
    """A run stopped after 2 rounds (as on a full disk), its folder
    moved to another output-dir, resumed there: the same rounds.jsonl accuracies and losses as
    a run that was never interrupted, and the same final model, bit for bit."""
    n = 4
    straight = {**BASE, "num-server-rounds": n, "output-dir": str(tmp_path / "straight"), "run-name": "r"}
    first = {**straight, "num-server-rounds": 2, "output-dir": str(tmp_path / "disk1")}
    moved = {**straight, "output-dir": str(tmp_path / "disk2"), "resume": True}
    for cfg in (straight, first):
        run_here(cfg, NODES)
    (tmp_path / "disk2").mkdir()
    shutil.move(tmp_path / "disk1" / "r", tmp_path / "disk2" / "r")
    run_here(moved, NODES)

    def metrics(run_dir):
        return [(r["round"], r["accuracy"], r["loss"], r["per_class_accuracy"]) for r in read_rounds(run_dir)]

    resumed_dir, straight_dir = tmp_path / "disk2" / "r", tmp_path / "straight" / "r"
    assert [m[0] for m in metrics(resumed_dir)] == list(range(n + 1))
    assert metrics(resumed_dir) == metrics(straight_dir)
    assert json.loads((resumed_dir / "summary.json").read_text())["resumed_after_round"] == 2
    import numpy as np

    with np.load(resumed_dir / "model_final.npz") as a, np.load(straight_dir / "model_final.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])


def test_unknown_key_is_named_only_in_the_superlink_log_and_by_check(tmp_path):
    """What the README says about a typo through plain `flwr run`: the CLI shows only
    "[code: 15] Invalid run configuration", the SuperLink's log names the key, and
    `python -m fedvls_flwr check` names it with a did-you-mean."""
    with LocalSuperLink(tmp_path / "home") as link:
        res = link.flwr("run", str(PROJECT_DIR), link.connection, "--run-config", "lamda-dis=0.1")
        log = (tmp_path / "home" / "superlink.log").read_text(errors="replace")
    assert res.returncode != 0 and "Invalid run configuration" in res.stdout + res.stderr
    assert "lamda-dis" not in res.stdout + res.stderr
    assert "Could not start run: Key 'lamda-dis' is not present in the main dictionary" in log
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fedvls_flwr", "check", "--run-config", "lamda-dis=0.1"],
                         capture_output=True, text=True, cwd=PROJECT_DIR)
    assert out.returncode == 2 and "unknown run config key 'lamda-dis' (did you mean 'lambda-dis'?)" in out.stderr


def test_min_nodes_above_the_simulation_fails_at_once(tmp_path):
    """`min-nodes=6` on 4 simulated SuperNodes: waiting would log "waiting for nodes: 4
    connected, 6 needed" every 30 s for ever (and `flwr-simulation` with its Ray processes
    would outlive a stopped SuperLink). A simulation's nodes all exist from the start: the run
    fails within seconds, naming both numbers, and leaves no process behind."""
    cfg = {**BASE, "num-server-rounds": 2, "min-nodes": 6, "output-dir": str(tmp_path), "run-name": "r"}
    federation = {"num-supernodes": 4, "client-resources-num-cpus": 1}
    with LocalSuperLink(tmp_path / "home") as link:
        outcome = link.wait(link.submit(run_config=cfg, federation_config=federation), timeout=180)
    assert outcome.status == "finished:failed", outcome.log[-3000:]
    assert "min-nodes = 6 but this simulation has 4 SuperNode(s)" in outcome.log
    assert "num-supernodes=6" in outcome.log
    assert_none_left((), tmp_path / "home", timeout=30)
