"""Where each client ran, and the checks of a run meant for an existing Ray cluster, without
Flower or Ray running."""

import socket
import subprocess
import sys
import types
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedvls_flwr.app import keys
from fedvls_flwr.app.client import query_round, where_it_runs
from fedvls_flwr.app.ray_address import check_cluster_settings, check_ray_address, federation_conflicts
from fedvls_flwr.app.results import summarize
from fedvls_flwr.app.server import _devices_text, count_by
from fedvls_flwr.app.strategy import RunStrategy
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.ops.processes import free_port
from tests.test_strategy import GLOBAL, reply

pytestmark = pytest.mark.usefixtures("run_identity")  # for the messages reply() builds, as in test_strategy


def fake_ray(initialised: bool, node_id: str = "a1b2") -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: initialised  # type: ignore[attr-defined]
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: node_id)  # type: ignore[attr-defined]
    return ray


def test_a_client_in_a_ray_actor_names_its_ray_node_else_its_host(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", fake_ray(True, "f00d"))
    assert where_it_runs() == "ray:f00d"
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False))  # imported, not initialised: not an actor
    assert where_it_runs() == socket.gethostname()
    monkeypatch.delitem(sys.modules, "ray")  # a deployment's ClientApp: Ray is not loaded for this
    assert where_it_runs() == socket.gethostname()
    assert "ray" not in sys.modules


def test_replies_carry_the_node_next_to_the_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", fake_ray(True, "beef"))
    info = query_round(RecordDict(), {"partition-id": 1, "num-partitions": 2})[keys.CLIENT_INFO]
    assert info[keys.NODE] == "ray:beef" and str(info[keys.DEVICE]).startswith(("cpu", "cuda"))


def with_info(node: int, ran_on: str):
    msg = reply(node, {k: np.ones_like(v) for k, v in GLOBAL.items()}, 10, **{"train-loss": 1.0})
    msg.content[keys.CLIENT_INFO] = ConfigRecord({keys.DEVICE: "cpu", keys.NODE: ran_on})
    return msg


def test_the_round_counts_accepted_replies_per_node_and_the_summary_over_the_run():
    strategy = RunStrategy(RunConfig())
    strategy.report.sampled = 4
    replies = [with_info(1, "ray:head"), with_info(2, "ray:worker"), with_info(3, "ray:head"),
               reply(4, error="ray actor died")]
    strategy.aggregate_train(1, replies, GLOBAL)
    clients = strategy.report.clients
    assert [c["ran_on"] for c in clients] == ["ray:head", "ray:worker", "ray:head"]
    assert [c["node"] for c in clients] == ["1", "2", "3"]  # Flower's node id stays where it was
    nodes = count_by(clients, "ran_on")
    assert nodes == {"ray:head": 2, "ray:worker": 1} and count_by(clients, "device") == {"cpu": 3}
    assert _devices_text({"devices": {"cpu": 3}, "nodes": nodes}) == "cpu x3 (2 nodes)"
    assert _devices_text({"devices": {"cpu": 3}, "nodes": {"host": 3}}) == "cpu x3"
    rounds = [{"round": 0, "accuracy": 0.1}, {"round": 1, "accuracy": 0.5, "nodes": nodes},
              {"round": 2, "accuracy": 0.6, "nodes": {"ray:worker": 2}}, {"round": 3, "accuracy": 0.7}]
    assert summarize(rounds)["replies_per_node"] == {"ray:worker": 3, "ray:head": 2}


def test_a_reply_without_the_node_says_its_device_only():
    strategy = RunStrategy(RunConfig())
    strategy.report.sampled = 1
    msg = reply(1, {k: np.ones_like(v) for k, v in GLOBAL.items()}, 10)
    msg.content[keys.CLIENT_INFO] = ConfigRecord({keys.DEVICE: "cpu"})
    msg.content[keys.ARRAYS] = ArrayRecord({k: Array(np.ones_like(v)) for k, v in GLOBAL.items()})
    strategy.aggregate_train(1, [msg], GLOBAL)
    assert "ran_on" not in strategy.report.clients[0] and count_by(strategy.report.clients, "ran_on") == {}


