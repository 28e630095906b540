"""A sweep's progress: the run in progress (round i of N, its latest accuracy) and the time
left for that run and for the whole sweep, from the round times measured so far.

The sweep follows a run by reading its ``rounds.jsonl`` as the server rewrites it after each
round (the file's modification time is when the round ended). A run's time left:
:class:`~fedvls_flwr.app.time_left.RoundClock` (rounds left x seconds per round, measured on
this run; after its first round, whose time holds the clients' start-up, the finished runs'
seconds per round instead) plus the time the finished runs took after their
last round (writing the final files, the run's processes stopping). A run not started yet
is estimated as its rounds x the seconds per round of the finished runs of the same method
(of all finished runs when none of its method has finished; of the current run before any
has finished), plus their mean start-up and wind-down (each finished run's time beyond its
rounds). docs/tracking.md measures how good the estimates were.

In a terminal the status is one live line redrawn in place; in a log or CI (stdout is not a
terminal) it is a plain line per round, at most one every ``every`` seconds. Every estimate
also goes to ``sweep-progress.jsonl`` in the output folder, with the time it was made, so
it can be compared with when the run and the sweep really ended (``bench/sweep_estimates.py``).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedvls_flwr.app.results import ROUNDS_FILE
from fedvls_flwr.app.time_left import RoundClock, format_duration

#: The file in a sweep's output folder that records every estimate as it was made.
PROGRESS_FILE = "sweep-progress.jsonl"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


class RunWatch:
    """One run, followed through its rounds.jsonl from the moment it was submitted."""

    def __init__(self, run_dir: Path, total: int, t_submit: float, wall: Callable[[], float] = time.time) -> None:
        """``t_submit``: when the run was submitted (monotonic clock, as ``poll``'s ``now``);
        ``wall``: the clock file modification times are on."""
        self.path = Path(run_dir) / ROUNDS_FILE
        self.clock = RoundClock(total)
        self.wall = wall
        self.t_submit, self.wall_submit = t_submit, wall()
        self.started = False
        self.accuracy: float | None = None
        self.first_round_end: float | None = None
        self.at_submit = self._last_round()  # a resumed run's last saved round; None for a new run

    def _last_round(self) -> int | None:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("round"), int):
                return int(record["round"])
        return None

    def poll(self, now: float) -> bool:
        """Read rounds.jsonl; True when a round ended since the last poll. A file not written
        since the submission (a resumed run's old one) is not this run's progress yet."""
        try:
            mtime = self.path.stat().st_mtime
            if mtime < self.wall_submit - 1.0:
                return False
            lines = self.path.read_text().splitlines()
        except OSError:
            return False
        # the file is replaced after each round: its mtime is when the last round ended,
        # however late this look comes (a busy machine, a slow status check in between)
        ended = now - min(max(0.0, self.wall() - mtime), max(0.0, now - self.t_submit))
        last: dict[str, Any] | None = None
        for line in reversed(lines):  # the file is replaced whole, never torn; be lenient anyway
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("round"), int):
                last = record
                break
        if last is None:
            return False
        seen = last["round"]
        if not self.started:
            self.started = True
            first = self.at_submit if self.at_submit is not None else 0
            if seen <= first:  # round 0 of a fresh run, or the last saved round of a resumed one
                self.clock.start(seen, ended)
                return False
            self.clock.start(first, self.t_submit)  # rounds ended before the first look (a fast run)
        before = self.clock.round
        self.clock.observe(seen, ended)
        if self.clock.round == before:
            return False
        if self.first_round_end is None:
            self.first_round_end = ended
        acc = last.get("accuracy")
        self.accuracy = float(acc) if isinstance(acc, (int, float)) else None
        return True


@dataclass
class FinishedRun:
    """What a finished run of this sweep measured."""

    method: str
    rounds: int  # rounds run in this sweep
    per_round: float | None
    seconds: float  # submission to the run being reported finished
    tail: float  # last round's end to the run being reported finished

    @property
    def overhead(self) -> float:
        return self.seconds - self.rounds * (self.per_round or 0.0)


class SweepClock:
    """Time left of the run in progress and of the whole sweep. ``planned``: (method, rounds)
    of every run this sweep will run, in order."""

    def __init__(self, planned: list[tuple[str, int]]) -> None:
        self.planned = planned
        self.finished: list[FinishedRun] = []

    def finish(self, watch: RunWatch, method: str, now: float) -> FinishedRun:
        clock = watch.clock
        rounds = 0 if clock.round is None or clock.origin is None else clock.round - clock.origin[0]
        tail = now - clock.last[1] if clock.last is not None else 0.0
        run = FinishedRun(method, rounds, clock.per_round(), now - watch.t_submit, tail)
        self.finished.append(run)
        return run

    def rate(self, method: str, current: RunWatch | None = None) -> float | None:
        same = [r.per_round for r in self.finished if r.method == method and r.per_round is not None]
        every = [r.per_round for r in self.finished if r.per_round is not None]
        return _first(_mean(same), _mean(every), current.clock.per_round() if current is not None else None)

    def overhead(self, current: RunWatch | None = None) -> float | None:
        """Seconds a run takes beyond its rounds (start-up, first-round warm-up, wind-down)."""
        if self.finished:
            return _mean([r.overhead for r in self.finished])
        if current is not None and current.first_round_end is not None and (rate := current.clock.per_round()) is not None:
            return max(0.0, current.first_round_end - current.t_submit - rate)  # start-up only, so far
        return None

    def run_left(self, index: int, watch: RunWatch, now: float) -> float | None:
        """Seconds until run ``index`` (0-based) is reported finished."""
        method, rounds = self.planned[index]
        clock, tail = watch.clock, _mean([r.tail for r in self.finished]) or 0.0
        if clock.first is not None and clock.first == clock.last and (rate := self.rate(method)) is not None:
            # one round seen: its time holds the clients' start-up; the finished runs know better
            return max(0.0, (clock.total - clock.first[0]) * rate - (now - clock.first[1])) + tail
        left = clock.left(now)
        if left is not None:
            return left + tail
        rate, overhead = self.rate(method), self.overhead()
        if rate is None or overhead is None:
            return None
        return max(0.0, overhead + rounds * rate - (now - watch.t_submit))

    def sweep_left(self, index: int, watch: RunWatch, now: float) -> float | None:
        """Seconds until the last run is finished: this run's time left plus the later runs'."""
        total = self.run_left(index, watch, now)
        overhead = self.overhead(watch)
        for method, rounds in self.planned[index + 1:]:
            rate = self.rate(method, watch)
            if total is None or rate is None or overhead is None:
                return None
            total += overhead + rounds * rate
        return total


class ProgressView:
    """Status of a sweep: a live line redrawn in a terminal, or plain lines (at most one per
    ``every`` seconds) through ``log``; :meth:`message` lines are always written."""

    def __init__(
        self, log: Callable[[str], None] = print, *, live: bool = False, every: float = 30.0, stream: TextIO | None = None,
    ) -> None:
        self.log, self.live, self.every = log, live, every
        self.stream = stream or sys.stdout
        self.shown = ""
        self.last_plain = -float("inf")

    @classmethod
    def for_terminal(cls, every: float = 30.0) -> ProgressView:
        """stdout: live when it is a terminal; else plain lines, flushed (a log someone tails)."""
        return cls(lambda text: print(text, flush=True), live=sys.stdout.isatty(), every=every)

    def message(self, text: str) -> None:
        if self.live and self.shown:
            self.stream.write("\r\x1b[K")
        self.log(text)
        if self.live and self.shown:
            self._draw(self.shown)

    def status(self, text: str, *, bar: str = "", force: bool = False) -> None:
        """The current status; ``bar`` is drawn in a terminal only."""
        if self.live:
            if (line := f"{text} {bar}" if bar else text) != self.shown:
                self._draw(line)
        elif force or time.monotonic() - self.last_plain >= self.every:
            self.last_plain = time.monotonic()
            self.log(text)

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size((120, 20)).columns - 1
        self.shown = text
        self.stream.write("\r\x1b[K" + text[:width])
        self.stream.flush()

    def close(self) -> None:
        if self.live and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = ""


def bar(done: int, total: int, width: int = 20) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class SweepProgress:
    """The sweep's side: a run's watch, the estimates, the view and sweep-progress.jsonl."""

    def __init__(self, output_dir: Path, planned: list[tuple[str, str, int]], view: ProgressView) -> None:
        self.names = [name for name, _, _ in planned]
        self.clock = SweepClock([(method, rounds) for _, method, rounds in planned])
        self.view, self.file = view, Path(output_dir) / PROGRESS_FILE
        self.watch: RunWatch | None = None
        self.index = 0

    def _record(self, **fields: Any) -> None:
        with self.file.open("a") as handle:
            handle.write(json.dumps({"t": time.time(), **fields}) + "\n")

    def start(self, index: int, run_dir: Path) -> None:
        self.index, (_, rounds) = index, self.clock.planned[index]
        self.watch = RunWatch(run_dir, rounds, time.monotonic())
        self._record(event="run-start", run=self.names[index], rounds=rounds)

    def poll(self) -> None:
        """Follow the run in progress (called while the sweep waits for it)."""
        watch, now = self.watch, time.monotonic()
        if watch is None:
            return
        new = watch.poll(now)
        run_left = self.clock.run_left(self.index, watch, now)
        sweep_left = self.clock.sweep_left(self.index, watch, now)
        done, total = watch.clock.round or 0, watch.clock.total
        acc = "n/a" if watch.accuracy is None else f"{100 * watch.accuracy:.2f}%"
        head = f"[sweep] ({self.index + 1}/{len(self.names)}) {self.names[self.index]}: round {done}/{total}, "
        if watch.clock.round is None:  # no round of this run has ended yet
            text = head + f"starting, sweep ~{format_duration(sweep_left)} left"
        else:
            text = head + (f"accuracy {acc}, run ~{format_duration(run_left)} left, "
                           f"sweep ~{format_duration(sweep_left)} left")
        if new:
            self._record(event="round", run=self.names[self.index], round=done, rounds=total,
                         accuracy=watch.accuracy, run_left=run_left, sweep_left=sweep_left)
            self.view.status(text, bar=bar(done, total), force=done >= total)
        elif self.view.live:
            self.view.status(text, bar=bar(done, total))  # the countdown moves between rounds

    @contextmanager
    def following(self, every: float = 0.5) -> Iterator[None]:
        """:meth:`poll` every ``every`` seconds in a thread while the sweep waits for the run
        (whose status check, a ``flwr list``, can take seconds on a busy machine)."""
        stop = threading.Event()

        def follow() -> None:
            while not stop.wait(every):
                self.poll()

        thread = threading.Thread(target=follow, name="sweep-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.poll()  # the last rounds, if they ended since the last look

    def finish(self, method: str, status: str) -> FinishedRun | None:
        if self.watch is None:
            return None
        run = self.clock.finish(self.watch, method, time.monotonic())
        self._record(event="run-end", run=self.names[self.index], status=status, seconds=run.seconds,
                     per_round=run.per_round)
        self.watch = None
        return run

    def close(self) -> None:
        self._record(event="sweep-end")
        self.view.close()
