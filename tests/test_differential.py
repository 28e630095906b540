"""The app against the plain reference loop, for every registered part and for combinations.

Each case runs twice with the same run config: through the app (its ServerApp and ClientApp on
the in-process engine: messages, replies, checks, the server's parts, client state in the
nodes' Contexts) and through ``bench/reference_loop.py``, which writes every local optimizer,
server optimizer, client state, the sampling and FedConcat out from docs/methods.md (only the
objectives' per-step loss is shared: they have their own loop references in
test_objectives.py). Every round's accuracy (exactly), test loss, sampled partitions and the
server parts' reports (FedExP's step size, FedGF's c and D), and the final round state's arrays
must agree to float rounding.

Tolerance: the arrays' largest difference within ``RTOL`` = 1e-5 of the array's largest
magnitude (elementwise relative error means nothing for entries that are near zero by
cancellation). Most cases agree bit for bit; where the loop's float64 server formulas meet the
app's float32 arithmetic (FedAdam, FedYogi, FedAdagrad, FedAvgM, FedGF's w_g) they differ by
float32 rounding, which the following rounds of training grow to about 1e-6. The configurations
are chosen so that training does not amplify rounding beyond that: FedAdagrad at its default eta
= 0.1 moves every weight by about 0.1 in its first step, after which two local epochs grow the
rounding to 1e-3 (so it runs at eta = 0.01 here), and MOON at moon-mu = 0.5 with carried momentum
collapses to one class, where it does the same.

Small and fast: scikit-learn digits, 4 nodes, one local epoch, 3 rounds (FedConcat 4, across
its stage boundary), one torch thread, ``deterministic = true``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.reference_parts import COVERED, NotCovered, check_covered
from fedvls_flwr.app.results import load_checkpoint, read_rounds
from fedvls_flwr.config.registry import KINDS

NODES = 4
RTOL = 1e-5
BASE: dict[str, Any] = {
    "dataset": "digits", "local-epochs": 1, "dirichlet-beta": 0.5, "num-server-rounds": 3, "seed": 3,
    "deterministic": True, "torch-threads": 1, "device": "cpu", "method": "fedavg",
}

#: What a part needs to show its effect in three rounds (its defaults are a no-op or faint).
PART_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("method", "fedprox"): {"fedprox-mu": 0.5},
    ("method", "moon"): {"moon-mu": 0.5},
    ("server-optimizer", "fedavgm"): {"fedavgm-lr": 0.8, "fedavgm-momentum": 0.5},
    ("server-optimizer", "fedadagrad"): {"fedadagrad-eta": 0.01},
    ("protocol", "fedconcat"): {"num-server-rounds": 4, "fedconcat-encoder-rounds": 2, "fedconcat-assignment": "0,1,0,1"},
}

#: Each kind combined with another, client state across rounds, partial participation.
COMBINATIONS: dict[str, dict[str, Any]] = {
    "fedvls+sam+fedadam": {"method": "fedvls", "local-optimizer": "sam", "server-optimizer": "fedadam"},
    "moon+carry+fedexp-average": {"method": "moon", "moon-mu": 0.5, "optimizer-state": "carry",
                                  "server-optimizer": "fedexp", "fedexp-eval": "average-last-two"},
    "fedgf+fedavgm": {"method": "fedlc", "local-optimizer": "fedgf", "server-optimizer": "fedavgm",
                      "fedavgm-momentum": 0.5},
    "fedconcat-kmeans+fedprox": {"method": "fedprox", "fedprox-mu": 0.5, "protocol": "fedconcat",
                                 "num-server-rounds": 4, "fedconcat-encoder-rounds": 2},
    # half the sites a round: state kept across the rounds a site sits out, a cluster left untrained
    "partial:moon+carry+fedyogi": {"method": "moon", "moon-mu": 0.1, "optimizer-state": "carry",
                                   "server-optimizer": "fedyogi", "fraction-train": 0.5, "num-server-rounds": 4},
    "partial:fedgf-adaptive": {"method": "fedntd", "local-optimizer": "fedgf", "fedgf-c-mode": "adaptive",
                               "fedgf-threshold": 0.22, "fedgf-window": 2, "fraction-train": 0.5, "num-server-rounds": 4},
    "partial:fedconcat-concat-head+sam": {"method": "fedvls", "local-optimizer": "sam", "protocol": "fedconcat",
                                          "fedconcat-head-init": "concat", "fedconcat-clusters": 3,
                                          "fedconcat-assignment": "0,1,2,1", "fraction-train": 0.5,
                                          "num-server-rounds": 4, "fedconcat-encoder-rounds": 2},
    "two-epochs:fedlmd+carry+fedadagrad": {"method": "fedlmd", "local-epochs": 2, "optimizer-state": "carry",
                                           "server-optimizer": "fedadagrad", "fedadagrad-eta": 0.01},
    # BatchNorm: integer buffers averaged, a short last batch merged, the teacher in train mode
    "batchnorm:fedvls-teacher-train+sam+fedexp": {
        "model": "resnet32", "train-pool-size": 200, "batch-size": 24, "num-server-rounds": 2, "method": "fedvls",
        "teacher-mode": "train", "local-optimizer": "sam", "server-optimizer": "fedexp"},
}

#: Round-record fields both sides report, compared to float tolerance where the app has them.
REPORTS = ("server_step_size", "fedgf_c", "fedgf_divergence")


def every_part() -> list[tuple[str, str]]:
    return [(kind, part.name) for kind, (parts, _) in KINDS.items() for part in parts]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("differential")


@cache
def _app(items: tuple[tuple[str, Any], ...], out: Path) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The app's rounds and final round state (cached: the default parts of the four kinds are one run)."""
    from fedvls_flwr.ops.inprocess import run_in_process

    done = run_in_process({**dict(items), "output-dir": str(out), "run-name": f"run{_app.cache_info().currsize}"},
                          NODES, client_cpus=1)
    _, arrays = load_checkpoint(done.run_dir / "checkpoint.npz")
    parts_state = tuple(f"{kind}/" for kind in KINDS)  # the server parts' own state, not the round's
    return read_rounds(done.run_dir), {k: v for k, v in arrays.items() if not k.startswith(parts_state)}


