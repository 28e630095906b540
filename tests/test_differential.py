"""The app against an independent reference, for every registered part and every one of its settings.

Each case runs twice with the same settings: through the app (its ServerApp and ClientApp on the
in-process engine: messages, replies, checks, the server's parts, client state in the nodes'
Contexts) and through ``bench/reference_loop.py``, which shares no code with the app (it imports
nothing of the package: tests/test_layout.py): it reads the data files itself, partitions them,
builds its networks, writes every objective, local step, server optimizer and FedConcat out from
their sources, and keeps its own defaults. Both sides get only the settings the case names, so a
default that differs is a difference too. Only the initial weights are shared: the reference loads
the app's by state-dict key, so both start equal. Every round's accuracy, test loss, sampled
partitions and the server parts' reports (FedExP's step size, FedGF's c and D), and every array of
the final round state must agree.

How closely (``Case.rtol``; arrays compared by their largest difference over the array's largest
magnitude, or 1% of the model's largest if that is more: an entry near zero by cancellation, or a
BatchNorm bias a few steps from its initial 0, carries the rounding of the larger numbers it is
computed from):

* ``EXACT``: bit for bit, where both sides do the same float32 arithmetic: plain cross-entropy,
  torch.optim.SGD's step, SAM's ascent, FedAvg's float64 average and FedExP's float64 step (the
  step size itself, float64 on both sides summed in another order, to ``FLOAT64``), on every dataset
  and network;
* ``FLOAT`` = 1e-5: where the reference computes a loss or a server step in float64 and the app in
  float32 (every other objective, FedAvgM, FedAdam, FedYogi, FedAdagrad): a float32 rounding per
  step, which the cases' rounds of training grow to at most 1.4e-6 (measured);
* ``ILL_CONDITIONED`` = 1e-3: FedMR's loss standardises each class's features by
  sqrt(var + 1e-8), and features whose variance within a class is near 1e-8 (ReLU units barely on)
  multiply float32 rounding by up to 1e4 from one step to the next: after two rounds of one step
  the app is 7e-5 from the reference, and the reference's own loss computed in float32 instead of
  float64 is 1e-5 from itself. Its formula is held exactly by tests/test_fedmr.py.

Some configurations are chaotic in float32 however the loss is written: the reference run with its
losses in float32 instead of float64 parts from itself as far as the app does from it (measured:
FedNTD over 3 epochs of batches of 32, 3e-3 both; FedDecorr over 3 rounds of 6 steps, 0.18 both;
ResNet-32 with FedVLS's teacher in train mode, 2 rounds, 0.018 both; and with SAM and FedExP 0.65).
The cases keep out of them: fewer steps, a round less, or FedAvg's exact loss.

The cases feel small effects: ``long:`` cases take 3 local epochs of small batches with weight
decay 5e-3, so a dropped weight-decay term, an epsilon off by 10x or a coefficient off by 10% moves
the result far beyond the tolerance (scripts/mutations.py plants such bugs; this test kills them).

The guard: every registered part has a reference implementation and the reference's table has its
settings; every setting is set off its default in some case, and there changes what the reference
computes (so the comparison sees it). Small and fast: scikit-learn's digits or tiny generated files
in the real formats, 4 nodes, 1-3 rounds, one torch thread, ``deterministic = true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.reference_loop import IMPLEMENTATIONS
from bench.reference_settings import GENERAL, NOT_MODELLED, PARTS
from fedvls_flwr.app.results import load_checkpoint, read_rounds

NODES = 4
EXACT, FLOAT, ILL_CONDITIONED = 0.0, 1e-5, 1e-3
#: The server parts' reports (FedExP's step size, FedGF's D) in an exact case: float64 on both sides,
#: summed in another order.
FLOAT64 = 1e-12
BASE: dict[str, Any] = {
    "dataset": "digits", "local-epochs": 1, "dirichlet-beta": 0.5, "num-server-rounds": 3, "seed": 3,
    "deterministic": True, "torch-threads": 1, "device": "cpu", "method": "fedavg",
}
GENERATED = "<generated>"  # the module's folder of tiny data files (``data-dir``)
#: A BatchNorm model, two or three batches per client (a teacher in train mode sees each batch's
#: statistics), one round: in a second round with a teacher or SAM, weights 1e-6 apart after the
#: first move a BatchNorm bias's next update by 2-3%, as much between the reference's own float32
#: and float64 losses (see above); one round agrees to 2e-6.
BN = {"model": "resnet32", "train-pool-size": 120, "batch-size": 16, "num-server-rounds": 1, "dirichlet-beta": 0.1}
#: Three local epochs of small batches, weight decay 5e-3: what a small coefficient does is felt.
LONG = {"local-epochs": 3, "batch-size": 32, "weight-decay": 5e-3}


@dataclass(frozen=True)
class Case:
    settings: dict[str, Any] = field(default_factory=dict)
    rtol: float = FLOAT


#: What a registered part's case sets (its defaults are a no-op or too faint to see in three rounds).
PART_CASES: dict[tuple[str, str], Case] = {
    ("method", "fedavg"): Case({}, EXACT),
    ("method", "fedprox"): Case({"fedprox-mu": 0.5}),
    ("method", "moon"): Case({"moon-mu": 0.5}),
    ("method", "fedmr"): Case({"batch-size": 512, "num-server-rounds": 2}, ILL_CONDITIONED),
    # one step per client and round: FedDecorr's standardisation is ill-conditioned as FedMR's
    # over many steps (measured 0.04 after two rounds of six steps), well within FLOAT over three
    ("method", "feddecorr"): Case({"batch-size": 512}),
    ("local-optimizer", "sgd"): Case({}, EXACT),
    ("local-optimizer", "sam"): Case({}, EXACT),
    ("server-optimizer", "fedavg"): Case({}, EXACT),
    ("server-optimizer", "fedexp"): Case({}, EXACT),
    ("server-optimizer", "fedavgm"): Case({"fedavgm-lr": 0.8, "fedavgm-momentum": 0.5}),
    # Flower's default eta = 0.1 moves every weight by about 0.1 in one step, and the next rounds of
    # training grow its float32 rounding to 1e-3
    ("server-optimizer", "fedadagrad"): Case({"fedadagrad-eta": 0.01}),
    ("protocol", "standard"): Case({}, EXACT),
    ("protocol", "fedconcat"): Case({"num-server-rounds": 4, "fedconcat-encoder-rounds": 2,
                                     "fedconcat-assignment": "0,1,0,1"}, EXACT),
}

#: Every part's settings off their defaults, parts combined, data and models, small effects.
CASES: dict[str, Case] = {
    # ---- settings
    "moon:tau+dim": Case({"method": "moon", "moon-mu": 0.5, "moon-tau": 0.2, "moon-projection-dim": 32}),
    "fedrs:proportional": Case({"method": "fedrs", "fedrs-form": "proportional", "fedrs-alpha": 0.3}),
    "fedlmd:beta+tau": Case({"method": "fedlmd", "fedlmd-beta": 0.5, "fedlmd-tau": 2.0}),
    "feddecorr:beta": Case({"method": "feddecorr", "feddecorr-beta": 1.0, "batch-size": 512, "num-server-rounds": 2}),
    "fedmr:deco": Case({"method": "fedmr", "fedmr-deco": 1.0, "batch-size": 512, "num-server-rounds": 2},
                       ILL_CONDITIONED),
    "fedlc:paper": Case({"method": "fedlc", "fedlc-form": "paper", "fedlc-tau": 1.0}),
    "fedntd:beta+tau": Case({"method": "fedntd", "fedntd-beta": 0.3, "fedntd-tau": 2.0}),
    "fedvls:weights": Case({"method": "fedvls", "lambda-dis": 0.5, "logit-weight": 0.05, "dirichlet-beta": 0.1}),
    "fedvls:ablation": Case({"method": "fedvls", "use-dis": False, "use-logit": False, "dirichlet-beta": 0.1}),
    "fedvls-paper:weights": Case({"method": "fedvls-paper", "lambda-dis": 0.5, "paper-logit-weight": 0.1,
                                  "dirichlet-beta": 0.1}),
    "fedvls-paper:ablation": Case({"method": "fedvls-paper", "use-dis": False, "use-logit": False,
                                   "dirichlet-beta": 0.1}),
    "sam:rho": Case({"local-optimizer": "sam", "sam-rho": 0.3}, EXACT),
    "fedgf:fixed": Case({"local-optimizer": "fedgf", "sam-rho": 0.05, "fedgf-rho-g": 0.5, "fedgf-c": 0.6}),
    # ||d_bar||^2 is about 0.008 here, so eps weighs (eta_g about 2 to 4)
    "fedexp:eps": Case({"server-optimizer": "fedexp", "fedexp-eps": 0.003, "dirichlet-beta": 0.1}, EXACT),
    "fedadam:all": Case({"server-optimizer": "fedadam", "fedadam-eta": 0.03, "fedadam-beta1": 0.5,
                         "fedadam-beta2": 0.9, "fedadam-tau": 0.01}),
    "fedyogi:all": Case({"server-optimizer": "fedyogi", "fedyogi-eta": 0.03, "fedyogi-beta1": 0.5,
                         "fedyogi-beta2": 0.9, "fedyogi-tau": 0.01}),
    "fedadagrad:tau": Case({"server-optimizer": "fedadagrad", "fedadagrad-eta": 0.01, "fedadagrad-tau": 0.01}),
    "fedconcat:default-split": Case({"protocol": "fedconcat", "num-server-rounds": 4, "fedconcat-head-steps": 2,
                                     "fedconcat-assignment": "0,1,1,0"}, EXACT),
    # ---- BatchNorm: integer buffers averaged, a short last batch merged, the teacher in train mode
    "batchnorm:fedavg+sam+fedexp": Case({**BN, "num-server-rounds": 2, "local-optimizer": "sam",
                                         "server-optimizer": "fedexp"}, EXACT),
    "batchnorm:fedvls-teacher-train": Case({**BN, "method": "fedvls", "teacher-mode": "train"}),
    "batchnorm:fedntd-teacher-train": Case({**BN, "method": "fedntd", "teacher-mode": "train"}),
    "batchnorm:fedlmd-teacher-train": Case({**BN, "method": "fedlmd", "teacher-mode": "train", "fedlmd-beta": 1.0}),
    "batchnorm:fedvls-paper-teacher-train": Case({**BN, "method": "fedvls-paper", "teacher-mode": "train",
                                                  "paper-logit-weight": 0.01}),
    # ---- parts combined, client state across rounds, partial participation
    "fedvls+sam+fedadam": Case({"method": "fedvls", "local-optimizer": "sam", "server-optimizer": "fedadam"}),
    "moon+carry+fedexp-average": Case({"method": "moon", "moon-mu": 0.5, "optimizer-state": "carry",
                                       "server-optimizer": "fedexp", "fedexp-eval": "average-last-two"}),
    "fedgf+fedavgm": Case({"method": "fedlc", "local-optimizer": "fedgf", "server-optimizer": "fedavgm",
                           "fedavgm-momentum": 0.5}),
    "fedconcat-kmeans+fedprox": Case({"method": "fedprox", "fedprox-mu": 0.5, "protocol": "fedconcat",
                                      "num-server-rounds": 4, "fedconcat-encoder-rounds": 2}),
    # half the sites a round: state kept across the rounds a site sits out, a cluster left untrained
    "partial:moon+carry+fedyogi": Case({"method": "moon", "moon-mu": 0.1, "optimizer-state": "carry",
                                        "server-optimizer": "fedyogi", "fraction-train": 0.5, "num-server-rounds": 4}),
    "partial:fedgf-adaptive": Case({"method": "fedntd", "local-optimizer": "fedgf", "fedgf-c-mode": "adaptive",
                                    "fedgf-threshold": 0.22, "fedgf-window": 2, "fraction-train": 0.5,
                                    "num-server-rounds": 4}),
    "partial:fedconcat-concat-head+sam": Case({"method": "fedvls", "local-optimizer": "sam", "protocol": "fedconcat",
                                               "fedconcat-head-init": "concat", "fedconcat-clusters": 3,
                                               "fedconcat-assignment": "0,1,2,1", "fraction-train": 0.5,
                                               "num-server-rounds": 4, "fedconcat-encoder-rounds": 2}),
    "two-epochs:fedlmd+carry+fedadagrad": Case({"method": "fedlmd", "local-epochs": 2, "optimizer-state": "carry",
                                                "server-optimizer": "fedadagrad", "fedadagrad-eta": 0.01}),
    # ---- data and partitions: the files read by each side, every scheme (every network: below)
    "data:fmnist+cnn+shards": Case({"dataset": "fmnist", "data-dir": GENERATED, "model": "cnn", "partition": "shards",
                                    "num-server-rounds": 2}, EXACT),
    "data:mnist10k+labeldir": Case({"dataset": "mnist10k", "data-dir": GENERATED, "partition": "noniid-labeldir",
                                    "shards-per-client": 5, "num-server-rounds": 2}, EXACT),
    "data:mnist+iid+pool+logreg": Case({"dataset": "mnist", "data-dir": GENERATED, "partition": "iid",
                                        "train-pool-size": 60, "model": "logreg", "num-server-rounds": 2}, EXACT),
    "data:cifar10+cnn": Case({"dataset": "cifar10", "data-dir": GENERATED, "model": "cnn", "augment": False,
                              "num-server-rounds": 2}, EXACT),
    # ---- small effects: more local steps, a larger weight decay
    "long:fedavg": Case(LONG, EXACT),
    "long:fedvls": Case({**LONG, "method": "fedvls", "dirichlet-beta": 0.1, "logit-weight": 0.05}),
    "long:fedlc+fedexp": Case({**LONG, "method": "fedlc", "server-optimizer": "fedexp", "dirichlet-beta": 0.1}),
}

#: Round-record fields both sides report, compared as the arrays are where the app has them.
REPORTS = ("server_step_size", "fedgf_c", "fedgf_divergence")


def registered() -> tuple[dict[tuple[str, str], tuple[str, ...]], tuple[str, ...]]:
    """The app's parts, (kind, name) -> their settings' keys, and its general settings: the one
    place this module reads the app's declarations (through their public functions)."""
    from fedvls_flwr.config.general import GENERAL_SETTINGS
    from fedvls_flwr.config.registry import KINDS, get_part, part_names

    parts = {(kind, name): tuple(s.key for s in get_part(kind, name).settings)
             for kind in KINDS for name in part_names(kind)}
    return parts, tuple(s.key for s in GENERAL_SETTINGS)


