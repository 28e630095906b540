"""The time-left estimates: a run's (RoundClock), a sweep's (SweepClock over runs followed
through their rounds.jsonl) and how the sweep shows them."""

import io
import json
import os
import time

import pytest

from fedvls_flwr.app.time_left import RoundClock, format_duration
from fedvls_flwr.experiments.progress import PROGRESS_FILE, ProgressView, RunWatch, SweepClock, SweepProgress, bar


def approx(value):
    return pytest.approx(value, abs=1e-9)


def test_round_clock_uses_the_slope_after_the_first_round():
    clock = RoundClock(10)
    clock.start(0, t=100.0)
    assert clock.per_round() is None and clock.left(now=100.0) is None
    clock.observe(1, t=130.0)  # round 1 carries 20 s of client start-up
    assert clock.per_round() == 30.0 and clock.left(now=130.0) == 9 * 30.0
    clock.observe(2, t=140.0)
    clock.observe(2, t=150.0)  # seen again: ignored
    clock.observe(4, t=160.0)  # two rounds at once
    assert clock.per_round() == pytest.approx(10.0)  # (160 - 130) / (4 - 1)
    assert clock.left(now=160.0) == pytest.approx(60.0)
    assert clock.left(now=165.0) == pytest.approx(55.0)  # counts down between rounds
    assert clock.left(now=1000.0) == 0.0  # a slow round: never below zero


def test_round_clock_of_a_resumed_run_counts_from_its_restart():
    clock = RoundClock(10)
    clock.start(6, t=0.0)
    clock.observe(5, t=1.0)  # a round before the restart point is not this process's
    assert clock.round is None
    clock.observe(7, t=12.0)
    assert clock.per_round() == 12.0 and clock.left(now=12.0) == 36.0


def test_a_runs_own_estimate_waits_for_the_second_round():
    """Round 1's time holds the clients' start-up: from it alone a one-minute run of 30 rounds
    said ~17 minutes left. Its log shows no estimate until a second round has ended."""
    clock = RoundClock(30)
    clock.start(0, t=0.0)
    clock.observe(1, t=35.0)  # 33 s of Ray and data start-up, 2 s of training
    assert clock.left(now=35.0) == 29 * 35.0 and clock.steady_left(now=35.0) is None
    clock.observe(2, t=37.0)
    assert clock.steady_left(now=37.0) == pytest.approx(28 * 2.0)
    one = RoundClock(1)
    one.start(0, t=0.0)
    one.observe(1, t=35.0)
    assert one.steady_left(now=35.0) == 0.0  # the last round ended: nothing left


def test_the_servers_round_lines_say_when_the_estimate_comes(tmp_path, caplog):
    import logging

    from fedvls_flwr.app.server import run_experiment
    from fedvls_flwr.config.run_config import RunConfig
    from tests.runs import flower_run_identity
    from tests.test_resume import TrainingGrid

    with flower_run_identity(), caplog.at_level(logging.INFO):
        run_experiment(TrainingGrid(), RunConfig(dataset="digits", num_server_rounds=3, output_dir=str(tmp_path),
                                                 run_name="r"))
    lines = {int(m.split("/")[0].split()[-1]): m for m in caplog.messages if m.startswith("round ") and "/3:" in m}
    assert lines[1].endswith("time left: after round 2") and "~" not in lines[1]
    assert lines[2].endswith(" left") and "~" in lines[2]
    assert lines[3].endswith("~0s left")


def test_format_duration():
    assert [format_duration(s) for s in (None, 0, 9.6, 65, 3599, 3600, 3725)] == [
        "?", "0s", "10s", "1m05s", "59m59s", "1h00m", "1h02m"]


WALL = 1.8e9  # the wall clock of the watches below: rounds.jsonl's mtime is set on it


def _write_rounds(run_dir, rounds, accuracy=0.5, ago=0.0, real_time=False):
    """rounds.jsonl with rounds 0..rounds, written ``ago`` seconds before WALL (``real_time``: now)."""
    text = "".join(json.dumps({"round": r, "accuracy": accuracy}) + "\n" for r in range(rounds + 1))
    (run_dir / "rounds.jsonl").write_text(text)
    if not real_time:
        os.utime(run_dir / "rounds.jsonl", (WALL - ago, WALL - ago))


