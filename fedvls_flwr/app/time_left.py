"""The time a run has left, from the ends of the rounds seen so far (plain Python).

The estimate is (rounds left) x (seconds per round) minus the time since the last round
ended. Seconds per round is the wall-clock slope between the end of the first round seen
and the last one: the first round carries the clients' start-up (Ray workers, data loading,
model building), so once two rounds have ended it no longer counts; after only one round,
the slope from the start of the rounds to its end stands in (an overestimate by the
start-up, ~17 minutes for a one-minute run: :meth:`RoundClock.steady_left` gives nothing
instead, which is what a run's log shows). Wall clock, not the record's ``seconds``: it
includes checkpointing, evaluation and sampling - all a round costs.
"""

from __future__ import annotations

import time

__all__ = ["RoundClock", "format_duration"]


class RoundClock:
    """Round ends of one run -> seconds per round and time left. ``total``: the run's last round."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.origin: tuple[int, float] | None = None  # (round the run started after, when)
        self.first: tuple[int, float] | None = None  # the first round end seen
        self.last: tuple[int, float] | None = None  # the latest round end seen

    def start(self, after_round: int, t: float | None = None) -> None:
        """The rounds after ``after_round`` (0, or the round a resumed run continues after) begin now."""
        self.origin = (after_round, time.monotonic() if t is None else t)
        self.first = self.last = None

    def observe(self, round_: int, t: float | None = None) -> None:
        """``round_`` ended (a round seen late or twice, e.g. several at once in a file, is fine)."""
        if self.last is not None and round_ <= self.last[0]:
            return
        if self.origin is not None and round_ <= self.origin[0]:
            return
        point = (round_, time.monotonic() if t is None else t)
        self.first = self.first or point
        self.last = point

    @property
    def round(self) -> int | None:
        """The latest round seen to end."""
        return None if self.last is None else self.last[0]

    def per_round(self) -> float | None:
        """Seconds per round, or None before a round has ended."""
        if self.first is not None and self.last is not None and self.last[0] > self.first[0]:
            return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
        if self.origin is not None and self.last is not None and self.last[0] > self.origin[0]:
            return (self.last[1] - self.origin[1]) / (self.last[0] - self.origin[0])
        return None

    def left(self, now: float | None = None) -> float | None:
        """Seconds until the last round ends, or None while unknown."""
        rate = self.per_round()
        if rate is None or self.last is None:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, (self.total - self.last[0]) * rate - (now - self.last[1]))


    def steady_left(self, now: float | None = None) -> float | None:
        """:meth:`left` once two rounds have ended (0 once the last has), else None: the first
        round's time holds the start-up, which the later rounds do not repeat."""
        if self.last is not None and self.last[0] >= self.total:
            return 0.0
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return None
        return self.left(now)


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``4m05s``, ``12s``; ``?`` while unknown."""
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
