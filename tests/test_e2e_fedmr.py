"""FedMR in a 4-round simulation on the in-process engine (the app's own ServerApp and
ClientApp), at the paper's deco = 4 and composed with FedSAM and FedAdam, as the other
objectives are."""

from __future__ import annotations

import pytest

from fedvls_flwr.app.results import read_rounds
from tests.runs import DIGITS_RUN, run_here

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "num-server-rounds": 4, "method": "fedmr"}


def test_fedmr_four_rounds_alone_and_with_sam_and_fedadam(tmp_path):
    out = tmp_path / "runs"
    runs = {"fedmr": {}, "fedmr-sam-fedadam": {"local-optimizer": "sam", "server-optimizer": "fedadam"}}
    for name, parts in runs.items():
        run_here({**BASE, **parts, "output-dir": str(out), "run-name": name}, 3)
        rounds = read_rounds(out / name)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
        for r in rounds[1:]:
            assert r["clients_accepted"] == r["clients_sampled"] == 3 and r["failures"] == []
            assert 0.0 <= r["accuracy"] <= 1.0 and r["train"]["train-deco"] > 0.0