def part_case(kind: str, name: str) -> Case:
    case = PART_CASES.get((kind, name), Case())
    return Case({kind: name, **case.settings}, case.rtol)


def every_part() -> list[tuple[str, str]]:
    return sorted(registered()[0])


# --------------------------------------------------------------------------- running both sides


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Tiny files in the real formats (MNIST's and Fashion-MNIST's IDX files, CIFAR-10's pickles),
    read by both sides; torchvision's md5 check of the CIFAR files pointed at the generated ones."""
    import torchvision.datasets as tvd

    from tests.tiny_data import write_idx_dataset, write_tiny_cifar10

    root = tmp_path_factory.mktemp("differential-data")
    write_idx_dataset(root / "MNIST" / "raw", n_train=120, n_test=2100, seed=1)  # mnist10k: 10 per class left
    write_idx_dataset(root / "FashionMNIST" / "raw", n_train=120, n_test=40, seed=2)
    sums = write_tiny_cifar10(root, per_batch=24, n_test=40, seed=3)
    with pytest.MonkeyPatch.context() as mp:
        cifar = tvd.CIFAR10
        mp.setattr(cifar, "train_list", [[n, sums[n]] for n, _ in cifar.train_list])
        mp.setattr(cifar, "test_list", [[n, sums[n]] for n, _ in cifar.test_list])
        mp.setattr(cifar, "meta", {**cifar.meta, "md5": sums[cifar.meta["filename"]]})
        yield root


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("differential")


def settings_of(case: Case, data_dir: Path) -> tuple[tuple[str, Any], ...]:
    values = {**BASE, **case.settings}
    if values.get("data-dir") == GENERATED:
        values["data-dir"] = str(data_dir)
    return tuple(sorted(values.items()))


@cache
def _app(items: tuple[tuple[str, Any], ...], out: Path) -> tuple[list[dict], dict[str, np.ndarray], dict]:
    """The app's rounds, final round state and initial weights (cached: the default parts of the
    four kinds are one run)."""
    import torch

    from fedvls_flwr.ops.inprocess import run_in_process
    from tests.runs import torch_global_state

    with torch_global_state():  # restored afterwards: the deterministic mode, the thread count
        torch.set_num_threads(1)  # the server's evaluation too (two threads on a busy 2-core machine: 5x slower)
        done = run_in_process({**dict(items), "output-dir": str(out), "run-name": f"run{_app.cache_info().currsize}"},
                              NODES, client_cpus=1, workers=1)  # in this process: the md5 patch reaches the clients
    _, arrays = load_checkpoint(done.run_dir / "checkpoint.npz")
    kinds = tuple(f"{kind}/" for kind in PARTS)  # the server parts' own state, not the round's
    return read_rounds(done.run_dir), {k: v for k, v in arrays.items() if not k.startswith(kinds)}, app_initial(items)


def app_initial(items: tuple[tuple[str, Any], ...]) -> dict[str, np.ndarray]:
    """The app's initial weights, as its server draws them: torch.manual_seed(seed), then the run's model."""
    import torch

    from fedvls_flwr.algorithms.run_model import build_run_model
    from fedvls_flwr.config.run_config import parse_run_config
    from fedvls_flwr.data.datasets import image_format
    from fedvls_flwr.ops.inprocess import fused_run_config

    cfg = parse_run_config(fused_run_config(dict(items)))
    shape = image_format(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_run_model(cfg, shape.shape, shape.num_classes)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@cache
def _reference(items: tuple[tuple[str, Any], ...], initial_items: tuple[tuple[str, Any], ...] | None = None) -> dict:
    """The reference's run, from the app's initial weights for ``initial_items`` (default: ``items``)."""
    from bench.reference_loop import RefConfig, run

    initial = app_initial(initial_items or items)
    return run(RefConfig.of(dict(items), num_clients=NODES), keep_arrays=True, initial=initial)


def magnitude(a: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64)), initial=0.0))


