"""The server's result files under damage and a full disk, with a fake Grid (no Flower
processes): every damaged file is named with what to do, what the other files allow is
repaired, a moved run folder resumes, a full disk loses nothing and says how to go on,
and a resumed run gives the same rounds as an uninterrupted one, bit for bit."""

from __future__ import annotations

import errno
import fnmatch
import json
import logging
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata

from fedvls_flwr.app import results
from fedvls_flwr.app.keys import ARRAYS as ARRAYS_KEY
from fedvls_flwr.app.keys import CONFIG as CONFIG_KEY
from fedvls_flwr.app.keys import METRICS as METRICS_KEY
from fedvls_flwr.app.keys import NUM_EXAMPLES, SERVER_ROUND, TRAIN_LOSS
from fedvls_flwr.app.results import RunFolderError, load_checkpoint, read_rounds
from fedvls_flwr.app.server import ResultsWriteError, _resume_point, run_experiment
from fedvls_flwr.config.run_config import ConfigError, RunConfig
from fedvls_flwr.experiments.check import main as check_main
from tests.fake_grid import FakeGridBase
from tests.test_fedconcat import ConcatGrid, concat_config, history

ROUNDS = 4


pytestmark = pytest.mark.usefixtures("run_identity")  # Flower's messages need a run identity


class TrainingGrid(FakeGridBase):
    """Every node answers with the broadcast weights moved by a fixed function of (node,
    round): deterministic like the real clients, so a resumed run must match bit for bit."""

    def __init__(self, nodes=(11, 12, 13)):
        super().__init__(nodes)

    def answer(self, messages):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            server_round = int(msg.content[CONFIG_KEY][SERVER_ROUND])
            rng = np.random.default_rng([node, server_round])
            arrays = {}
            for key, arr in msg.content[ARRAYS_KEY].items():
                value = arr.numpy()
                if value.dtype.kind == "f":
                    value = (value + 0.05 * rng.standard_normal(value.shape)).astype(value.dtype)
                arrays[key] = Array(np.require(value, requirements="C"))
            meta = Metadata(
                run_id=1, message_id=f"r{node}-{server_round}", src_node_id=node, dst_node_id=0,
                reply_to_message_id="x", group_id="1", created_at=time.time(), ttl=60.0, message_type="train",
            )
            content = RecordDict({
                ARRAYS_KEY: ArrayRecord(arrays),
                METRICS_KEY: MetricRecord({NUM_EXAMPLES: 10 + node, TRAIN_LOSS: float(server_round)}),
            })
            replies.append(Message(content, metadata=meta))
        return replies


def config(out: Path, **changes) -> RunConfig:
    settings = dict(dataset="digits", num_server_rounds=ROUNDS, output_dir=str(out), run_name="r", resume=True)
    return RunConfig(**{**settings, **changes})


def accuracies(run_dir: Path) -> list[tuple[int, float, float]]:
    return [(r["round"], r["accuracy"], r["loss"]) for r in read_rounds(run_dir)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, list]:
    """An uninterrupted run: the reference every resumed run must equal."""
    out = tmp_path_factory.mktemp("straight")
    run_dir = run_experiment(TrainingGrid(), config(out, resume=False))
    return run_dir, accuracies(run_dir)


def partial(out: Path, rounds: int) -> Path:
    """A run stopped after ``rounds`` rounds (as a killed server leaves it, without summary)."""
    run_dir = run_experiment(TrainingGrid(), config(out, num_server_rounds=rounds, resume=False))
    (run_dir / "summary.json").unlink()
    (run_dir / "model_final.npz").unlink()
    return run_dir


def test_uninterrupted_reference_is_sane(straight):
    run_dir, rounds = straight
    assert [r for r, _, _ in rounds] == list(range(ROUNDS + 1))
    assert len({acc for _, acc, _ in rounds}) > 1  # the model does change from round to round
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == ROUNDS


# ---- a moved run folder resumes (output-dir is not the run's identity) -----------


def test_moved_run_folder_resumes_bit_identical(tmp_path, straight):
    run_dir = partial(tmp_path / "disk1", 2)
    moved = tmp_path / "disk2" / "r"
    moved.parent.mkdir()
    shutil.move(run_dir, moved)
    # before: "resume: the run ... was started with other settings for ['output-dir']"
    out = run_experiment(TrainingGrid(), config(tmp_path / "disk2"))
    assert out == moved
    assert accuracies(moved) == straight[1]
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["resumed_after_round"] == 2 and summary["run_dir"] == str(moved)


def test_other_settings_are_still_refused(tmp_path):
    partial(tmp_path, 1)
    with pytest.raises(RunFolderError, match=r"other settings \(lr: 0.01 -> 0.5\)"):
        _resume_point(config(tmp_path, lr=0.5), tmp_path / "r")


# ---- what the sites' replies carried, over the whole run ------------------------------------


class SayingGrid(TrainingGrid):
    """TrainingGrid whose replies also carry ``said`` (a metric name) in the rounds listed;
    ``rejected``: only node 13's, with a NaN loss (rejected: its metrics reached the server
    all the same)."""

    def __init__(self, said: str, rounds: set[int], rejected: bool = False):
        super().__init__()
        self.said, self.rounds, self.rejected = said, rounds, rejected

    def answer(self, messages):
        replies = super().answer(messages)
        for reply in replies:
            if int(reply.metadata.message_id.split("-")[1]) not in self.rounds:
                continue
            if not self.rejected or reply.metadata.src_node_id == 13:
                reply.content[METRICS_KEY][self.said] = 1.0
            if self.rejected and reply.metadata.src_node_id == 13:
                reply.content[METRICS_KEY][TRAIN_LOSS] = float("nan")
        return replies


