"""Deployment mode end to end on 127.0.0.1: a real SuperLink and real SuperNodes.

Three runs of 2 rounds of FedVLS on digits (tiny MLP, 1 local epoch): insecure through the
launcher, TLS + SuperNode authentication with certificates made here (an unregistered key
is refused), and node-local folder data with different class subsets per node (plus a node
whose data is missing, which fails with a clear error while the run goes on). Every process
is started in its own process group and stopped by PID; the tests check none is left.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fedvls_flwr.deploy.breakdown import PHASES, breakdown
from fedvls_flwr.deploy.certs import make_certificates
from fedvls_flwr.deploy.local import run_local
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.processes import leftovers
from tests.runs import check_results, deployment_run_config
from tests.tiny_data import DIGITS, write_digit_folder

pytestmark = pytest.mark.e2e

def test_insecure_deployment_two_supernodes(tmp_path, node_env):
    """Also: the breakdown of its DEBUG logs finds both rounds through the app's structured events."""
    outcome, run_dir, pids = run_local(
        2, secure=False, auth=False, run_config=deployment_run_config(tmp_path / "runs", 2),
        workdir=tmp_path / "work", timeout=600, echo=False,
        env_extra={**node_env, "FLWR_LOG_LEVEL": "DEBUG"},
    )
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert len(pids) == 4  # SuperLink, 2 SuperNodes, flwr run
    assert leftovers(pids, tmp_path) == []
    rounds = check_results(run_dir, accepted=2)
    assert rounds[-1]["clients_failed"] == 0
    # Round 1 prepared each node's partition and cached it; round 2 read the cache.
    assert len(list((tmp_path / "node-cache").glob("digits-*.npz"))) == 2
    logs = "".join((tmp_path / "work" / "flwr" / f"node-{i}.log").read_text() for i in range(2))
    assert logs.count("from the cache") >= 2
    # FedVLS needs no site statistic on the server: no reply carried the sites' label
    # distribution, and the run folder holds none (share-class-counts is off by default)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reply_metrics"] and not {"class-counts", "num-vacant"} & set(summary["reply_metrics"])
    assert summary["engine"] == "deployment"
    assert not (run_dir / "clients.json").exists()
    assert all("num-vacant" not in r["train"] and "local_update" not in r for r in rounds[1:])
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl"):
            assert not re.search(r'"(class[-_]counts|num[-_]vacant)"', path.read_text()), path.name
    phases = breakdown(tmp_path / "work")["rounds"]
    assert [r["round"] for r in phases] == [1, 2]
    for r in phases:
        assert 0 < r["seconds"] < 300 and 0 <= r["data"] < r["seconds"], r
        assert all(np.isfinite(r[p]) for p in PHASES), r


def test_tls_and_supernode_authentication(tmp_path, node_env):
    certs = make_certificates(tmp_path / "certs", ["127.0.0.1"], ["a", "b", "intruder"])
    for private, _public in certs.supernode_keys.values():
        assert oct(private.stat().st_mode & 0o777) == "0o600"
    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    try:
        link.start(tls=certs.tls, supernode_auth=True)
        config = (link.home / "config.toml").read_text()
        assert "insecure" not in config and "root-certificates" in config
        registered = {name: link.register_supernode(certs.supernode_keys[name][1], name=name) for name in ("a", "b")}

        # A SuperNode whose key was never registered is refused and gives up.
        intruder = link.start_supernode(
            "intruder", {"partition-id": 0, "num-partitions": 2},
            private_key=certs.supernode_keys["intruder"][0], max_retries=1,
        )
        intruder.wait(timeout=120)
        assert intruder.returncode == 1  # the guide says so; the 305 is only in the log
        assert "Failed to activate SuperNode" in (link.home / "intruder.log").read_text()

        for i, name in enumerate(("a", "b")):
            link.start_supernode(
                name, {"partition-id": i, "num-partitions": 2}, private_key=certs.supernode_keys[name][0]
            )
        outcome = link.run_streaming(run_config=deployment_run_config(tmp_path / "runs", 2), timeout=600, echo=False)
        nodes = {int(n["node-id"]): n["status"] for n in link.supernodes()}
    finally:
        link.stop()
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert set(nodes) == set(registered.values())  # only the registered ones ever joined
    assert leftovers(link.started_pids, tmp_path) == []
    check_results(tmp_path / "runs" / "e2e", accepted=2)


def test_node_local_folder_data_with_vacant_classes(tmp_path, node_env):
    write_digit_folder(tmp_path / "site-a", [0, 1, 2, 3, 4, 5])
    write_digit_folder(tmp_path / "site-b", [4, 5, 6, 7, 8, 9])
    missing = tmp_path / "site-c-not-mounted"
    configs = [
        {"dataset": "folder", "data-dir": str(tmp_path / "site-a"), "classes": DIGITS, "partition-id": 0,
         "test-fraction": 0.2},
        {"dataset": "folder", "data-dir": str(tmp_path / "site-b"), "classes": DIGITS, "partition-id": 1,
         "test-fraction": 0.2},
        {"dataset": "folder", "data-dir": str(missing), "classes": DIGITS, "partition-id": 2},
    ]
    outcome, run_dir, pids = run_local(
        3, secure=False, auth=False, configs=configs,
        # no central test set: the global model is evaluated on the sites' held-out splits
        # share-class-counts: the sites send their class counts (a diagnostic, opt-in), so
        # clients.json can show which classes each site holds
        run_config={**deployment_run_config(tmp_path / "runs", 3), "evaluation": "federated", "share-class-counts": True},
        workdir=tmp_path / "work", timeout=600, echo=False, env_extra=node_env,
    )
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert leftovers(pids, tmp_path) == []
    rounds = check_results(run_dir, accepted=2)
    for r in rounds[1:]:
        # The node without data answered with an error naming the path; the others went on.
        assert r["clients_failed"] == 1
        assert str(missing) in r["failures"][0]["reason"] and "not found" in r["failures"][0]["reason"]
        assert r["evaluation"] == "federated" and r["eval_nodes"] == 2 and r["eval_examples"] == 60
        assert 0.0 <= r["accuracy"] <= 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluation"] == "federated"
    clients = {c["partition_id"]: c["class_counts"] for c in json.loads((run_dir / "clients.json").read_text())["clients"]}
    assert clients[0] == [20] * 6 + [0] * 4  # 25 per class, 5 held out for local evaluation
    assert clients[1] == [0] * 4 + [20] * 6
    assert {"class-counts", "num-vacant"} <= set(summary["reply_metrics"])
    assert all(r["train"]["num-vacant"] == 4 for r in rounds[1:])
    node_c_log = (tmp_path / "work" / "flwr" / "node-2.log").read_text()
    assert "folder dataset not found" in node_c_log