def largest_difference(got: np.ndarray, want: np.ndarray, floor: float = 0.0) -> float:
    """The largest difference over the array's largest magnitude, or ``floor`` if that is larger
    (0 where both are 0)."""
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    return diff / (max(magnitude(want), floor) or 1.0)


def close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None or rtol == EXACT:
        return a == b or (a is not None and b is not None and np.isnan(a) and np.isnan(b))
    return bool(np.isclose(a, b, rtol=rtol, atol=0.0, equal_nan=True))


def assert_same_run(case: Case, runs_dir: Path, data_dir: Path) -> None:
    """The app and the reference loop, round by round and in the final state (see the module docstring)."""
    items = settings_of(case, data_dir)
    app_rounds, app_arrays, _ = _app(items, runs_dir)
    ref = _reference(items)
    ref_rounds = ref["rounds"]
    assert [r["round"] for r in app_rounds] == [r["round"] for r in ref_rounds]
    for a, b in zip(app_rounds, ref_rounds):
        where = f"round {a['round']}"
        assert a["accuracy"] == b["accuracy"], f"{where}: accuracy app {a['accuracy']} vs reference {b['accuracy']}"
        assert close(a["loss"], b["loss"], case.rtol), f"{where}: test loss app {a['loss']} vs reference {b['loss']}"
        if a["round"] > 0:
            assert a["sampled_partitions"] == b["sampled_partitions"], where
            assert a.get("stage") == b.get("stage"), where
        for name in REPORTS:
            if name in a or name in b:
                assert close(a.get(name), b.get(name), case.rtol or FLOAT64), \
                    f"{where}: {name} app {a.get(name)} vs reference {b.get(name)}"
    want = ref["arrays"]
    assert sorted(app_arrays) == sorted(want), "the final round state's arrays differ in their names"
    # an array near 0 (a BatchNorm bias a few steps from its initial 0) is computed from the weights
    # and activations around it and carries their rounding: its scale is at least 1% of the model's
    floor = 0.01 * max(magnitude(v) for v in want.values() if v.dtype.kind == "f")
    for key, expected in want.items():
        got = app_arrays[key]
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), key
        if case.rtol == EXACT:
            assert np.array_equal(got, expected), \
                f"{key}: not bit for bit ({largest_difference(got, expected, floor):.3g} of the array's scale)"
        else:
            worst = largest_difference(got, expected, floor)
            assert worst <= case.rtol, f"{key}: largest difference {worst:.3g} of the array's scale (allowed {case.rtol})"