def test_reply_metrics_cover_every_session_of_a_resumed_run_and_rejected_replies(tmp_path):
    first = run_experiment(SayingGrid("early", {1}), config(tmp_path, num_server_rounds=2, resume=False))
    (first / "summary.json").unlink()  # as a killed server leaves it
    run_dir = run_experiment(SayingGrid("late", {4}, rejected=True), config(tmp_path))
    rounds = {r["round"]: r for r in read_rounds(run_dir)}
    per_round = {n: r.get("reply_metrics") for n, r in rounds.items()}
    assert per_round[1] == sorted({NUM_EXAMPLES, TRAIN_LOSS, "early"}) and per_round[2] == per_round[3]
    assert "late" in per_round[4] and "early" not in per_round[2]
    assert rounds[4]["clients_rejected"] == 1 and rounds[4]["clients_accepted"] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reply_metrics"] == sorted({NUM_EXAMPLES, TRAIN_LOSS, "early", "late"})
    # a session with no round left to run still lists what the run's replies carried
    (run_dir / "summary.json").unlink()
    run_experiment(TrainingGrid(), config(tmp_path))
    assert json.loads((run_dir / "summary.json").read_text())["reply_metrics"] == summary["reply_metrics"]


def test_reply_metrics_of_a_failed_run_include_the_round_that_failed(tmp_path):
    """The round that fails (too few usable replies) is in no saved round, but its replies'
    metrics left the sites all the same: summary.json lists them."""
    cfg = config(tmp_path, num_server_rounds=3, resume=False, min_fit_fraction=1.0, round_retries=0)
    with pytest.raises(Exception, match="round 2"):
        run_experiment(SayingGrid("secret", {2}, rejected=True), cfg)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 1
    assert summary["reply_metrics"] == sorted({NUM_EXAMPLES, TRAIN_LOSS, "secret"})


# ---- damaged files ---------------------------------------------------------------------------


def test_torn_last_line_of_rounds_after_the_checkpoint_is_dropped(tmp_path, straight, caplog):
    run_dir = partial(tmp_path, 2)
    # the server was writing round 3's line when the machine died (a non-atomic copy, a
    # filesystem without atomic rename): half a line after round 2
    line = json.dumps({"round": 3, "accuracy": 0.5, "loss": 1.0})
    with (run_dir / "rounds.jsonl").open("a") as handle:
        handle.write(line[: len(line) // 2])
    with caplog.at_level(logging.WARNING):
        done, arrays, rounds = _resume_point(config(tmp_path), run_dir)  # before: JSONDecodeError
    assert done == 2 and [r["round"] for r in rounds] == [0, 1, 2]
    assert "torn line(s)" in caplog.text and "rounds.jsonl" in caplog.text
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]


def test_torn_line_the_checkpoint_covers_is_named(tmp_path, capsys):
    run_dir = partial(tmp_path, 2)
    text = (run_dir / "rounds.jsonl").read_text()
    (run_dir / "rounds.jsonl").write_text(text[: len(text) - 40])  # round 2's line torn
    with pytest.raises(RunFolderError) as err:
        _resume_point(config(tmp_path), run_dir)
    msg = str(err.value)
    assert f"{run_dir / 'rounds.jsonl'} does not hold rounds 0..2" in msg and "round(s) [2] are missing" in msg
    assert "Restore rounds.jsonl" in msg
    # the same message from `check`, in seconds, before any run is submitted
    assert check_main(["--run-config", f"output-dir='{tmp_path}' run-name='r' resume=true", "--no-data"]) == 2
    assert "does not hold rounds 0..2" in capsys.readouterr().err


def test_truncated_checkpoint_is_named(tmp_path):
    run_dir = partial(tmp_path, 2)
    data = (run_dir / "checkpoint.npz").read_bytes()
    (run_dir / "checkpoint.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(RunFolderError) as err:  # before: zipfile.BadZipFile, no file named
        _resume_point(config(tmp_path), run_dir)
    msg = str(err.value)
    assert f"{run_dir / 'checkpoint.npz'} is damaged (BadZipFile" in msg
    assert "global model of round 2" in msg and "another run-name" in msg


def test_garbage_state_is_repaired_from_checkpoint_and_rounds(tmp_path, straight, caplog):
    run_dir = partial(tmp_path, 2)
    (run_dir / "state.json").write_text("\x00\x00garbage")
    with caplog.at_level(logging.WARNING):
        done, _, _ = _resume_point(config(tmp_path), run_dir)  # before: JSONDecodeError
    assert done == 2
    assert "state.json is unreadable" in caplog.text and "checkpoint.npz records round 2" in caplog.text
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]
    assert json.loads((run_dir / "state.json").read_text()) == {"round": ROUNDS}


def test_state_one_round_behind_the_checkpoint_continues_after_the_checkpoint(tmp_path, straight):
    """Killed between writing checkpoint.npz and state.json: the checkpoint is round 3, state
    says 2. Before, the server took round 2 with round 3's weights and re-ran round 3 on them."""
    run_dir = partial(tmp_path, 3)
    (run_dir / "state.json").write_text('{"round": 2}')
    done, _, rounds = _resume_point(config(tmp_path), run_dir)
    assert done == 3 and [r["round"] for r in rounds] == [0, 1, 2, 3]
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]


