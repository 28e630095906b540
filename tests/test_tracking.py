"""tracking: a round's record as metrics, the TensorBoard writer's resume (no duplicate steps),
a missing package said at start-up, and a tracker that fails mid-run."""

import importlib.util
import logging
from collections import Counter
from pathlib import Path

import pytest

from fedvls_flwr.app import tracking
from fedvls_flwr.app.tracking import EVENT_FILES, TensorBoardTracker, check_tracking, config_text, record_metrics
from fedvls_flwr.config.run_config import ConfigError, parse_run_config
from fedvls_flwr.experiments import check

RECORD = {
    "round": 4,
    "accuracy": 0.75, "loss": 0.61, "per_class_accuracy": [0.5, None, 1.0, 0.25, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.125],
    "evaluation": "server",
    "train": {"train-loss": 1.5, "train-cal": 1.25, "train-dis": 0.2, "train-logit": 0.05},
    "drift_diversity": 3.5, "server_step_size": 1.75,
    "clients_sampled": 5, "sampled_partitions": [0, 2, 3, 4, 7], "clients_accepted": 4, "clients_failed": 1,
    "clients_rejected": 0, "attempts": 1, "failures": [{"node": 12, "error": "timeout"}],
    "seconds": 2.5,
    "local_update": {"head": {"local": 0.9, "global": 0.8, "clients": 3}, "tail": {"local": None, "global": 0.1, "clients": 0}},
}


def test_record_metrics_flattens_every_number_of_a_round_and_nothing_else():
    assert record_metrics(RECORD) == {
        "accuracy": 0.75, "loss": 0.61,
        **{f"per_class_accuracy/{i:02d}": v for i, v in enumerate(RECORD["per_class_accuracy"]) if v is not None},
        "train/train-loss": 1.5, "train/train-cal": 1.25, "train/train-dis": 0.2, "train/train-logit": 0.05,
        "drift_diversity": 3.5, "server_step_size": 1.75,
        "clients_sampled": 5.0, "clients_accepted": 4.0, "clients_failed": 1.0, "clients_rejected": 0.0,
        "attempts": 1.0, "seconds": 2.5,
        "local_update/head/local": 0.9, "local_update/head/global": 0.8, "local_update/head/clients": 3.0,
        "local_update/tail/global": 0.1, "local_update/tail/clients": 0.0,
    }


def test_record_metrics_of_round_zero_and_of_odd_values():
    assert record_metrics({"round": 0, "accuracy": 0.1, "loss": float("nan"), "seconds": 0.0,
                           "per_class_accuracy": [0.0, 0.2], "flag": True, "note": "x"}) == {
        "accuracy": 0.1, "seconds": 0.0, "per_class_accuracy/0": 0.0, "per_class_accuracy/1": 0.2}


def test_config_text_is_a_markdown_table_of_every_setting():
    cfg = parse_run_config({"method": "fedavg", "tracking": "tensorboard"}).to_flower()
    lines = config_text(cfg).splitlines()
    assert lines[:2] == ["| setting | value |", "|---|---|"]
    assert len(lines) == 2 + len(cfg) and '| method | "fedavg" |' in lines and "| lr | 0.01 |" in lines


@pytest.fixture
def no_tensorboard(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))


def test_a_missing_tracker_package_is_a_config_error_naming_the_extra(no_tensorboard):
    check_tracking(parse_run_config({"tracking": "none"}))
    with pytest.raises(ConfigError, match=r"pip install \"fedvls-flwr\[tensorboard\]\"") as err:
        check_tracking(parse_run_config({"tracking": "tensorboard"}))
    assert "tracking='none'" in str(err.value)


def test_the_server_says_so_before_loading_data_or_a_round(no_tensorboard, tmp_path):
    from fedvls_flwr.app.server import ServerRun

    cfg = parse_run_config({"tracking": "tensorboard", "output-dir": str(tmp_path), "run-name": "r",
                            "data-dir": str(tmp_path / "no-data")})
    with pytest.raises(ConfigError, match="tracking"):
        ServerRun(None, cfg)  # type: ignore[arg-type]  # never reaches the grid
    assert not (tmp_path / "r").exists()