# --------------------------------------------------------------------------- the comparisons


@pytest.mark.parametrize("kind, name", every_part(), ids=[f"{k}={n}" for k, n in every_part()])
def test_every_registered_part_computes_what_its_reference_computes(kind, name, runs_dir, data_dir):
    if name not in IMPLEMENTATIONS.get(kind, {}):
        pytest.fail(f"{kind} '{name}' is registered but bench/reference_loop.py has no reference for it: write "
                    f"it out from its source (bench/reference_*.py), with its settings in "
                    f"bench/reference_settings.py's PARTS and its implementation in IMPLEMENTATIONS[{kind!r}]")
    assert_same_run(part_case(kind, name), runs_dir, data_dir)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_computes_what_the_reference_computes(name, runs_dir, data_dir):
    assert_same_run(CASES[name], runs_dir, data_dir)


# --------------------------------------------------------------------------- the guard


def test_every_registered_part_has_a_reference_implementation_with_its_settings():
    """A part or setting the app registers and the reference does not implement fails here by
    name; so does a reference entry the app no longer registers (a renamed part)."""
    parts, _ = registered()
    reference = {(kind, name): tuple(settings) for kind, table in PARTS.items() for name, settings in table.items()}
    missing = sorted(set(parts) - set(reference))
    assert not missing, f"registered parts without a reference: {missing} (bench/reference_*.py, PARTS, IMPLEMENTATIONS)"
    assert not set(reference) - set(parts), f"the reference knows parts the app does not: {set(reference) - set(parts)}"
    for part, keys in parts.items():
        assert callable(IMPLEMENTATIONS[part[0]][part[1]]), part
        assert sorted(keys) == sorted(reference[part]), \
            f"{part}: the app's settings {sorted(keys)}, the reference's table {sorted(reference[part])}"