def test_garbage_state_with_an_old_checkpoint_is_not_guessed(tmp_path):
    run_dir = partial(tmp_path, 2)
    _, arrays = load_checkpoint(run_dir / "checkpoint.npz")
    results.save_arrays(run_dir / "checkpoint.npz", arrays)  # the format before the round stamp
    assert _resume_point(config(tmp_path), run_dir)[0] == 2  # state.json says which round
    (run_dir / "state.json").write_text("{")
    with pytest.raises(RunFolderError) as err:
        _resume_point(config(tmp_path), run_dir)
    msg = str(err.value)
    assert f"{run_dir / 'state.json'} is unreadable" in msg and "does not record its round" in msg
    assert 'write {"round": N} into state.json' in msg


def test_inconsistent_state_and_checkpoint_are_refused(tmp_path):
    run_dir = partial(tmp_path, 3)
    (run_dir / "state.json").write_text('{"round": 1}')
    with pytest.raises(RunFolderError, match="state.json says round 1 but .*checkpoint.npz holds round 3"):
        _resume_point(config(tmp_path), run_dir)


def test_garbage_config_json(tmp_path, caplog):
    run_dir = partial(tmp_path, 2)
    (run_dir / "config.json").write_text("not json")
    with pytest.raises(RunFolderError, match="config.json is unreadable .* cannot be compared"):
        _resume_point(config(tmp_path), run_dir)
    # a failed run's summary.json holds the config too: used when config.json is damaged
    (run_dir / "summary.json").write_text(json.dumps({"config": config(tmp_path).to_flower()}))
    with caplog.at_level(logging.WARNING):
        assert _resume_point(config(tmp_path), run_dir)[0] == 2
    assert "compared the settings with the copy in summary.json" in caplog.text


def test_not_resuming_a_folder_that_holds_a_run_is_refused(tmp_path):
    partial(tmp_path, 1)
    with pytest.raises(ConfigError, match="already holds a run; set resume=true"):
        _resume_point(config(tmp_path, resume=False), tmp_path / "r")