def test_federation_settings_that_ray_refuses_on_a_running_cluster_are_named_with_the_fix():
    federation = {"num-supernodes": 4, "init-args-num-cpus": 2, "init-args-num-gpus": 0, "init-args-logging-level": "INFO"}
    assert federation_conflicts(federation, None) == []
    said = federation_conflicts(federation, "10.0.0.5:6379")
    assert len(said) == 2
    assert "'init-args-num-cpus' = 2 conflicts with RAY_ADDRESS = '10.0.0.5:6379'" in said[0]
    assert "remove init-args-num-cpus" in said[0] and "ray start --num-cpus" in said[0]
    assert "'init-args-num-gpus'" in said[1]


def test_a_ray_address_nothing_answers_is_named_with_the_fix():
    port = free_port()
    said = check_ray_address(f"127.0.0.1:{port}", timeout=1.0)
    assert said is not None and f"nothing answers at 127.0.0.1:{port}" in said
    assert "ray start --head" in said and "unset RAY_ADDRESS" in said
    assert "not host:port" in (check_ray_address("headnode") or "")
    assert "ray://" in (check_ray_address("ray://10.0.0.5:10001") or "")
    with closing(socket.socket()) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert check_ray_address(f"127.0.0.1:{listener.getsockname()[1]}") is None


def test_the_cluster_check_reads_ray_address_and_local_means_none(monkeypatch):
    federation = {"init-args-num-cpus": 2}
    for value in ("", "local"):
        monkeypatch.setenv("RAY_ADDRESS", value)
        assert check_cluster_settings(federation) == []
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    said = check_cluster_settings(federation)
    assert len(said) == 2 and "init-args-num-cpus" in said[0] and "nothing answers" in said[1]


def test_fedvls_check_names_a_conflicting_setting_and_an_unreachable_ray_address(monkeypatch, capsys):
    from fedvls_flwr.experiments.check import main as check_main

    args = ["--run-config", "dataset='digits'", "--no-data", "--federation-config", "num-supernodes=4 init-args-num-cpus=2"]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert check_main(args) == 0  # no cluster named: init-args-num-cpus sizes the run's own Ray
    port = free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert check_main(args) == 2
    err = capsys.readouterr().err
    assert "error: federation setting 'init-args-num-cpus' = 2 conflicts with RAY_ADDRESS" in err
    assert f"nothing answers at 127.0.0.1:{port}" in err and "unset RAY_ADDRESS" in err


#: Flower's simulation runtime importing Ray in one thread (held inside ``ray/__init__`` for half a
#: second, as a loaded machine does) while the ServerApp asks the cluster for its nodes in another.
CONCURRENT_IMPORT = r"""
import importlib.machinery, os, sys, threading, time
from fedvls_flwr.app.ray_address import cluster_nodes

paused = threading.Event()

class HoldFlowerInsideRayInit:
    def find_spec(self, name, path=None, target=None):
        if name != "ray._version" or threading.current_thread().name != "flower":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        loader = spec.loader

        class Held:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                paused.set()
                time.sleep(0.5)
                loader.exec_module(module)

        spec.loader = Held()
        return spec

sys.meta_path.insert(0, HoldFlowerInsideRayInit())
failures = []

def flower_runtime():
    try:
        import ray
        ray.ObjectRef
    except BaseException as err:
        failures.append(repr(err))

flower = threading.Thread(target=flower_runtime, name="flower")
flower.start()
paused.wait(10)
threading.Thread(target=cluster_nodes, args=("127.0.0.1:%d",), daemon=True).start()
flower.join(60)
print("FAILED " + failures[0] if failures else "imported", flush=True)
os._exit(0)  # the asking thread may still wait for a cluster that is not there
"""


def test_asking_a_cluster_for_its_nodes_while_flower_imports_ray_breaks_neither_import():
    pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-c", CONCURRENT_IMPORT % free_port()], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip().splitlines()[-1:] == ["imported"], done.stdout[-2000:] + done.stderr[-2000:]