def test_every_general_setting_is_read_by_the_reference_or_set_aside_with_a_reason():
    _, general = registered()
    unknown = sorted(set(general) - set(GENERAL) - set(NOT_MODELLED))
    assert not unknown, f"general settings the reference neither reads nor sets aside (NOT_MODELLED): {unknown}"
    assert not (set(GENERAL) | set(NOT_MODELLED)) - set(general) - {k for t in PARTS.values() for s in t.values()
                                                                      for k in s}


def every_setting() -> list[tuple[str, str, str]]:
    return sorted((kind, name, key) for (kind, name), keys in registered()[0].items() for key in keys)


def exercising(kind: str, name: str, key: str) -> list[tuple[str, Case]]:
    """The cases that run part ``name`` with ``key`` off the reference's default."""
    if key not in PARTS[kind].get(name, {}):
        pytest.fail(f"{kind} '{name}' has the setting '{key}' in the app and none in the reference: give it its "
                    f"default in bench/reference_settings.py's PARTS[{kind!r}][{name!r}] (with its source) and make "
                    "the reference compute with it")
    default = PARTS[kind][name][key]
    out = []
    for case_name, case in [*CASES.items(), *((f"{k}={n}", part_case(k, n)) for k, n in every_part())]:
        values = {**BASE, **case.settings}
        if values.get(kind, GENERAL[kind]) == name and key in values and values[key] != default:
            out.append((case_name, case))
    return out