def test_resuming_a_run_folder_that_does_not_exist_is_refused_naming_it_and_the_closest_runs(tmp_path, capsys):
    """Not a silent new run from round 1: `fedvls check` and the server refuse it, naming the folder."""
    for name in ("digits-fedavg-s0", "digits-fedvls-s0", "cifar10-moon-s1"):
        partial(tmp_path, 1).rename(tmp_path / name)
    (tmp_path / "digits-fedvls-s9").mkdir()  # a folder without a run: nothing to resume, not listed
    missing = tmp_path / "digits-fedvls-s1"
    said = (f"run config 'resume' = true but there is no run folder {missing} (run-name = 'digits-fedvls-s1', "
            f"output-dir {tmp_path}); the runs in {tmp_path}, closest first: digits-fedvls-s0, digits-fedavg-s0, "
            "cifar10-moon-s1; set run-name to one of them, or drop resume=true")
    with pytest.raises(ConfigError) as err:  # the server, at start-up (before the test set or a round)
        run_experiment(FailingGrid(), config(tmp_path, run_name="digits-fedvls-s1"))
    assert str(err.value) == said
    assert not missing.exists()
    assert check_main(["--run-config", f"output-dir='{tmp_path}' run-name='digits-fedvls-s1' resume=true", "--no-data"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"
    nothing = tmp_path / "empty"
    assert check_main(["--run-config", f"output-dir='{nothing}' run-name='r' resume=true", "--no-data"]) == 2
    assert f"{nothing} holds no run to resume; to start a new run, drop resume=true" in capsys.readouterr().err


def test_resuming_an_existing_folder_without_a_finished_round_starts_at_round_1(tmp_path, caplog):
    """A sweep makes a run's folder before it submits the run with resume=true: that still starts."""
    (tmp_path / "r").mkdir()
    with caplog.at_level(logging.WARNING):
        assert _resume_point(config(tmp_path), tmp_path / "r") == (0, None, [])
    assert "holds no checkpoint; starting from round 1" in caplog.text


class FailingGrid:
    def __getattr__(self, name: str):
        raise AssertionError(f"grid.{name} used before the run folder was checked")


# ---- a full disk -------------------------------------------------------------------------------


def full_disk_at(monkeypatch, name: str, nth: int = 1) -> None:
    """The ``nth`` write of result file ``name`` (a glob pattern: ``checkpoint-frozen-*.npz``)
    fails in fsync with ENOSPC, as on a full disk (smaller writes after it may still fit, as a
    small summary.json can)."""
    real_write, real_fsync = results.atomic_write_bytes, results.os.fsync
    seen = {"count": 0, "failing": False}

    def write(path, data):
        seen["failing"] = False
        if fnmatch.fnmatchcase(Path(path).name, name):
            seen["count"] += 1
            seen["failing"] = seen["count"] == nth
        return real_write(path, data)

    def fsync(fd):
        if seen["failing"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(results, "atomic_write_bytes", write)
    monkeypatch.setattr(results.os, "fsync", fsync)


@pytest.mark.parametrize("failing", ["checkpoint.npz", "rounds.jsonl", "state.json"])
def test_full_disk_in_round_3_names_the_file_and_loses_nothing(tmp_path, monkeypatch, straight, failing):
    full_disk_at(monkeypatch, failing, 4 if failing == "rounds.jsonl" else 3)  # rounds.jsonl: round 0 too
    with pytest.raises(ResultsWriteError) as err:
        run_experiment(TrainingGrid(), config(tmp_path, resume=False))
    monkeypatch.undo()
    run_dir = tmp_path / "r"
    msg = str(err.value)
    assert msg.startswith(f"could not write {run_dir / failing}: No space left on device.")
    assert "The results up to round 2 of 4 are complete and safe" in msg
    assert "resume=true run-name='r'" in msg and "move the folder" in msg
    summary = json.loads((run_dir / "summary.json").read_text())
    # before: rounds_completed 3 (the round in memory) while the checkpoint held round 2
    assert summary["status"] == "failed" and summary["rounds_completed"] == 2
    assert summary["final_round"] == 2
    ck_round = load_checkpoint(run_dir / "checkpoint.npz")[0]
    assert ck_round in (2, 3)  # 3 when only state.json failed: rounds.jsonl and checkpoint agree
    # free space (or move the folder, see the moved-folder test) and resume: same rounds
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_full_disk_at_the_final_files(tmp_path, monkeypatch, straight):
    full_disk_at(monkeypatch, "model_final.npz")
    with pytest.raises(ResultsWriteError, match=r"All 4 rounds are complete and safe .* To write them"):
        run_experiment(TrainingGrid(), config(tmp_path, resume=False))
    monkeypatch.undo()
    run_experiment(TrainingGrid(), config(tmp_path))  # resume writes the final model and summary
    run_dir = tmp_path / "r"
    assert accuracies(run_dir) == straight[1]
    final, reference = (results.load_arrays(d / "model_final.npz") for d in (run_dir, straight[0]))
    assert final.keys() == reference.keys()
    for key in final:
        np.testing.assert_array_equal(final[key], reference[key])


def test_full_disk_before_any_round(tmp_path, monkeypatch):
    full_disk_at(monkeypatch, "config.json")
    with pytest.raises(ResultsWriteError, match="could not write .*config.json: No space left on device. No round"):
        run_experiment(TrainingGrid(), config(tmp_path, resume=False))


def test_writer_keeps_only_what_reached_the_disk(tmp_path, monkeypatch):
    writer = results.RunWriter(tmp_path)
    writer.append_round({"round": 0})
    monkeypatch.setattr(results.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError) as err:
        writer.append_round({"round": 1})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "rounds.jsonl")
    assert writer.rounds == [{"round": 0}] and read_rounds(tmp_path) == [{"round": 0}]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---- a stateful server optimizer resumes bit for bit (its state in the checkpoint) ---------

#: every server optimizer that keeps state across rounds, with settings that make it matter
STATEFUL = {
    "fedavgm": {"fedavgm_momentum": 0.9},
    "fedadam": {},
    "fedyogi": {},
    "fedadagrad": {},
    "fedexp": {},
}


def test_every_stateful_server_optimizer_is_covered():
    from fedvls_flwr.config.registry import SERVER_OPTIMIZERS

    assert sorted(STATEFUL) == sorted(p.name for p in SERVER_OPTIMIZERS if p.name != "fedavg")


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_resume_with_a_stateful_server_optimizer_is_bit_identical(tmp_path, name):
    """Stopped after round 2 of 4 and resumed: rounds, final model and the optimizer's state
    equal an uninterrupted run's, bit for bit. Losing the state (never written, or never
    loaded back) changes round 3 on."""
    settings = {"server_optimizer": name, **STATEFUL[name]}
    straight_dir = run_experiment(TrainingGrid(), config(tmp_path / "straight", resume=False, **settings))
    run_dir = run_experiment(TrainingGrid(), config(tmp_path / "resumed", num_server_rounds=2, resume=False, **settings))
    (run_dir / "summary.json").unlink()
    (run_dir / "model_final.npz").unlink()
    saved = load_checkpoint(run_dir / "checkpoint.npz")[1]
    assert any(k.startswith("server-optimizer/") for k in saved), f"{name}: no optimizer state in the checkpoint"
    run_experiment(TrainingGrid(), config(tmp_path / "resumed", **settings))
    assert accuracies(run_dir) == accuracies(straight_dir)
    for final in ("model_final.npz", "checkpoint.npz"):
        if final == "checkpoint.npz":  # read whole: the arrays it takes from its frozen file too
            (round_a, a), (round_b, b) = load_checkpoint(straight_dir / final), load_checkpoint(run_dir / final)
            assert round_a == round_b == ROUNDS, final
        else:
            a, b = results.load_arrays(straight_dir / final), results.load_arrays(run_dir / final)
        assert sorted(a) == sorted(b), final
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (final, key)


def test_resuming_with_fewer_rounds_than_completed_is_refused_by_check_and_server(tmp_path, capsys):
    """A finished 4-round run resumed with num-server-rounds = 2 would log 'resuming after round
    4 of 2' and rewrite summary.json with 2 rounds beside rounds_completed 4."""
    run_experiment(TrainingGrid(), RunConfig(dataset="digits", num_server_rounds=ROUNDS,
                                             output_dir=str(tmp_path), run_name="r"))
    summary = (tmp_path / "r" / "summary.json").read_text()
    fewer = RunConfig(dataset="digits", num_server_rounds=2, output_dir=str(tmp_path), run_name="r", resume=True)
    said = "has completed 4 rounds, more than num-server-rounds = 2: a run does not go back"
    with pytest.raises(RunFolderError, match=said):
        run_experiment(TrainingGrid(), fewer)
    assert (tmp_path / "r" / "summary.json").read_text() == summary
    assert check_main(["--no-data", "--run-config",
                       f"output-dir='{tmp_path}' run-name='r' resume=true num-server-rounds=2"]) == 2
    err = capsys.readouterr().err
    assert said in err and "resume with num-server-rounds > 4" in err
    assert check_main(["--no-data", "--run-config",
                       f"output-dir='{tmp_path}' run-name='r' resume=true num-server-rounds=6"]) == 0


def test_resuming_a_finished_run_leaves_its_files_as_they_are_and_says_so(tmp_path, caplog, capsys, straight):
    """A finished run resumed with the rounds it ran. Before, the resume wrote its final files
    again as its own: summary.json with this session's ~0 s as the run's wall_seconds and
    resumed_after_round = 4 (what a second sweep on the same folder did to a run the first had
    finished meanwhile). Now nothing is written, check and the server say why; more rounds
    still continue it, and a run whose summary says it failed still gets its final files."""
    run_dir = run_experiment(TrainingGrid(), config(tmp_path, resume=False))

    def files() -> dict[str, tuple[bytes, int]]:
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir()
                if p.is_file() and p.name != results.LOCK_FILE}

    before = files()
    said = "has already finished its 4 rounds (summary.json: completed); nothing to do"
    with caplog.at_level(logging.INFO):
        assert run_experiment(TrainingGrid(), config(tmp_path)) == run_dir
    assert said in caplog.text and "resuming after round" not in caplog.text
    assert files() == before
    assert results.lock_holder(run_dir) is None  # the folder is free again
    assert check_main(["--no-data", "--run-config", f"output-dir='{tmp_path}' run-name='r' resume=true "
                       f"num-server-rounds={ROUNDS}"]) == 0
    assert said in capsys.readouterr().err

    run_experiment(TrainingGrid(), config(tmp_path, num_server_rounds=ROUNDS + 2))  # more rounds: it goes on
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["rounds_completed"], summary["resumed_after_round"]) == (ROUNDS + 2, ROUNDS)
    assert accuracies(run_dir)[:ROUNDS + 1] == straight[1]

    more = config(tmp_path, num_server_rounds=ROUNDS + 2)
    for damage in ("says it failed", "names fewer rounds", "no final model"):  # the resume writes what a finished run has
        if damage == "no final model":
            (run_dir / "model_final.npz").unlink()
        else:
            key, value = ("status", "failed") if damage == "says it failed" else ("rounds_completed", ROUNDS)
            (run_dir / "summary.json").write_text(json.dumps({**summary, key: value}))
        run_experiment(TrainingGrid(), more)
        again = json.loads((run_dir / "summary.json").read_text())
        assert (again["status"], again["rounds_completed"], again["resumed_after_round"]) == ("completed", ROUNDS + 2,
                                                                                          ROUNDS + 2), damage
        assert (run_dir / "model_final.npz").exists(), damage


