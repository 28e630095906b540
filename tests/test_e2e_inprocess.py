"""The in-process engine against Flower's Ray simulation: the same apps, the same numbers.

Each configuration runs three times from the same run config with ``deterministic = true``: as
a real ``flwr run`` on a local SuperLink (Ray simulation, clients in Ray actors), on the
in-process engine with one worker (``fedvls run --workers 1``: the clients one after another in
the test's process) and on the in-process engine with its client workers (two worker processes
on this 2-core machine at ``client-resources-num-cpus = 1``, a round's clients at once, each
node's state carried between workers). Everything the run computed must be equal bit for bit:
every field of every round's record in rounds.jsonl except its seconds and the name of the
machine the replies ran on (a Ray node id there, the host name here), the final model and the
checkpoint (the round state and every server part's state), clients.json and protocol.json,
and the summary (but its wall time and folder). Configurations: FedVLS with FedAdam (a server
optimizer with state), FedGF (a client part's server companion and its downlink), and
FedConcat across its stage boundary (K-means on the sites' shares, the encoders kept in the
nodes' state, a new head).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedvls_flwr.app.results import load_checkpoint, read_rounds
from fedvls_flwr.ops.inprocess import run_in_process
from fedvls_flwr.ops.launch import PROJECT_DIR, LocalSuperLink
from tests.runs import DIGITS_RUN

pytestmark = pytest.mark.e2e

NODES = 4
#: What differs between two engines by design: time, and where the replies ran.
NOT_COMPUTED = {"seconds", "nodes", "wall_seconds", "run_dir", "engine"}
CONFIGS = {
    "fedvls-fedadam": {"method": "fedvls", "server-optimizer": "fedadam", "num-server-rounds": 3},
    "fedgf": {"method": "fedavg", "local-optimizer": "fedgf", "num-server-rounds": 3},
    "fedconcat": {"method": "fedavg", "protocol": "fedconcat", "num-server-rounds": 4, "fedconcat-encoder-rounds": 2},
}


@pytest.fixture(scope="module")
def link(tmp_path_factory):
    with LocalSuperLink(tmp_path_factory.mktemp("flwr-home")) as superlink:
        yield superlink


def computed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in NOT_COMPUTED}


def arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = read_rounds(a), read_rounds(b)
    assert [computed(r) for r in ra] == [computed(r) for r in rb]
    for name in ("model_final.npz", "checkpoint.npz", "checkpoint read whole"):
        # the last: the checkpoint with the arrays it takes from its frozen file (FedConcat's encoders)
        xa, xb = (load_checkpoint(d / "checkpoint.npz")[1] if name.endswith("whole") else arrays(d / name)
                  for d in (a, b))
        assert sorted(xa) == sorted(xb), name
        for key in xa:
            floats = xa[key].dtype.kind in "fc"  # the checkpoint's frozen-file names are strings
            assert xa[key].dtype == xb[key].dtype and np.array_equal(xa[key], xb[key], equal_nan=floats), (name, key)
    for name in ("clients.json", "protocol.json"):
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert json.loads((a / name).read_text()) == json.loads((b / name).read_text()), name
    sa, sb = (summary_computed(json.loads((d / "summary.json").read_text())) for d in (a, b))
    assert sa == sb


def summary_computed(summary: dict) -> dict:
    """A summary less time, machine names (replies per node), the folder it was written to and the engine."""
    out = {k: v for k, v in summary.items() if k not in NOT_COMPUTED | {"replies_per_node"}}
    out["config"] = {k: v for k, v in out["config"].items() if k != "output-dir"}
    if "stages" in out:
        out["stages"] = {stage: {k: v for k, v in about.items() if k != "seconds"} for stage, about in out["stages"].items()}
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_in_process_engine_computes_what_the_ray_simulation_computes(name, link, tmp_path):
    config = {**DIGITS_RUN, **CONFIGS[name], "deterministic": True, "seed": 3}
    ray_dir, here_dir, workers_dir = tmp_path / "ray", tmp_path / "here", tmp_path / "workers"
    outcome = link.wait(link.submit(PROJECT_DIR, run_config={**config, "output-dir": str(ray_dir), "run-name": name},
                                    federation_config={"num-supernodes": NODES, "client-resources-num-cpus": 1}),
                        timeout=900)
    assert outcome.completed, outcome.log[-3000:]
    done = run_in_process({**config, "output-dir": str(here_dir), "run-name": name}, NODES, client_cpus=1, workers=1)
    assert done.run_dir == here_dir / name and done.workers.startswith("1 worker: the clients run one after another")
    pooled = run_in_process({**config, "output-dir": str(workers_dir), "run-name": name}, NODES, client_cpus=1)
    assert pooled.workers.startswith("2 workers: 2 on the CPU, 1 thread each"), pooled.workers
    assert pooled.extra["crashes"] == []
    ray_rounds = read_rounds(ray_dir / name)
    assert len(ray_rounds) == config["num-server-rounds"] + 1
    assert all(n.startswith("ray:") for r in ray_rounds[1:] for n in r["nodes"])  # it did run in Ray actors
    assert_same_run(ray_dir / name, here_dir / name)
    assert_same_run(ray_dir / name, workers_dir / name)
    engines = [json.loads((d / name / "summary.json").read_text())["engine"] for d in (ray_dir, here_dir, workers_dir)]
    assert engines == ["simulation", "inprocess", "inprocess"]  # what a report tells them apart by


def test_a_client_that_raises_is_a_failed_reply_on_both_engines(link, tmp_path, monkeypatch):
    """Partition 1 raises in round 2: both engines record the same failure (its reason is the
    client's own message) and go on with the other clients' replies."""
    from flwr.clientapp import ClientApp

    from fedvls_flwr.app import client_app as production
    from tests.fault_injection import FAULT_ENV, fault_app, inject_faults

    config = {**DIGITS_RUN, "method": "fedavg", "num-server-rounds": 3, "min-fit-fraction": 0.5, "round-retries": 0}
    app_dir = fault_app(tmp_path / "app")
    link_env = {FAULT_ENV: "raise:1:2"}
    faulty = LocalSuperLink(tmp_path / "home-faults", env_extra=link_env)
    with faulty:
        outcome = faulty.wait(faulty.submit(app_dir, run_config={**config, "output-dir": str(tmp_path / "ray"),
                                                                 "run-name": "f"},
                                            federation_config={"num-supernodes": NODES, "client-resources-num-cpus": 1}),
                              timeout=900)
    assert outcome.completed, outcome.log[-3000:]
    monkeypatch.setenv(FAULT_ENV, "raise:1:2")
    test_app = ClientApp(mods=[inject_faults])
    test_app.train()(production.train)
    test_app.evaluate()(production.evaluate)
    test_app.query()(production.query)
    run_in_process({**config, "output-dir": str(tmp_path / "here"), "run-name": "f"}, NODES, client_cpus=1,
                   client_app=test_app)
    # the same ClientApp on the client workers (they import it by name and read the fault from the environment)
    pooled = run_in_process({**config, "output-dir": str(tmp_path / "workers"), "run-name": "f"}, NODES,
                            client_cpus=1, client_app="tests.fault_injection:fault_client_app")
    assert pooled.workers.startswith("2 workers")
    ray_rounds = read_rounds(tmp_path / "ray" / "f")
    for here_rounds in (read_rounds(tmp_path / "here" / "f"), read_rounds(tmp_path / "workers" / "f")):
        for rounds in (ray_rounds, here_rounds):
            assert [r["clients_failed"] for r in rounds[1:]] == [0, 1, 0]
            assert rounds[2]["failures"][0]["partition_id"] == 1
        strip = {"node"}  # Flower's random node ids
        assert ([{k: v for k, v in f.items() if k not in strip} for f in ray_rounds[2]["failures"]]
                == [{k: v for k, v in f.items() if k not in strip} for f in here_rounds[2]["failures"]])
        assert ([computed(r) | {"failures": None} for r in ray_rounds]
                == [computed(r) | {"failures": None} for r in here_rounds])


def test_fedvls_run_refuses_bad_input_at_once_and_runs_a_good_config(tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    t0 = time.perf_counter()
    bad = subprocess.run([sys.executable, "-m", "fedvls_flwr", "run", "--run-config", "lamda-dis=0.2"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "unknown run config key 'lamda-dis'" in bad.stderr and "lambda-dis" in bad.stderr
    few = subprocess.run([sys.executable, "-m", "fedvls_flwr", "run", "--run-config", "min-nodes=5",
                          "--federation-config", "num-supernodes=4"], capture_output=True, text=True, env=env, timeout=120)
    assert few.returncode == 2 and "min-nodes" in few.stderr
    assert time.perf_counter() - t0 < 60
    good = subprocess.run([sys.executable, "-m", "fedvls_flwr", "run", "--run-config",
                           f"dataset='digits' local-epochs=1 num-server-rounds=3 output-dir='{tmp_path}' run-name='cli'",
                           "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert good.returncode == 0, good.stderr[-3000:]
    assert f"done: {tmp_path / 'cli'}" in good.stdout
    assert [r["round"] for r in read_rounds(tmp_path / "cli")] == [0, 1, 2, 3]
