"""What the tests' runs share: the digits run config the end-to-end tests start from, the
run identity Flower's messages need outside a real app, what a finished deployment's run
folder must hold, and a run on the in-process engine that leaves torch's process-wide
settings as it found them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedvls_flwr.app.results import read_rounds

#: scikit-learn's digits, one local epoch, Dirichlet(0.5) label skew: a run of a few seconds a round.
DIGITS_RUN = {"dataset": "digits", "local-epochs": 1, "dirichlet-beta": 0.5}


@contextmanager
def flower_run_identity() -> Iterator[None]:
    """Run, node and task ids set as inside a ServerApp (Flower's Message reads them), then restored."""
    from fedvls_flwr.ops.flower_internals import task_identity

    with task_identity(task_id=1, run_id=1, node_id=0):
        yield


def deployment_run_config(out: Path, nodes: int) -> dict:
    """Two rounds of FedVLS on digits in a deployment of ``nodes`` SuperNodes, into ``out``/e2e."""
    return {**DIGITS_RUN, "method": "fedvls", "num-server-rounds": 2, "output-dir": str(out), "run-name": "e2e",
            "min-nodes": nodes, "round-timeout": 300.0}


def check_results(run_dir: Path, accepted: int) -> list[dict]:
    """A finished two-round run: every round's accuracy, ``accepted`` replies a round, the summary
    and the final model written. Returns its rounds."""
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["clients_accepted"] == accepted
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_round"] == 2
    assert (run_dir / "model_final.npz").stat().st_size > 0
    return rounds


def deployed(tmp_path: Path, config: dict, env: dict[str, str], nodes: int = 2) -> Path:
    """``config`` run by the one-machine launcher on ``nodes`` SuperNodes (no TLS) in
    ``tmp_path``/work: it completed and left no process behind. Returns its run folder."""
    from fedvls_flwr.deploy.local import run_local
    from tests.processes import leftovers

    outcome, run_dir, pids = run_local(nodes, secure=False, auth=False, run_config=config, workdir=tmp_path / "work",
                                       timeout=600, echo=False, env_extra=env)
    assert outcome.completed, f"{outcome.status}\n{outcome.log[-4000:]}"
    assert leftovers(pids, tmp_path) == []
    return run_dir


@contextmanager
def torch_global_state() -> Iterator[None]:
    """torch's process-wide settings that a ServerApp run in this process changes (the
    deterministic mode and cuDNN flags of ``deterministic = true``, the global random
    generator it seeds, the thread count), restored afterwards: a run on the in-process
    engine leaves the rest of the suite's process as it found it."""
    import random

    import numpy as np
    import torch

    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    threads, py_state, np_state = torch.get_num_threads(), random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]
        torch.backends.cuda.matmul.fp32_precision = flags[4]
        torch.backends.cudnn.conv.fp32_precision = flags[5]
        torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)


def run_here(config: dict, nodes: int, *, client_cpus: float = 1, client_app=None, workers: int | None = 1) -> Path:
    """``config`` run on the in-process engine (the app's own ServerApp and ClientApp in this
    process, fedvls_flwr.ops.inprocess) with ``nodes`` simulated SuperNodes and
    ``client_cpus`` torch threads per client (Flower's ``client-resources-num-cpus``); one
    worker (the clients in this process, where a test's monkeypatches and log capture reach
    them) unless ``workers`` says otherwise (None: the client workers the machine holds).
    Returns its run folder; raises what the ServerApp raises (a run that ``flwr run``
    reports ``finished:failed``)."""
    from fedvls_flwr.ops.inprocess import run_in_process

    with torch_global_state():
        return run_in_process(config, nodes, client_cpus=client_cpus, client_app=client_app, workers=workers).run_dir
