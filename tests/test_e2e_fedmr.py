"""FedMR in a real 4-round Flower simulation, at the paper's deco = 4 and composed with
FedSAM and FedAdam, as the other objectives are."""

from __future__ import annotations

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.runs import DIGITS_RUN

pytestmark = pytest.mark.e2e

BASE = {**DIGITS_RUN, "num-server-rounds": 4, "method": "fedmr"}


def test_fedmr_four_rounds_alone_and_with_sam_and_fedadam(tmp_path):
    out = tmp_path / "runs"
    runs = {"fedmr": {}, "fedmr-sam-fedadam": {"local-optimizer": "sam", "server-optimizer": "fedadam"}}
    with LocalSuperLink(tmp_path / "home") as link:
        outcomes = {name: link.wait(link.submit(run_config={**BASE, **parts, "output-dir": str(out), "run-name": name},
                                                federation_config={"num-supernodes": 3, "client-resources-num-cpus": 1}),
                                    timeout=400)
                    for name, parts in runs.items()}
    for name, outcome in outcomes.items():
        assert outcome.completed, f"{name}: {outcome.status}\n{outcome.log[-3000:]}"
        rounds = read_rounds(out / name)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
        for r in rounds[1:]:
            assert r["clients_accepted"] == r["clients_sampled"] == 3 and r["failures"] == []
            assert 0.0 <= r["accuracy"] <= 1.0 and r["train"]["train-deco"] > 0.0
