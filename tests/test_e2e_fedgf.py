"""FedGF in simulations of 4 rounds on the in-process engine (the app's own ServerApp and
ClientApp; tests/test_e2e_inprocess.py shows FedGF's run there equals `flwr run`'s bit for
bit): the perturbed global model and c reach the clients from round 2 on (round 1 is
FedSAM's), with FedAvg's and FedVLS's objectives; the server's FedGF state is checkpointed,
so a run stopped after round 2 and resumed equals an uninterrupted one bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fedvls_flwr.app.results import CHECKPOINT_FILE, MODEL_FILE, load_arrays, load_checkpoint, read_rounds
from tests.runs import DIGITS_RUN, run_here

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "num-server-rounds": 4, "deterministic": True}
NODES = 3


def metrics(run_dir):
    return [(r["round"], r["accuracy"], r["loss"], r["per_class_accuracy"], r.get("fedgf_c"), r.get("fedgf_divergence"))
            for r in read_rounds(run_dir)]


def test_fedgf_runs_four_rounds_with_fedavg_and_fedvls_objectives(tmp_path):
    out = tmp_path / "runs"
    runs = {
        "sam": {"method": "fedavg", "local-optimizer": "sam"},
        "fedgf": {"method": "fedavg", "local-optimizer": "fedgf"},
        "fedvls-fedgf": {"method": "fedvls", "local-optimizer": "fedgf"},
    }
    for name, parts in runs.items():
        run_here({**BASE, **parts, "output-dir": str(out), "run-name": name}, NODES)
        rounds = read_rounds(out / name)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
        for r in rounds[1:]:
            assert r["clients_accepted"] == r["clients_sampled"] and r["failures"] == [], (name, r["failures"])
            assert 0.0 <= r["accuracy"] <= 1.0
    sam, fedgf = metrics(out / "sam"), metrics(out / "fedgf")
    # round 1 sends nothing besides the weights: FedGF is FedSAM; from round 2 w_g and c arrive
    assert [a[:4] for a in sam[:2]] == [b[:4] for b in fedgf[:2]]
    assert all(a[1:3] != b[1:3] for a, b in zip(sam[2:], fedgf[2:]))
    # each round's record: the c its clients used (0 in round 1) and the D its replies showed
    records = read_rounds(out / "fedgf")
    assert [r["fedgf_c"] for r in records[1:]] == [0.0, 0.3, 0.3, 0.3]
    assert all(0.0 < r["fedgf_divergence"] < float("inf") for r in records[1:])
    assert not any("fedgf_c" in r for r in read_rounds(out / "sam"))
    fedvls = read_rounds(out / "fedvls-fedgf")
    assert all(r["train"]["train-logit"] != 0.0 for r in fedvls[1:])  # FedVLS's own terms run under the FedGF step
    checkpoint = load_checkpoint(out / "fedgf" / CHECKPOINT_FILE)[1]  # its frozen file's arrays included
    model = load_arrays(out / "fedgf" / MODEL_FILE)
    perturbed = {k.rsplit("/perturbed/", 1)[1]: v for k, v in checkpoint.items() if "/perturbed/" in k}
    assert set(perturbed) == {k for k, v in model.items() if v.dtype.kind == "f"}
    step = np.sqrt(sum(float(np.square(perturbed[k].astype(np.float64) - model[k]).sum()) for k in perturbed))
    assert step == pytest.approx(0.1, rel=1e-4)  # ||w_g - w^4|| = rho_g


def test_fedgf_resumed_after_round_2_equals_an_uninterrupted_run(tmp_path):
    straight = {**BASE, "local-optimizer": "fedgf", "output-dir": str(tmp_path / "straight"), "run-name": "r"}
    first = {**straight, "num-server-rounds": 2, "output-dir": str(tmp_path / "resumed")}
    resumed = {**straight, "output-dir": str(tmp_path / "resumed"), "resume": True}
    for cfg in (straight, first, resumed):
        run_here(cfg, NODES)
    a, b = tmp_path / "resumed" / "r", tmp_path / "straight" / "r"
    assert [m[0] for m in metrics(a)] == [0, 1, 2, 3, 4]
    assert metrics(a) == metrics(b)
    final_a, final_b = load_arrays(a / MODEL_FILE), load_arrays(b / MODEL_FILE)
    assert sorted(final_a) == sorted(final_b)
    for key in final_a:
        np.testing.assert_array_equal(final_a[key], final_b[key])