def test_fedvls_check_says_so_too(no_tensorboard, capsys):
    assert check.main(["--run-config", "tracking='tensorboard'", "--no-data"]) == 2
    assert "fedvls-flwr[tensorboard]" in capsys.readouterr().err
    assert check.main(["--run-config", "tracking='tensorboard'", "--no-data", "--for-other-machine"]) == 0


# ---- the writer --------------------------------------------------------------------------------
def _scalars(run_dir: Path) -> tuple[dict[int, float], Counter]:
    """(step -> accuracy as TensorBoard's reader shows it, (tag, step) counts as written)."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    acc = ea.EventAccumulator(str(run_dir), size_guidance={ea.SCALARS: 0}).Reload()
    shown = {e.step: e.value for e in acc.Scalars("accuracy")}
    written: Counter = Counter()
    for path in sorted(run_dir.glob(EVENT_FILES)):
        for event in loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                written[(value.tag, event.step)] += 1
    return shown, written


def _round(r: int, accuracy: float) -> dict:
    return {"round": r, "accuracy": accuracy, "seconds": 1.0, "train": {"train-loss": 2.0 - accuracy}}


def test_resume_rewrites_the_events_so_a_redone_round_appears_once(tmp_path):
    pytest.importorskip("tensorboard")
    config = {"method": "fedavg"}
    first = TensorBoardTracker(tmp_path, config, replay=[])
    for r in range(4):  # rounds 0..3 logged; the server is killed before round 3's checkpoint
        first.log_round(_round(r, 0.1 * r))
    first.close()
    shown, _ = _scalars(tmp_path)
    assert shown == pytest.approx({0: 0.0, 1: 0.1, 2: 0.2, 3: 0.3})

    # resume after round 2 (rounds.jsonl keeps 0..2): round 3 is run again, with another result
    resumed = TensorBoardTracker(tmp_path, config, replay=[_round(r, 0.1 * r) for r in range(3)])
    resumed.log_round(_round(3, 0.35))
    resumed.log_round(_round(4, 0.4))
    resumed.close()
    shown, written = _scalars(tmp_path)
    assert shown == pytest.approx({0: 0.0, 1: 0.1, 2: 0.2, 3: 0.35, 4: 0.4})
    assert written[("accuracy", 3)] == 1 and max(written.values()) == 1
    assert len(list(tmp_path.glob(EVENT_FILES))) == 1


def test_a_tracker_that_fails_mid_run_warns_once_and_the_run_goes_on(tmp_path, caplog):
    class Broken:
        calls = 0

        def log_round(self, record):
            Broken.calls += 1
            raise OSError(28, "No space left on device")

        def close(self):
            raise OSError(28, "No space left on device")

    guarded = tracking._Guarded("tensorboard", Broken())
    with caplog.at_level(logging.WARNING, logger="flwr"):
        guarded.log_round(_round(1, 0.5))
        guarded.log_round(_round(2, 0.6))
        guarded.close()
    assert Broken.calls == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left" in warnings[0] and "resume=true" in warnings[0]


def test_a_sweep_says_so_before_starting_anything(no_tensorboard, tmp_path):
    from fedvls_flwr.experiments.preset import PresetError, load_preset
    from fedvls_flwr.experiments.sweep import run_preset

    path = tmp_path / "p.yaml"
    path.write_text("name: p\nbase: {dataset: digits, num-server-rounds: 1, tracking: tensorboard}\n"
                    "grid: {method: [fedavg]}\nfederation: {num-supernodes: 2}\n")
    with pytest.raises(PresetError, match=r"fedvls-flwr\[tensorboard\]"):
        run_preset(load_preset(path), tmp_path / "out", log=lambda *a: None, report=False)
    assert not (tmp_path / "out" / ".flwr-home").exists()  # no SuperLink was started
