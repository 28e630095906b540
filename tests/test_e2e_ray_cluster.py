"""Real `flwr run` simulations on a real 2-node Ray cluster on this machine.

A head and one worker are started with ``ray start`` (each its own ``--temp-dir``, its own
ports, ``--node-ip-address=127.0.0.1``) and stopped by PID, never with ``ray stop`` (which
would stop every Ray cluster of this user). Each node offers 1 CPU and each client asks for
1, so Ray runs 2 client actors at a time, one per node: the replies name both nodes. The
simulation joins the cluster through ``RAY_ADDRESS`` in the SuperLink's environment, as a
user's ``flwr run .`` would (docs/ray-cluster.md).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import LocalSuperLink
from fedvls_flwr.ops.processes import free_port
from fedvls_flwr.ops.ray_cluster import RAY_BIN, RayNode, start_ray_node
from tests.processes import assert_none_left, kill_now, wait_for_saved_round
from tests.runs import DIGITS_RUN

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which(str(RAY_BIN)) is None, reason=f"the ray CLI ({RAY_BIN}) is not installed"),
]

BASE = {**DIGITS_RUN, "method": "fedvls", "deterministic": True, "seed": 3, "torch-threads": 1}
FEDERATION = {"num-supernodes": 4, "client-resources-num-cpus": 1}
ADDRESS_FILE = Path("/tmp/ray/ray_current_cluster")  # where ray.init() without an address would look


class Cluster:
    def __init__(self, head: RayNode, worker: RayNode) -> None:
        self.head, self.worker = head, worker
        self.address = f"127.0.0.1:{head.ports['port']}"
        self.pids: set[int] = set()

    def note_pids(self) -> None:
        self.pids |= set(self.head.pids) | set(self.worker.pids)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    address_file_before = ADDRESS_FILE.exists()
    # FLWR_HOME below tmp_path: assert_none_left finds every Ray process of these nodes too
    head = start_ray_node(num_cpus=1, env={**os.environ, "FLWR_HOME": str(tmp_path / "ray-head")})
    try:
        worker = start_ray_node(address=f"127.0.0.1:{head.ports['port']}", num_cpus=1,
                                env={**os.environ, "FLWR_HOME": str(tmp_path / "ray-worker")})
    except BaseException:
        head.stop()
        raise
    nodes = Cluster(head, worker)
    nodes.note_pids()
    try:
        yield nodes
    finally:
        nodes.note_pids()
        worker.stop()
        head.stop()
        assert_none_left(nodes.pids, tmp_path)
        assert ADDRESS_FILE.exists() == address_file_before, "a Ray node of this test wrote /tmp/ray/ray_current_cluster"
        assert not head.temp_dir.exists() and not worker.temp_dir.exists()


def history(run_dir: Path) -> list[tuple]:
    return [(r["round"], r["accuracy"], r["loss"], r["per_class_accuracy"]) for r in read_rounds(run_dir)]


def test_a_run_on_a_2_node_cluster_uses_both_nodes_and_equals_a_single_machine_run(tmp_path, cluster):
    cfg = {**BASE, "num-server-rounds": 3, "run-name": "r"}
    with LocalSuperLink(tmp_path / "home-cluster", env_extra={"RAY_ADDRESS": cluster.address}) as link:
        t0 = time.monotonic()
        outcome = link.wait(link.submit(run_config={**cfg, "output-dir": str(tmp_path / "cluster")},
                                        federation_config=FEDERATION), timeout=400)
        cluster_seconds = time.monotonic() - t0
        cluster.note_pids()
    assert outcome.completed, outcome.log[-4000:]
    rounds = read_rounds(tmp_path / "cluster" / "r")
    per_round = [r["nodes"] for r in rounds[1:]]
    summary = json.loads((tmp_path / "cluster" / "r" / "summary.json").read_text())
    print(f"\n2-node run ({cluster_seconds:.0f} s): replies per node by round: {per_round}")
    print(f"summary.json replies_per_node: {summary['replies_per_node']}")
    assert all(sum(n.values()) == 4 for n in per_round), per_round
    assert all(node.startswith("ray:") for n in per_round for node in n)
    assert len(summary["replies_per_node"]) == 2, summary["replies_per_node"]  # clients ran on both nodes
    assert sum(summary["replies_per_node"].values()) == 12

    # the same run on one machine (a new local Ray for the run, as without a cluster)
    with LocalSuperLink(tmp_path / "home-single", env_extra={"RAY_ADDRESS": "local"}) as link:
        single = link.wait(link.submit(run_config={**cfg, "output-dir": str(tmp_path / "single")},
                                       federation_config=FEDERATION), timeout=400)
    assert single.completed, single.log[-4000:]
    single_rounds = read_rounds(tmp_path / "single" / "r")
    assert len({n for r in single_rounds[1:] for n in r["nodes"]}) == 1
    print("accuracy per round, cluster vs one machine:",
          [(r["accuracy"], s["accuracy"]) for r, s in zip(rounds, single_rounds)])
    assert history(tmp_path / "cluster" / "r") == history(tmp_path / "single" / "r")
    assert_none_left((), tmp_path / "home-cluster")
    assert_none_left((), tmp_path / "home-single")


def test_a_worker_node_killed_mid_run_loses_nothing_written_and_resume_continues(tmp_path, cluster):
    n = 8
    cfg = {**BASE, "num-server-rounds": n, "output-dir": str(tmp_path), "run-name": "r", "round-timeout": 60}
    run_dir = tmp_path / "r"
    with LocalSuperLink(tmp_path / "home-kill", env_extra={"RAY_ADDRESS": cluster.address}) as link:
        run_id = link.submit(run_config=cfg, federation_config=FEDERATION)
        wait_for_saved_round(run_dir, 1, explain=lambda: link.logs(run_id)[-3000:])
        cluster.note_pids()
        killed_after = json.loads((run_dir / "state.json").read_text())["round"]
        before = read_rounds(run_dir)[: killed_after + 1]
        kill_now(cluster.worker.pids)  # the worker node dies as a machine would
        outcome = link.wait(run_id, timeout=400)
        cluster.note_pids()
    rounds = read_rounds(run_dir)
    print(f"\nworker killed after round {killed_after}; the run ended {outcome.status}")
    for r in rounds[1:]:
        print(f"  round {r['round']}: accepted {r['clients_accepted']}, failed {r['clients_failed']}, "
              f"nodes {r['nodes']}, failures {[f['reason'][:120] for f in r['failures']]}")
    tail = [line for line in outcome.log.splitlines() if "WARNING" in line or "ERROR" in line][-8:]
    print("  log:", *tail, sep="\n    ")
    assert rounds[: killed_after + 1] == before  # nothing already written is lost or rewritten
    if outcome.completed:
        # the run went on with the head's clients; the lost ones counted like any failing client
        assert [r["round"] for r in rounds] == list(range(n + 1))
        failed = [r["round"] for r in rounds[killed_after + 1:] if r["clients_failed"] > 0]
        assert failed, [r["clients_failed"] for r in rounds]
        # from the round after the first that lost clients (the kill lands while round killed_after + 1
        # or, on a slow machine, a later one trains), the head's node alone
        after = {node for r in rounds[failed[0] + 1:] for node in r["nodes"]}
        assert len(after) == 1 or (not after and failed[0] == n), after
        saved = n
    else:  # or it stopped: summary.json says so, and the rounds saved are the resume point
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed", summary
        saved = json.loads((run_dir / "state.json").read_text())["round"]
    # resume continues, on the head alone, from the last round written (2 more rounds if it completed)
    more = {**cfg, "resume": True, "num-server-rounds": n + 2}
    with LocalSuperLink(tmp_path / "home-resume", env_extra={"RAY_ADDRESS": cluster.address}) as link:
        resumed = link.wait(link.submit(run_config=more, federation_config=FEDERATION), timeout=400)
        cluster.note_pids()
    assert resumed.completed, resumed.log[-4000:]
    rounds = read_rounds(run_dir)
    print(f"  resumed after round {saved}: " + ", ".join(
        f"round {r['round']}: accepted {r['clients_accepted']} on {r['nodes']}" for r in rounds[saved + 1:]))
    assert [r["round"] for r in rounds] == list(range(n + 3))
    assert rounds[: killed_after + 1] == before
    assert json.loads((run_dir / "summary.json").read_text())["resumed_after_round"] == saved
    assert all(r["clients_accepted"] == 4 and len(r["nodes"]) == 1 for r in rounds[saved + 1:])


def test_a_ray_address_nothing_answers_is_named_in_the_runs_first_lines_with_the_fix(tmp_path):
    """Flower's ray.init retries an address nothing answers for minutes (over 300 s measured):
    the ServerApp says why, with the fix, as soon as it starts; the run is then stopped."""
    port = free_port()
    cfg = {**BASE, "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "r"}
    with LocalSuperLink(tmp_path / "home", env_extra={"RAY_ADDRESS": f"127.0.0.1:{port}"}) as link:
        t0 = time.monotonic()
        run_id = link.submit(run_config=cfg, federation_config=FEDERATION)
        said: list[str] = []
        while not said and time.monotonic() - t0 < 180:
            time.sleep(2)
            said = [line for line in link.logs(run_id).splitlines() if "nothing answers at" in line]
        seconds = time.monotonic() - t0
        link.flwr("stop", str(run_id), link.connection)
        outcome = link.wait(run_id, timeout=120)
    print(f"\nunreachable RAY_ADDRESS: said after {seconds:.0f} s; the run ended {outcome.status} after flwr stop")
    assert said, outcome.log[-3000:]
    print("  " + said[0].strip())
    assert f"RAY_ADDRESS = '127.0.0.1:{port}'" in said[0] and "unset RAY_ADDRESS" in said[0]
    assert "flwr stop" in said[0] and "round 1/" not in outcome.log
    assert outcome.status.startswith("finished:"), outcome.status
    assert_none_left((), tmp_path / "home")
