"""tracking='tensorboard' in a simulation on the in-process engine (the app's own ServerApp and
ClientApp; the ServerApp's log is this process's): TensorBoard's own reader parses the event
files, which hold rounds.jsonl's numbers; a resumed run continues them, each step once."""

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.app.tracking import EVENT_FILES, record_metrics
from tests.runs import run_here

pytestmark = pytest.mark.e2e

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
event_file_loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")


def accumulate(run_dir: Path):
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0,
                                                                         event_accumulator.TENSORS: 0})
    return acc.Reload()


def raw_steps(run_dir: Path) -> Counter:
    """(tag, step) of every scalar in every event file, as written (no reader's purging)."""
    seen: Counter = Counter()
    for path in sorted(run_dir.glob(EVENT_FILES)):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                seen[(value.tag, event.step)] += 1
    return seen


def test_tensorboard_events_hold_the_rounds_and_a_resumed_run_continues_them(tmp_path, caplog):
    out = tmp_path / "runs"
    run_config = {
        "dataset": "digits", "method": "fedvls", "num-server-rounds": 3, "local-epochs": 1, "dirichlet-beta": 0.5,
        "output-dir": str(out), "run-name": "tb", "tracking": "tensorboard",
    }
    run_dir = out / "tb"
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_here(run_config, 3)
    assert "round 3/3: accuracy" in caplog.text and "left" in caplog.text

    rounds = read_rounds(run_dir)
    acc = accumulate(run_dir)
    accuracy = acc.Scalars("accuracy")
    assert [e.step for e in accuracy] == [0, 1, 2, 3]
    assert [e.value for e in accuracy] == pytest.approx([r["accuracy"] for r in rounds], abs=1e-6)
    loss = acc.Scalars("train/train-loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([r["train"]["train-loss"] for r in rounds[1:]], rel=1e-6)
    tags = set(acc.Tags()["scalars"])
    assert set(record_metrics(rounds[3])) <= tags
    assert {"loss", "train/train-dis", "drift_diversity", "clients_accepted", "seconds",
            "per_class_accuracy/0", "per_class_accuracy/9"} <= tags
    assert "config" in json.dumps(acc.Tags())  # the run config as text

    # resume to 4 rounds: the event files are rewritten from rounds.jsonl, then round 4 follows
    run_here({**run_config, "num-server-rounds": 4, "resume": True}, 3)
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
    accuracy = accumulate(run_dir).Scalars("accuracy")
    assert [e.step for e in accuracy] == [0, 1, 2, 3, 4]
    assert [e.value for e in accuracy] == pytest.approx([r["accuracy"] for r in rounds], abs=1e-6)
    seen = raw_steps(run_dir)
    assert {step for (tag, step) in seen if tag == "accuracy"} == {0, 1, 2, 3, 4}
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]
    assert len(list(run_dir.glob(EVENT_FILES))) == 1