def test_resuming_a_finished_run_with_tracking_writes_only_the_trackers_files(tmp_path, caplog):
    """Tracking may be added on resume, and a finished run gets its event files so (docs/tracking.md):
    written from rounds.jsonl, the run's other files left as they are."""
    pytest.importorskip("tensorboard")
    run_dir = run_experiment(TrainingGrid(), config(tmp_path, resume=False))
    summary = (run_dir / "summary.json").read_bytes()
    with caplog.at_level(logging.INFO):
        run_experiment(TrainingGrid(), config(tmp_path, tracking="tensorboard"))
    assert "only its tensorboard files are written again (from rounds.jsonl)" in caplog.text
    assert list(run_dir.rglob("events.out.tfevents.*"))
    assert (run_dir / "summary.json").read_bytes() == summary


def test_the_server_log_warns_of_rounds_that_would_never_end(tmp_path, caplog):
    """check says it, and so does the run's own log (a run submitted without check)."""
    from fedvls_flwr.app.server import ServerRun

    cfg = RunConfig(dataset="digits", num_server_rounds=1_000_000_000, output_dir=str(tmp_path), run_name="r")
    with caplog.at_level(logging.WARNING):
        ServerRun(TrainingGrid(), cfg)
    assert "num-server-rounds = 1000000000 is far beyond the at most 300 rounds" in caplog.text
    assert "samples" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ServerRun(TrainingGrid(), cfg.replace(num_server_rounds=300, run_name="s"))
    assert "far beyond" not in caplog.text


@pytest.mark.parametrize("local_optimizer", ["sgd", "fedgf"])
def test_a_setting_nothing_in_the_run_reads_does_not_stop_a_resume(tmp_path, local_optimizer):
    """Runs recorded fedgf-threshold = 1.5, its default until it had none; neither an SGD run
    nor a FedGF run with a fixed c reads it, so the new default must not make them 'other'."""
    cfg = RunConfig(dataset="digits", num_server_rounds=2, output_dir=str(tmp_path), run_name="r",
                    local_optimizer=local_optimizer)
    run_experiment(TrainingGrid(), cfg.replace(fedgf_threshold=1.5))
    run_dir = run_experiment(TrainingGrid(), cfg.replace(num_server_rounds=3, resume=True))
    assert [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2, 3]
    with pytest.raises(RunFolderError, match="other settings \\(lr: 0.01 -> 0.5\\)"):  # a setting the run reads
        run_experiment(TrainingGrid(), cfg.replace(num_server_rounds=4, resume=True, lr=0.5))


# ---- a round's files are written while the next round trains -----------------------------------


