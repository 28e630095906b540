"""Whole runs on the in-process engine's client workers. A client worker killed in the middle of
a round (SIGKILL, as the out-of-memory killer sends it): the run records the failed reply of the
client that worker held, the worker is started again, and the run completes; with a retry
allowed, the round is trained again and the run computes what an undisturbed run computes, bit
for bit. A node's state (the client state of each kind in its ``Context.state``: MOON's previous
model, carried momentum) follows the node to whichever worker serves it: the same run on one
worker computes the same, bit for bit, while the nodes did move between workers (the recording
ClientApp paces the nodes so that they do, whatever the machine's timing).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedvls_flwr.app.results import CHECKPOINT_FILE, CHECKPOINT_ROUND_KEY, load_checkpoint, read_rounds
from fedvls_flwr.ops.inprocess import run_in_process
from tests.fault_injection import FAULT_ENV, ONCE_ENV
from tests.runs import DIGITS_RUN
from tests.worker_apps import SERVED_BY_ENV

pytestmark = pytest.mark.e2e

NODES = 4
FAULTY_APP = "tests.fault_injection:fault_client_app"
CONFIG = {**DIGITS_RUN, "method": "fedavg", "num-server-rounds": 4, "deterministic": True, "seed": 5}


def arrays(path) -> dict[str, np.ndarray]:
    """A run's saved arrays: a checkpoint read whole (its round, and the arrays it takes from
    its frozen file, checkpoint-frozen-<digest>.npz), any other file as written."""
    if path.name == CHECKPOINT_FILE:
        done, saved = load_checkpoint(path)
        return {**saved, CHECKPOINT_ROUND_KEY: np.asarray(done)}
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def test_a_killed_worker_fails_the_client_it_held_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "kill:1:2")  # partition 1's worker dies while it trains round 2
    monkeypatch.setenv(ONCE_ENV, str(tmp_path))
    done = run_in_process({**CONFIG, "min-fit-fraction": 0.5, "round-retries": 0, "output-dir": str(tmp_path),
                           "run-name": "killed"}, NODES, client_cpus=1, client_app=FAULTY_APP)
    assert done.workers.startswith("2 workers")
    rounds = read_rounds(tmp_path / "killed")
    assert [r["clients_failed"] for r in rounds[1:]] == [0, 1, 0, 0]
    assert [r["clients_accepted"] for r in rounds[1:]] == [4, 3, 4, 4]  # the worker was started again
    (failure,) = rounds[2]["failures"]
    assert failure["partition_id"] == 1
    assert "client worker process" in failure["reason"] and "killed by SIGKILL" in failure["reason"]
    assert len(done.extra["crashes"]) == 1
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_round"] == 4


def test_a_round_retried_after_a_killed_worker_computes_what_an_undisturbed_run_computes(tmp_path, monkeypatch):
    settings = {**CONFIG, "min-fit-fraction": 1.0, "round-retries": 1, "output-dir": str(tmp_path)}
    run_in_process({**settings, "run-name": "clean"}, NODES, client_cpus=1)
    monkeypatch.setenv(FAULT_ENV, "kill:2:3")
    monkeypatch.setenv(ONCE_ENV, str(tmp_path))
    run_in_process({**settings, "run-name": "retried"}, NODES, client_cpus=1, client_app=FAULTY_APP)
    clean, retried = read_rounds(tmp_path / "clean"), read_rounds(tmp_path / "retried")
    assert [r["attempts"] for r in retried[1:]] == [1, 1, 2, 1]
    assert retried[3]["clients_accepted"] == 4 and "killed by SIGKILL" in retried[3]["failures"][0]["reason"]
    assert [(r["accuracy"], r["loss"], r.get("train")) for r in clean] == [(r["accuracy"], r["loss"], r.get("train"))
                                                                       for r in retried]
    for name in ("model_final.npz", "checkpoint.npz"):
        a, b = arrays(tmp_path / "clean" / name), arrays(tmp_path / "retried" / name)
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), name


STATE_CONFIGS = {
    "moon-previous-model": {"method": "moon"},
    "carried-momentum-3-of-4-nodes": {"method": "fedavg", "optimizer-state": "carry", "fraction-train": 0.75},
}


@pytest.mark.parametrize("name", sorted(STATE_CONFIGS))
def test_a_nodes_state_follows_it_to_whichever_worker_serves_it(name, tmp_path, monkeypatch):
    settings = {**DIGITS_RUN, **STATE_CONFIGS[name], "num-server-rounds": 4, "deterministic": True, "seed": 1,
                "output-dir": str(tmp_path)}
    alone = run_in_process({**settings, "run-name": "one"}, NODES, client_cpus=1, workers=1)
    assert alone.workers.startswith("1 worker: the clients run one after another")
    served = tmp_path / "served-by.txt"
    monkeypatch.setenv(SERVED_BY_ENV, str(served))
    pooled = run_in_process({**settings, "run-name": "pooled"}, NODES, client_cpus=1,
                            client_app="tests.worker_apps:project_recording_workers")
    assert pooled.workers.startswith("2 workers") and pooled.extra["crashes"] == []
    pids: dict[str, set[str]] = {}
    for line in served.read_text().splitlines():
        _, partition, pid = line.split()
        pids.setdefault(partition, set()).add(pid)
    # the recording app paces the nodes so that they move between workers on any machine
    assert len(set().union(*pids.values())) == 2 and any(len(p) > 1 for p in pids.values()), pids
    one, two = read_rounds(tmp_path / "one"), read_rounds(tmp_path / "pooled")
    assert len(one) == 5 and [{k: v for k, v in r.items() if k != "seconds"} for r in one] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in two]
    for file in ("model_final.npz", "checkpoint.npz"):
        a, b = arrays(tmp_path / "one" / file), arrays(tmp_path / "pooled" / file)
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), file