@pytest.mark.parametrize("kind, name, key", every_setting(), ids=[f"{n}:{k}" for _, n, k in every_setting()])
def test_every_setting_is_compared_off_its_default_where_it_changes_the_result(kind, name, key, data_dir):
    """Some case runs the part with the setting off its default, and there the reference's result
    differs from the same case at the default: the comparison of that case sees the setting."""
    cases = exercising(kind, name, key)
    assert cases, f"no case runs {kind} '{name}' with '{key}' off its default: add one to CASES"
    case_name, case = cases[0]
    items = settings_of(case, data_dir)
    at_default = tuple((k, v) for k, v in items if k != key)
    # the same initial weights (the app may refuse the settings at the default: FedGF's adaptive c
    # without a threshold), unless the setting shapes the model (MOON's projection width)
    off, on = _reference(items), _reference(at_default, at_default if key == "moon-projection-dim" else items)
    differs = [k for k in off["arrays"] if not np.array_equal(off["arrays"][k], on["arrays"].get(k))]
    differs += [f"round {a['round']}" for a, b in zip(off["rounds"], on["rounds"])
                if any(a.get(f) != b.get(f) for f in ("accuracy", "loss", *REPORTS))]
    assert differs, f"case {case_name!r}: '{key}' = {dict(items)[key]!r} computes what its default computes"