class EventGrid(TrainingGrid):
    """TrainingGrid that notes when each round's training starts (and can be stopped in one)."""

    def __init__(self, events: list[tuple[str, int, float]], interrupt_at: int | None = None):
        super().__init__()
        self.events, self.interrupt_at = events, interrupt_at

    def answer(self, messages):
        server_round = int(messages[0].content[CONFIG_KEY][SERVER_ROUND])
        self.events.append(("train", server_round, time.monotonic()))
        if server_round == self.interrupt_at:
            raise KeyboardInterrupt  # Ctrl-C while the round before is being written
        return super().answer(messages)


def slow_checkpoints(monkeypatch, events: list[tuple[str, int, float]], seconds: float) -> None:
    """Every checkpoint write takes ``seconds`` longer, and notes when it ended."""
    real = results.save_checkpoint

    def save(path, arrays, server_round):
        time.sleep(seconds)
        real(path, arrays, server_round)
        events.append(("checkpoint", server_round, time.monotonic()))

    monkeypatch.setattr(results, "save_checkpoint", save)


def test_a_rounds_files_are_written_while_the_next_round_trains(tmp_path, monkeypatch, straight):
    """Round r's checkpoint is written only once round r + 1 has started training (a handshake,
    not a race): a server that waited for its files before the next round would never start it,
    and the write gives up waiting after 30 s."""
    events: list[tuple[str, int, float]] = []
    started = {r: threading.Event() for r in range(1, ROUNDS + 2)}
    real = results.save_checkpoint

    def save(path, arrays, server_round):
        started[server_round + 1].wait(timeout=30 if server_round < ROUNDS else 0)
        real(path, arrays, server_round)
        events.append(("checkpoint", server_round, time.monotonic()))

    class Noting(EventGrid):
        def answer(self, messages):
            server_round = int(messages[0].content[CONFIG_KEY][SERVER_ROUND])
            self.events.append(("train", server_round, time.monotonic()))  # noted before the write may go on
            started[server_round].set()
            return TrainingGrid.answer(self, messages)

    monkeypatch.setattr(results, "save_checkpoint", save)
    run_dir = run_experiment(Noting(events), config(tmp_path, resume=False))
    at = {(kind, r): t for kind, r, t in events}
    for r in range(1, ROUNDS):
        # before: round r + 1 started only once round r's checkpoint was on disk
        assert at[("train", r + 1)] < at[("checkpoint", r)], f"round {r + 1} waited for round {r}'s files"
    assert accuracies(run_dir) == straight[1]
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == ROUNDS
    assert json.loads((run_dir / "state.json").read_text()) == {"round": ROUNDS}
    final, reference = (results.load_arrays(d / "model_final.npz") for d in (run_dir, straight[0]))
    for key in reference:
        np.testing.assert_array_equal(final[key], reference[key])


def test_ctrl_c_while_a_round_is_written_still_writes_it(tmp_path, monkeypatch, straight):
    events: list[tuple[str, int, float]] = []
    slow_checkpoints(monkeypatch, events, 0.5)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(EventGrid(events, interrupt_at=3), config(tmp_path, resume=False))
    run_dir = tmp_path / "r"
    # round 2's files were being written when round 3 was stopped: the run waited for them
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == 2
    assert json.loads((run_dir / "state.json").read_text()) == {"round": 2}
    assert [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2]
    monkeypatch.undo()
    run_experiment(TrainingGrid(), config(tmp_path))  # the folder is free again, and resumes
    assert accuracies(run_dir) == straight[1]


def test_a_round_state_changed_after_the_round_is_written_as_it_was(tmp_path, monkeypatch, straight):
    """What a round's files hold is taken when the round ends: the record and the server state
    the next round changes are copied, not read later by the writing thread."""
    from fedvls_flwr.app import server

    events: list[tuple[str, int, float]] = []
    slow_checkpoints(monkeypatch, events, 0.2)
    real = server.ServerRun.save_round

    def save_then_scribble(self, server_round, record, arrays, report):
        real(self, server_round, record, arrays, report)
        record["accuracy"] = -1.0  # the round's record changed while its files are written
        for value in self.strategy.server_state().values():
            value[...] = 0  # and the server's state

    monkeypatch.setattr(server.ServerRun, "save_round", save_then_scribble)
    run_dir = run_experiment(TrainingGrid(), config(tmp_path, resume=False, server_optimizer="fedavgm",
                                                   fedavgm_momentum=0.9))
    assert all(r["accuracy"] != -1.0 for r in read_rounds(run_dir))
    _, saved = load_checkpoint(run_dir / "checkpoint.npz")
    moments = [v for k, v in saved.items() if "momentum" in k or "server" in k]
    assert moments and any(np.any(v != 0) for v in moments)


class SilentRound(TrainingGrid):
    """TrainingGrid whose round ``silent`` gets no replies: the round fails."""

    def __init__(self, silent: int):
        super().__init__()
        self.silent = silent

    def answer(self, messages):
        return [] if int(messages[0].content[CONFIG_KEY][SERVER_ROUND]) == self.silent else super().answer(messages)


def failing_checkpoint(monkeypatch, failing_round: int, delay: float = 0.0) -> None:
    """Round ``failing_round``'s checkpoint fails with ENOSPC (after ``delay`` seconds)."""
    real = results.save_checkpoint

    def save(path, arrays, server_round):
        if server_round == failing_round:
            time.sleep(delay)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, arrays, server_round)

    monkeypatch.setattr(results, "save_checkpoint", save)