def test_run_watch_follows_rounds_jsonl_and_ignores_a_file_older_than_the_run(tmp_path):
    _write_rounds(tmp_path, 3, ago=1000)  # a resumed run's file from before
    watch = RunWatch(tmp_path, 5, t_submit=0.0, wall=lambda: WALL - 100)  # submitted 100 s ago
    watch.wall = lambda: WALL
    assert not watch.poll(1.0) and not watch.started
    _write_rounds(tmp_path, 0)  # the new run's round 0
    assert not watch.poll(2.0) and watch.started
    _write_rounds(tmp_path, 1, accuracy=0.625)
    assert watch.poll(12.0) and watch.accuracy == 0.625 and watch.clock.round == 1
    assert not watch.poll(13.0)  # nothing new
    assert watch.clock.per_round() == 10.0
    _write_rounds(tmp_path, 2, ago=5.0)  # round 2 ended 5 s before this look
    assert watch.poll(30.0) and watch.clock.last == (2, 25.0)


def test_run_watch_counts_rounds_that_ended_before_its_first_look(tmp_path):
    """A run faster than the sweep's polling (the in-process engine: a digits round in a tenth
    of a second) writes its last round before the first look: its progress still shows."""
    watch = RunWatch(tmp_path, 2, t_submit=0.0, wall=lambda: WALL)  # nothing on disk at submission
    _write_rounds(tmp_path, 2, accuracy=0.5, ago=0.0)
    assert watch.poll(1.0) and watch.clock.round == 2 and watch.accuracy == 0.5


