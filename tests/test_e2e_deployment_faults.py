"""Deployment faults end to end on 127.0.0.1: real SuperLink, real SuperNodes.

Requirement: "a SuperNode killed mid-run - the run continues with the remaining nodes;
a SuperNode that joins late is used from the next round."

* Kill: SuperLink + 3 SuperNodes, 4 rounds of FedVLS on digits with min-fit-fraction 0.3
  and a short round-timeout. Once round 1 is saved (``state.json``), one SuperNode's whole
  process tree is SIGKILLed. The SuperLink still lists that node until its heartbeat
  expires (Flower 1.41: 2 x 30 s), so the next round(s) still send it work: its reply
  never comes (``no reply before round-timeout``) or, once the heartbeat has expired
  while the round waits, Flower answers for it with a "Node Unavailable" error reply.
  Either way the round counts with the 2 live nodes and the run completes.
* Late join: SuperLink + 2 SuperNodes (partitions 0 and 1 of 3), 4 rounds; after round 1
  the third SuperNode (partition 2) starts. Some later round trains on 3 nodes, and every
  round from then on too.

Every process is started in its own process group and stopped by PID (the killed node
by its PID and its descendants); the tests check none is left, like test_e2e_deployment.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import LocalSuperLink
from fedvls_flwr.ops.processes import descendants
from tests.processes import assert_none_left, kill_now, processes_with_home, wait_for_saved_round
from tests.runs import DIGITS_RUN

pytestmark = pytest.mark.e2e

ROUNDS = 4
MISSING_REPLY = "no reply before round-timeout"  # RunStrategy.aggregate_train
NODE_UNAVAILABLE = "Node Unavailable"            # Flower's error reply for an expired node


def run_config(out: Path, min_nodes: int, round_timeout: float) -> dict:
    return {
        **DIGITS_RUN, "method": "fedvls", "num-server-rounds": ROUNDS, "output-dir": str(out), "run-name": "e2e",
        "min-nodes": min_nodes, "min-fit-fraction": 0.3, "round-timeout": round_timeout,
    }


def kill_tree(proc, home: Path) -> None:
    """SIGKILL a SuperNode and everything it started (its SuperExec, running ClientApps),
    as a crashed machine would vanish: no clean shutdown, no goodbye to the SuperLink."""
    deadline = time.monotonic() + 15
    while True:
        victims = {proc.pid, *descendants(proc.pid), *processes_with_home(home)}
        victims.discard(os.getpid())
        kill_now(victims)
        proc.wait(timeout=10)
        if not processes_with_home(home):
            return
        assert time.monotonic() < deadline, f"processes of {home} survived SIGKILL: {processes_with_home(home)}"
        time.sleep(0.2)


def the_run(link: LocalSuperLink, run_id: int) -> Callable[[], str]:
    """What a test says of the run when a round it waits for is not saved: its status and log."""
    return lambda: f"run {link.status(run_id)}\n{link.logs(run_id)[-3000:]}"


def describe(rounds: list[dict]) -> str:
    return "\n".join(
        f"round {r['round']}: sampled {r.get('clients_sampled')} accepted {r.get('clients_accepted')} "
        f"failed {r.get('clients_failed')} failures {r.get('failures')}"
        for r in rounds
    )


def test_killed_supernode_run_continues_with_the_others(tmp_path, node_env):
    run_dir = tmp_path / "runs" / "e2e"
    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    try:
        link.start(insecure=True)
        nodes = [link.start_supernode(f"node-{i}", {"partition-id": i, "num-partitions": 3}) for i in range(3)]
        run_id = link.submit(run_config=run_config(tmp_path / "runs", 3, round_timeout=60.0))
        wait_for_saved_round(run_dir, 1, timeout=180, explain=the_run(link, run_id))
        killed_at = len(read_rounds(run_dir)) - 1  # rounds saved when the node died
        kill_tree(nodes[2], link.home / "node-2")
        outcome = link.wait(run_id, timeout=240, poll=1.0)
    finally:
        link.stop()
    assert_none_left(link.started_pids, tmp_path)
    rounds = read_rounds(run_dir)
    assert outcome.completed, f"run ended {outcome.status}\n{describe(rounds)}\n{outcome.log[-4000:]}"
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1)), describe(rounds)

    before, after = rounds[1:killed_at + 1], rounds[killed_at + 1:]
    assert after, f"the node was killed after the last round\n{describe(rounds)}"
    for r in before:
        assert (r["clients_sampled"], r["clients_accepted"], r["clients_failed"]) == (3, 3, 0), describe(rounds)
    for r in after:
        # The two live nodes carry every round after the kill.
        assert r["clients_accepted"] == 2, describe(rounds)
        assert r["clients_rejected"] == 0, describe(rounds)
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["attempts"] == 1, describe(rounds)
        # While the SuperLink still lists the dead node it is sampled, and its missing
        # reply is recorded as a failure; once Flower has dropped it, it is not sampled.
        assert r["clients_sampled"] - r["clients_accepted"] == r["clients_failed"], describe(rounds)
        for failure in r["failures"]:
            assert MISSING_REPLY in failure["reason"] or NODE_UNAVAILABLE in failure["reason"], describe(rounds)
    # The round in flight when the node died waited for it: that failure is recorded.
    first = after[0]
    assert (first["clients_sampled"], first["clients_failed"]) == (3, 1), describe(rounds)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_round"] == ROUNDS
    assert (run_dir / "model_final.npz").stat().st_size > 0


def test_late_supernode_is_used_from_a_later_round(tmp_path, node_env):
    run_dir = tmp_path / "runs" / "e2e"
    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    try:
        link.start(insecure=True)
        for i in range(2):
            link.start_supernode(f"node-{i}", {"partition-id": i, "num-partitions": 3})
        run_id = link.submit(run_config=run_config(tmp_path / "runs", 2, round_timeout=120.0))
        wait_for_saved_round(run_dir, 1, timeout=180, explain=the_run(link, run_id))
        joined_after = len(read_rounds(run_dir)) - 1  # rounds saved before the node started
        link.start_supernode("node-2", {"partition-id": 2, "num-partitions": 3})
        outcome = link.wait(run_id, timeout=240, poll=1.0)
    finally:
        link.stop()
    assert_none_left(link.started_pids, tmp_path)
    rounds = read_rounds(run_dir)
    assert outcome.completed, f"run ended {outcome.status}\n{describe(rounds)}\n{outcome.log[-4000:]}"
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1)), describe(rounds)
    for r in rounds[1:]:
        assert r["clients_failed"] == 0 and r["clients_rejected"] == 0, describe(rounds)
        assert r["clients_accepted"] == r["clients_sampled"], describe(rounds)
        assert 0.0 <= r["accuracy"] <= 1.0
    for r in rounds[1:joined_after + 1]:
        assert r["clients_accepted"] == 2, describe(rounds)
    # The new node registers while a round may already be under way; from the first round
    # sampled after it registered, it is used in every round.
    later = [r["clients_accepted"] for r in rounds[joined_after + 1:]]
    assert 3 in later, describe(rounds)
    first = later.index(3)
    assert later[first:] == [3] * (len(later) - first), describe(rounds)
    assert all(n == 2 for n in later[:first]), describe(rounds)
    assert sorted({p for r in rounds[1:] for p in r["sampled_partitions"]}) == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_round"] == ROUNDS


# A parent that starts the SuperNode and never reaps it: after a SIGKILL the SuperNode
# stays a zombie, as under a supervisor that reaps late.
NON_REAPING_PARENT = ["-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(10**6)"]


def test_clientapp_ends_when_its_unreaped_supernode_is_killed(tmp_path, node_env):
    """Flower 1.41's SuperExec and flwr-clientapp watch their parent with os.kill(pid, 0),
    which succeeds for a zombie, so without fedvls_flwr.app.supernode_guard the ClientApp of a
    killed, unreaped SuperNode trains on for nobody (a minute here) and then pushes its
    reply to whatever serves that Runtime API port (a restarted SuperNode rejects its
    token). With the guard it ends within a second."""
    import sys

    from tests.processes import cmdline

    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    node_home = link.home / "node-0"
    try:
        link.start(insecure=True)
        cmd, env = link.supernode_command("node-0", {"partition-id": 0, "num-partitions": 1})
        parent = link.spawn([sys.executable, *NON_REAPING_PARENT, *cmd], link.home / "node-0.log", env=env)
        config = {**run_config(tmp_path / "runs", 1, round_timeout=600.0), "local-epochs": 300}
        run_id = link.submit(run_config=config)
        deadline = time.monotonic() + 300
        while "node data:" not in (link.home / "node-0.log").read_text():  # training starts
            assert time.monotonic() < deadline, (link.home / "node-0.log").read_text()[-3000:]
            time.sleep(0.5)
        clientapps = [p for p in processes_with_home(node_home) if "flwr-clientapp" in cmdline(p)]
        supernode = next(p for p in descendants(parent.pid) if "flower-supernode" in cmdline(p))
        assert len(clientapps) == 1
        os.kill(supernode, signal.SIGKILL)
        killed = time.monotonic()
        while clientapps[0] in processes_with_home(node_home) and time.monotonic() - killed < 30:
            time.sleep(0.1)
        ended_after = time.monotonic() - killed
        state = Path(f"/proc/{supernode}/stat").read_text().rsplit(")", 1)[1].split()[0]
        link.flwr("stop", str(run_id), link.connection)
    finally:
        link.stop()
        for pid in processes_with_home(node_home):  # Flower's SuperExec, also blind to the zombie
            os.kill(pid, signal.SIGKILL)
    assert state == "Z"  # the scenario: the SuperNode was dead but not reaped meanwhile
    assert ended_after < 5.0, f"the ClientApp outlived its killed SuperNode by {ended_after:.1f}s"
    assert f"the SuperNode (pid {supernode}) that started this ClientApp is gone" in (
        link.home / "node-0.log").read_text()
    assert_none_left(link.started_pids, tmp_path)