def test_a_full_disk_then_a_failed_round_reports_the_disk_and_the_round_that_is_safe(tmp_path, monkeypatch, straight,
                                                                                        caplog):
    """Round 2's files fail on their thread while round 3 trains, and round 3 fails too: the
    run stops with the disk's message and round 1 as safe, not with the round failure's claim
    that round 2 is saved."""
    failing_checkpoint(monkeypatch, 2)
    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(ResultsWriteError) as err:
        run_experiment(SilentRound(3), config(tmp_path, resume=False, round_retries=0, round_timeout=0.5))
    monkeypatch.undo()
    run_dir = tmp_path / "r"
    msg = str(err.value)
    assert msg.startswith(f"could not write {run_dir / 'checkpoint.npz'}: No space left on device.")
    assert "The results up to round 1 of 4 are complete and safe" in msg
    assert "round 3 failed" in caplog.text  # the round's own failure is still told
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["error"] == msg
    assert json.loads((run_dir / "state.json").read_text()) == {"round": 1}
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]


def test_an_error_while_a_round_is_written_counts_that_round_once_written(tmp_path, monkeypatch, straight):
    events: list[tuple[str, int, float]] = []
    slow_checkpoints(monkeypatch, events, 0.4)
    with pytest.raises(Exception, match="round 3 failed"):
        run_experiment(SilentRound(3), config(tmp_path, resume=False, round_retries=0, round_timeout=0.1))
    monkeypatch.undo()
    run_dir = tmp_path / "r"
    summary = json.loads((run_dir / "summary.json").read_text())
    # round 2's files were still being written when round 3 failed: the run waited for them
    assert summary["status"] == "failed" and summary["rounds_completed"] == 2
    assert "Results up to round 2 are saved" in summary["error"]
    assert json.loads((run_dir / "state.json").read_text()) == {"round": 2}
    run_experiment(TrainingGrid(), config(tmp_path))
    assert accuracies(run_dir) == straight[1]


def test_ctrl_c_while_waiting_for_a_write_that_fails_still_says_so(tmp_path, monkeypatch, caplog):
    from fedvls_flwr.app import server

    class InterruptedWait:
        """Ctrl-C arrives while the server waits for the round's files."""

        def __init__(self, future):
            self.future = future

        def result(self):
            raise KeyboardInterrupt

        def done(self):
            return self.future.done()

        def exception(self):
            return self.future.exception()

    failing_checkpoint(monkeypatch, 2, delay=0.3)
    real = server.ServerRun.save_round

    def save_round(self, server_round, record, arrays, report):
        real(self, server_round, record, arrays, report)
        if server_round == 2:
            self.saving = InterruptedWait(self.saving)

    monkeypatch.setattr(server.ServerRun, "save_round", save_round)
    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(KeyboardInterrupt):
        run_experiment(TrainingGrid(), config(tmp_path, resume=False))
    assert "round 2's files were not all written either" in caplog.text and "No space left" in caplog.text
    assert json.loads((tmp_path / "r" / "state.json").read_text()) == {"round": 1}


def test_a_round_saved_after_the_writer_thread_is_gone_is_written_in_place(tmp_path, monkeypatch, straight):
    """A process that is exiting takes no new threads (Flower's simulation ends its process so):
    the round's files are written by the server itself."""
    from fedvls_flwr.app import server

    real = server.ServerRun.save_round

    def save_round(self, server_round, record, arrays, report):
        if server_round == 3:
            self.saver.shutdown(wait=True)
        real(self, server_round, record, arrays, report)

    monkeypatch.setattr(server.ServerRun, "save_round", save_round)
    run_dir = run_experiment(TrainingGrid(), config(tmp_path, resume=False))
    assert accuracies(run_dir) == straight[1]
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == ROUNDS


# ---- the frozen file beside the checkpoint (FedConcat's second stage) --------------------------
# From FedConcat's first head round on, checkpoint.npz takes the frozen encoders (digits: their
# 200x200 layers, 160 KB each, above FROZEN_MIN_BYTES) from checkpoint-frozen-<digest>.npz.
FROZEN = f"{results.FROZEN_FILE_PREFIX}*.npz"


def run_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != results.LOCK_FILE}


@pytest.fixture(scope="module")
def concat_straight(tmp_path_factory) -> tuple[Path, list]:
    """An uninterrupted FedConcat run (2 encoder rounds, 3 head rounds): the reference."""
    run_dir = run_experiment(ConcatGrid(), concat_config(tmp_path_factory.mktemp("concat")))
    return run_dir, history(run_dir)