# --------------------------------------------------------------------------- the networks


def every_network() -> list[tuple[str, bool]]:
    from fedvls_flwr.config.catalogue import MODELS

    return [(name, projected) for name in MODELS for projected in (False, True)]


@pytest.mark.parametrize("name, projected", every_network(),
                         ids=[f"{n}{'+moon' if p else ''}" for n, p in every_network()])
def test_every_network_computes_what_its_reference_computes(name, projected):
    """Each network of the zoo (and with MOON's projection head), built by the app and by the
    reference from their own definitions, the app's weights loaded into the reference by key: the
    same logits and representation in train mode (BatchNorm's batch statistics), the same gradients,
    the same running statistics, the same logits in eval mode; bit for bit (the same float32 ops).
    The runs above use the digits and MNIST-sized networks; this holds every one on a small RGB batch."""
    import torch

    from bench import reference_models

    assert set(reference_models.MODELS) == {n for n, _ in every_network()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compare_networks(name, projected)
    finally:
        torch.set_num_threads(threads)


def compare_networks(name: str, projected: bool) -> None:
    import torch

    from bench import reference_models
    from fedvls_flwr.algorithms.run_model import build_run_model
    from fedvls_flwr.config.run_config import parse_run_config
    from fedvls_flwr.models import FeatureTap, ProjectionModel

    shape, classes = (3, 16, 16), 7
    cfg = parse_run_config({"model": name, "method": "moon" if projected else "fedavg", "moon-projection-dim": 24})
    torch.manual_seed(5)
    app = build_run_model(cfg, shape, classes)
    ref = reference_models.build_for(name, shape, classes, 24 if projected else None)
    ref.load_state_dict(app.state_dict())  # strict: the same layers under the same names
    x = torch.randn(6, *shape, generator=torch.Generator().manual_seed(6))
    y = torch.arange(6) % classes
    app.train(), ref.train()
    if projected:
        (a_logits, a_features), (r_logits, r_features) = app.project(x), ref.project(x)
        assert isinstance(app, ProjectionModel)
    else:
        tap = FeatureTap(app)
        a_logits, a_features = app(x), tap.features
        tap.remove()
        r_features = ref.features(x)
        r_logits = ref.classifier(r_features)
    assert torch.equal(a_logits, r_logits) and torch.equal(a_features.flatten(1), r_features.flatten(1))
    torch.nn.functional.cross_entropy(a_logits, y).backward()
    torch.nn.functional.cross_entropy(r_logits, y).backward()
    for (key, p), q in zip(app.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad), f"{key}: gradients differ"
    for (key, a), b in zip(app.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), f"{key} differs after a forward pass in train mode"
    app.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(app(x), ref(x)), "eval mode"