@cache
def _reference(items: tuple[tuple[str, Any], ...]) -> dict:
    from bench.reference_loop import RefConfig, run

    return run(RefConfig.make(num_clients=NODES, **{k.replace("-", "_"): v for k, v in items}), keep_arrays=True)


def assert_same_run(config: dict[str, Any], runs_dir: Path) -> None:
    """The app and the reference loop, round by round and in the final state (see the module docstring)."""
    items = tuple(sorted({**BASE, **config}.items()))
    app_rounds, app_arrays = _app(items, runs_dir)
    ref = _reference(items)
    ref_rounds = ref["rounds"]
    assert [r["round"] for r in app_rounds] == [r["round"] for r in ref_rounds]
    for a, b in zip(app_rounds, ref_rounds):
        where = f"round {a['round']}"
        assert a["accuracy"] == b["accuracy"], f"{where}: accuracy app {a['accuracy']} vs reference {b['accuracy']}"
        assert (a["loss"] is None) == (b["loss"] is None), where
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=RTOL), f"{where}: test loss"
        if a["round"] > 0:
            assert a["sampled_partitions"] == b["sampled_partitions"], where
            assert a.get("stage") == b.get("stage"), where
        for field in REPORTS:
            if field in a or field in b:
                assert a.get(field) == pytest.approx(b.get(field), rel=RTOL, nan_ok=True), f"{where}: {field}"
    want = ref["arrays"]
    assert sorted(app_arrays) == sorted(want), "the final round state's arrays differ in their names"
    for key, expected in want.items():
        got = app_arrays[key]
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), key
        diff = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)), initial=0.0))
        scale = float(np.max(np.abs(expected.astype(np.float64)), initial=0.0)) or 1.0
        assert diff <= RTOL * scale, f"{key}: largest difference {diff:.3g}, {diff / scale:.3g} of the array's scale"


@pytest.mark.parametrize("kind, name", every_part(), ids=[f"{k}={n}" for k, n in every_part()])
def test_every_registered_part_computes_what_its_reference_computes(kind, name, runs_dir):
    if name not in COVERED.get(kind, ()):
        pytest.fail(f"{kind} '{name}' is registered but bench/reference_loop.py has no reference for it: write "
                    f"its formula out in bench/reference_parts.py (or the loop) and list it in COVERED[{kind!r}]")
    assert_same_run({kind: name, **PART_SETTINGS.get((kind, name), {})}, runs_dir)


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_combinations_compute_what_the_reference_computes(name, runs_dir):
    assert_same_run(COMBINATIONS[name], runs_dir)


def test_the_reference_knows_only_registered_parts():
    """A stale entry would hide a renamed part; an unknown one stops the loop by name."""
    for kind, names in COVERED.items():
        assert set(names) <= {p.name for p in KINDS[kind][0]}, kind
    values = {kind: default for kind, (_, default) in KINDS.items()}
    check_covered(values)
    with pytest.raises(NotCovered, match="local-optimizer 'adamw'"):
        check_covered({**values, "local-optimizer": "adamw"})