def concat_partial(out: Path, rounds: int) -> Path:
    """A FedConcat run stopped after ``rounds`` (as a killed server leaves it); from round 3 on
    its checkpoint names a frozen file."""
    run_dir = run_experiment(ConcatGrid(), concat_config(out, num_server_rounds=rounds))
    (run_dir / "summary.json").unlink()
    (run_dir / "model_final.npz").unlink()
    assert len(list(run_dir.glob(FROZEN))) == (1 if rounds >= 3 else 0)
    return run_dir


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_damaged_frozen_file_ends_the_resume_naming_it_and_changes_nothing(tmp_path, concat_straight,
                                                                                        damage):
    """The server's resume (flwr run's path) is refused naming the frozen file - not the intact
    checkpoint.npz - and what to do; no file of the folder is written, so nothing computed is
    lost: with the frozen file restored the run resumes and equals a straight run."""
    run_dir = concat_partial(tmp_path, 4)
    (frozen,) = run_dir.glob(FROZEN)
    copy = frozen.read_bytes()
    if damage == "missing":
        frozen.unlink()
    else:
        frozen.write_bytes(copy[: len(copy) // 2])
    before = run_files(run_dir)
    with pytest.raises(RunFolderError) as err:
        run_experiment(ConcatGrid(), concat_config(tmp_path, resume=True))
    msg = str(err.value)
    what = "is missing" if damage == "missing" else "is damaged (BadZipFile"
    assert msg.startswith(f"resume: {frozen} {what}")
    assert f"{run_dir / 'checkpoint.npz'} is damaged" not in msg and "Restore that file from a copy" in msg
    assert run_files(run_dir) == before  # rounds.jsonl, checkpoint.npz, state.json ... untouched
    frozen.write_bytes(copy)  # restored from a copy: the run goes on, every round once
    resumed = run_experiment(ConcatGrid(), concat_config(tmp_path, resume=True))
    assert history(resumed) == concat_straight[1]


def test_a_full_disk_writing_the_frozen_file_keeps_the_last_checkpoint_and_resumes(tmp_path, monkeypatch,
                                                                                  concat_straight):
    """ENOSPC writing the frozen file of round 3's checkpoint (the first head round): the run
    stops naming that file and round 2 as safe; the frozen file is not left half written, round
    2's checkpoint still loads; resumed once there is room, the run equals a straight one."""
    full_disk_at(monkeypatch, FROZEN)
    with pytest.raises(ResultsWriteError) as err:
        run_experiment(ConcatGrid(), concat_config(tmp_path))
    monkeypatch.undo()
    run_dir = tmp_path / "r"
    msg = str(err.value)
    assert re.match(rf"could not write {re.escape(str(run_dir))}/{results.FROZEN_FILE_PREFIX}[0-9a-f]+\.npz: "
                    "No space left on device. The results up to round 2 of 5 are complete and safe", msg), msg
    assert "resume=true run-name='r'" in msg
    assert list(run_dir.glob(FROZEN)) == [] and not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 2
    resumed = run_experiment(ConcatGrid(), concat_config(tmp_path, resume=True))
    assert history(resumed) == concat_straight[1]
    assert len(list(run_dir.glob(FROZEN))) == 1  # written once there was room
    final, reference = (results.load_arrays(d / "model_final.npz") for d in (resumed, concat_straight[0]))
    assert final.keys() == reference.keys() and all(np.array_equal(final[k], reference[k]) for k in final)


def test_a_full_disk_writing_a_new_frozen_file_leaves_the_last_checkpoint_and_its_frozen_file(tmp_path, monkeypatch):
    """A second frozen file (more arrays stopped changing) that cannot be written: checkpoint.npz
    still holds the round before and the frozen file it names, both intact and loadable; the
    writer knows nothing of the failed round, so the same checkpoint written again once there is
    room is whole."""
    from fedvls_flwr.app.messages import npy_array

    def big(value):
        return npy_array(np.full(results.FROZEN_MIN_BYTES // 4, value, np.float32)).data

    writer = results.RunWriter(tmp_path)
    writer.save_checkpoint({"a": big(1), "b": big(1)}, 1)
    writer.save_checkpoint({"a": big(1), "b": big(2)}, 2)  # a stopped changing: frozen file {a}
    (first,) = tmp_path.glob(FROZEN)
    kept = run_files(tmp_path)
    full_disk_at(monkeypatch, FROZEN)
    with pytest.raises(OSError) as err:  # b stopped changing too: a new frozen file {a, b}
        writer.save_checkpoint({"a": big(1), "b": big(2)}, 3)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC and Path(err.value.filename).name.startswith(results.FROZEN_FILE_PREFIX)
    assert Path(err.value.filename) != first and run_files(tmp_path) == kept  # no file changed, none added
    done, arrays = load_checkpoint(tmp_path / "checkpoint.npz")
    assert done == 2 and np.array_equal(arrays["a"], np.full(results.FROZEN_MIN_BYTES // 4, 1, np.float32))
    writer.save_checkpoint({"a": big(1), "b": big(2)}, 3)  # room again
    (second,) = tmp_path.glob(FROZEN)
    assert second != first  # the old one removed once no checkpoint names it
    done, arrays = load_checkpoint(tmp_path / "checkpoint.npz")
    assert done == 3 and np.array_equal(arrays["b"], np.full(results.FROZEN_MIN_BYTES // 4, 2, np.float32))
    assert "b" not in results.load_arrays(tmp_path / "checkpoint.npz")


def test_a_full_disk_after_a_frozen_file_names_it_among_what_is_safe(tmp_path, monkeypatch):
    """ENOSPC writing round 4's checkpoint of a FedConcat run: round 3's checkpoint takes its
    encoders from the frozen file, so the message counts that file among the safe ones."""
    full_disk_at(monkeypatch, "checkpoint.npz", 4)
    with pytest.raises(ResultsWriteError) as err:
        run_experiment(ConcatGrid(), concat_config(tmp_path))
    monkeypatch.undo()
    run_dir = tmp_path / "r"
    (frozen,) = run_dir.glob(FROZEN)
    assert (f"The results up to round 3 of 5 are complete and safe in {run_dir} (checkpoint.npz, {frozen.name}, "
            "rounds.jsonl, state.json)") in str(err.value)
    assert load_checkpoint(run_dir / "checkpoint.npz")[0] == 3
