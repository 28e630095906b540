"""Failures in real simulations: a raising client, a NaN client, a killed server and resume,
and an invalid run config that fails the run with a message naming the key."""

import json
import os
import signal
import time

import pytest

from fedvls_flwr.launch import LocalSuperLink
from fedvls_flwr.results import read_rounds
from tests.fault_injection import FAULT_ENV, MODS
from tests.processes import processes_with_home

pytestmark = pytest.mark.e2e

BASE = {"dataset": "digits", "method": "fedvls", "local-epochs": 1, "dirichlet-beta": 0.5}
FEDERATION = {"num-supernodes": 3, "client-resources-num-cpus": 1}


def test_raising_and_nan_clients_are_dropped_and_recorded(tmp_path):
    env = {**MODS, FAULT_ENV: "raise:1:1,nan:0:2"}
    cfg = {**BASE, "num-server-rounds": 2, "min-fit-fraction": 0.3, "output-dir": str(tmp_path), "run-name": "faults"}
    with LocalSuperLink(tmp_path / "home", env_extra=env) as link:
        outcome = link.wait(link.submit(run_config=cfg, federation_config=FEDERATION), timeout=300)
    assert outcome.completed, outcome.log[-3000:]
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
    with LocalSuperLink(tmp_path / "home1") as link:
        link.submit(run_config=cfg, federation_config=FEDERATION)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = run_dir / "state.json"
            if state.exists() and json.loads(state.read_text())["round"] >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("round 2 never finished")
        # SIGKILL, no grace period: every process of this run (SuperLink, SuperExec, the
        # simulation with the ServerApp, Ray and its actors) dies mid-run. A graceful stop
        # would give the fast digits rounds time to finish the run before the kill.
        for pid in processes_with_home(tmp_path / "home1"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    killed_at = json.loads((run_dir / "state.json").read_text())["round"]
    assert killed_at < n and not (run_dir / "summary.json").exists()

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