def _finished_watch(tmp_path, name, total, t_submit, round_ends):
    """A RunWatch of a ``total``-round run that saw round i end at round_ends[i] (round 0: written)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    watch = RunWatch(run_dir, total, t_submit, wall=lambda: WALL)
    for r, t in enumerate(round_ends):
        _write_rounds(run_dir, r)
        watch.poll(t)
    return watch


def test_sweep_clock_estimates_later_runs_from_the_finished_ones(tmp_path):
    clock = SweepClock([("fedavg", 4), ("fedvls", 4), ("fedavg", 2), ("fedvls", 8)])
    # run 1: submitted at 0, round 0 at 10, rounds of 5 s after a 10 s first round, reported done at 33
    first = _finished_watch(tmp_path, "a", 4, 0.0, [10.0, 20.0, 25.0, 30.0, 35.0])
    done = clock.finish(first, "fedavg", now=37.0)
    assert (done.per_round, done.rounds, done.tail, done.seconds) == (approx(5.0), 4, approx(2.0), 37.0)
    assert done.overhead == approx(17.0)
    # run 2 (fedvls; none finished yet): round 1 ended 8 s after round 0; one round says little
    # (start-up), so the finished runs' 5 s per round count, plus run 1's 2 s after its last round
    second = _finished_watch(tmp_path, "c", 4, 100.0, [110.0, 118.0])
    assert clock.run_left(1, second, now=118.0) == approx(3 * 5.0 + 2.0)
    # later runs: fedavg at fedavg's 5 s, fedvls at the mean of the finished runs' (5 s), + 17 s each
    assert clock.sweep_left(1, second, now=118.0) == approx(17.0 + (17 + 2 * 5) + (17 + 8 * 5))
    # after round 2 the run's own slope: rounds 1 -> 2 took 6 s
    _write_rounds(tmp_path / "c", 2)
    second.poll(124.0)
    assert clock.run_left(1, second, now=124.0) == approx(2 * 6.0 + 2.0)


def test_sweep_clock_before_anything_finished_uses_the_current_run(tmp_path):
    clock = SweepClock([("fedavg", 3), ("fedavg", 3)])
    run = _finished_watch(tmp_path, "a", 3, 0.0, [6.0, 10.0])
    # start-up so far = first round's end (10) - submission (0) - one round (4) = 6
    assert clock.run_left(0, run, now=10.0) == approx(8.0)
    assert clock.sweep_left(0, run, now=10.0) == approx(8.0 + 6.0 + 3 * 4.0)
    fresh = RunWatch(tmp_path / "a", 3, 0.0, wall=lambda: WALL)  # no round ended yet: unknown
    assert clock.run_left(0, fresh, now=1.0) is None and clock.sweep_left(0, fresh, now=1.0) is None


def test_progress_view_plain_lines_are_throttled_and_messages_always_written():
    lines: list[str] = []
    view = ProgressView(lines.append, every=3600.0)
    view.status("round 1")
    view.status("round 2")  # within the hour: not written
    view.status("round 3", force=True)
    view.message("done")
    assert lines == ["round 1", "round 3", "done"]


def test_progress_view_live_redraws_one_line():
    out = io.StringIO()
    view = ProgressView(lambda text: out.write(text + "\n"), live=True, stream=out)
    view.status("round 1", bar=bar(1, 4, width=4))
    view.message("a message")
    view.close()
    assert out.getvalue() == "\r\x1b[Kround 1 [#---]\r\x1b[Ka message\n\r\x1b[Kround 1 [#---]\r\x1b[K"


def test_sweep_progress_records_every_estimate(tmp_path):
    lines: list[str] = []
    progress = SweepProgress(tmp_path, [("r1", "fedavg", 2), ("r2", "fedavg", 2)], ProgressView(lines.append, every=0))
    (tmp_path / "r1").mkdir()
    progress.start(0, tmp_path / "r1")
    for r in range(3):
        _write_rounds(tmp_path / "r1", r, accuracy=0.25 * r, real_time=True)
        progress.poll()
    progress.finish("fedavg", "finished:completed")
    progress.close()
    events = [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()]
    assert [e["event"] for e in events] == ["run-start", "round", "round", "run-end", "sweep-end"]
    assert [e["round"] for e in events if e["event"] == "round"] == [1, 2]
    assert events[2]["run_left"] is not None and events[2]["sweep_left"] is not None
    assert lines[0].startswith("[sweep] (1/2) r1: round 1/2, accuracy 25.00%, run ~")
    assert "sweep ~" in lines[1] and "round 2/2, accuracy 50.00%" in lines[1]


def test_sweep_progress_follows_the_run_in_a_thread_while_the_sweep_waits(tmp_path):
    lines: list[str] = []
    progress = SweepProgress(tmp_path, [("r1", "fedavg", 2)], ProgressView(lines.append, every=0))
    (tmp_path / "r1").mkdir()
    progress.start(0, tmp_path / "r1")
    with progress.following(every=0.02):
        _write_rounds(tmp_path / "r1", 0, real_time=True)
        deadline = time.monotonic() + 10
        while not (progress.watch and progress.watch.started) and time.monotonic() < deadline:
            time.sleep(0.01)
        _write_rounds(tmp_path / "r1", 1, real_time=True)
        while not lines and time.monotonic() < deadline:
            time.sleep(0.01)
        _write_rounds(tmp_path / "r1", 2, real_time=True)  # seen by the last look when the wait ends
    assert [line.split(":")[1].split(",")[0] for line in lines] == [" round 1/2", " round 2/2"]


def test_after_one_round_a_later_run_uses_the_finished_runs_seconds_per_round(tmp_path):
    clock = SweepClock([("fedavg", 4), ("fedavg", 4)])
    clock.finish(_finished_watch(tmp_path, "a", 4, 0.0, [10.0, 20.0, 25.0, 30.0, 35.0]), "fedavg", now=37.0)
    second = _finished_watch(tmp_path, "b", 4, 100.0, [110.0, 140.0])  # round 1: 30 s, mostly start-up
    assert second.clock.left(now=140.0) == approx(90.0)  # the run's own slope
    assert clock.run_left(1, second, now=140.0) == approx(3 * 5.0 + 2.0)  # the finished run's 5 s per round

