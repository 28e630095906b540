"""Refusals that need the real engines: one run folder, one run (two `fedvls run` at once; a
`flwr run` on a folder another run holds), and a Ray simulation whose clients ask for a GPU where
there is none, refused by the ServerApp before round 1 (Flower itself fails only once round 1
waits, with "ActorPool is empty" and a traceback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedvls_flwr.app.results import LOCK_FILE, RunFolderLock
from fedvls_flwr.config.client_resources import visible_gpus
from fedvls_flwr.ops.launch import PROJECT_DIR, LocalSuperLink
from tests.runs import DIGITS_RUN

pytestmark = pytest.mark.e2e

TIMEOUT = 300


def fedvls_run(run_config: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedvls_flwr", "run", "--run-config", run_config,
                             "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_fedvls_runs_started_together_on_one_folder_one_runs_the_other_is_refused(tmp_path):
    same = f"dataset='digits' num-server-rounds=8 local-epochs=10 output-dir='{tmp_path}' run-name='twin'"
    first, second = fedvls_run(same + " method='fedavg'"), fedvls_run(same + " method='fedvls' lr=0.05")
    outcomes = {}
    for name, proc in (("fedavg", first), ("fedvls", second)):
        out, err = proc.communicate(timeout=TIMEOUT)
        outcomes[name] = (proc.returncode, err, proc.pid)
    winners = [name for name, (code, _, _) in outcomes.items() if code == 0]
    assert len(winners) == 1, {k: (c, e[-2000:]) for k, (c, e, _) in outcomes.items()}
    (loser,) = set(outcomes) - set(winners)
    code, err, _ = outcomes[loser]
    assert code == 2, err[-3000:]
    holder_pid = outcomes[winners[0]][2]
    assert f"run folder {tmp_path / 'twin'} is in use by another run (pid {holder_pid} on host " in err, err[-3000:]
    summary = json.loads((tmp_path / "twin" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["config"]["method"] == winners[0]
    assert summary["rounds_completed"] == 8 and not (tmp_path / "twin" / LOCK_FILE).exists()


@pytest.fixture(scope="module")
def link(tmp_path_factory):
    with LocalSuperLink(tmp_path_factory.mktemp("flwr-home")) as superlink:
        yield superlink


def test_flwr_run_on_a_folder_another_run_holds_is_refused_naming_it(link, tmp_path):
    run_dir = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from fedvls_flwr.app.results import "
                               "RunFolderLock; RunFolderLock(sys.argv[1]).acquire(); print('held', flush=True); "
                               "time.sleep(600)", str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        run_config = {**DIGITS_RUN, "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "held"}
        outcome = link.wait(link.submit(PROJECT_DIR, run_config=run_config, federation_config={"num-supernodes": 3}),
                            timeout=TIMEOUT)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    assert outcome.status == "finished:failed", outcome.log[-3000:]
    assert f"run folder {run_dir} is in use by another run (pid {holder.pid}" in outcome.log, outcome.log[-3000:]
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing of the refused run
    lock = RunFolderLock(run_dir).acquire()  # the holder is gone: stale, taken over
    assert lock.took_over is not None and lock.took_over.pid == holder.pid
    lock.release()


@pytest.mark.skipif(visible_gpus() > 0, reason="this host has a GPU: a GPU share can be served")
def test_a_gpu_share_where_there_is_no_gpu_fails_the_simulation_before_round_1(link, tmp_path):
    run_config = {**DIGITS_RUN, "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "gpu"}
    t0 = time.monotonic()
    outcome = link.wait(link.submit(PROJECT_DIR, run_config=run_config, federation_config={
        "num-supernodes": 3, "client-resources-num-cpus": 1, "client-resources-num-gpus": 0.25}), timeout=TIMEOUT)
    assert outcome.status == "finished:failed", outcome.log[-3000:]
    assert ("client-resources-num-gpus = 0.25 gives every simulated client a share of a GPU, but this machine has "
            "no GPU") in outcome.log, outcome.log[-3000:]
    assert "round 1: training" not in outcome.log and not (tmp_path / "gpu").exists()
    assert time.monotonic() - t0 < TIMEOUT
