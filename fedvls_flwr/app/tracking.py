"""Experiment tracking: every round's rounds.jsonl record, also as TensorBoard scalars.

One place turns a round's record into metrics (:func:`record_metrics`: the record flattened
into name -> number, a name being the record's key path joined by ``/``); a backend only
writes those numbers at step = round. The server writes them right after it appended the
same record to rounds.jsonl, so the event files hold what rounds.jsonl holds.

``tracking = "tensorboard"`` writes event files into the run folder itself (so
``tensorboard --logdir <sweep output>`` lists a sweep's runs by their folder names), with
the run config as text at step 0. ``torch.utils.tensorboard`` writes them: torch is already
a dependency and the ``tensorboard`` package it needs is the viewer anyway, so the extra
adds nothing a user would not install (tensorboardX would be one more writer package).

Resume: the event files are rewritten from rounds.jsonl's rounds 0..k (the ones the
checkpoint covers) into a new file, then the older files are deleted - a round that was
logged after the last checkpoint and is run again appears once, not twice, for any reader.
The new file starts with ``purge_step = 0`` so that a TensorBoard open during the resume
drops what it had loaded from the deleted files.

A tracker that fails mid-run (a full disk) logs a warning and stops tracking; the run goes on
(rounds.jsonl is the record; ``resume = true`` rewrites the event files from it).
Torch is imported only when a tracker is opened.
"""

from __future__ import annotations

import importlib.util
import json
import math
import uuid
from collections.abc import Iterable
from logging import WARNING
from pathlib import Path
from typing import Any, Protocol

from fedvls_flwr.config.run_config import ConfigError, RunConfig

__all__ = [
    "EVENT_FILES", "SKIPPED_KEYS", "TRACKERS", "TensorBoardTracker", "Tracker", "check_tracking", "config_text",
    "open_tracker", "record_metrics",
]

#: tracking value -> (the module it needs, the pip extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard")}
#: rounds.jsonl keys that are not measurements: the step itself, labels, ids, messages.
SKIPPED_KEYS = frozenset({"round", "evaluation", "sampled_partitions", "failures"})
#: The names TensorBoard's writers give event files.
EVENT_FILES = "events.out.tfevents.*"


def check_tracking(cfg: RunConfig) -> None:
    """A tracker whose package is not installed: a ConfigError now, not in round 1."""
    if cfg.tracking == "none":
        return
    module, extra = TRACKERS[cfg.tracking]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"run config 'tracking' = {cfg.tracking!r} needs the Python package '{module}', which is not "
            f"installed where the ServerApp runs: pip install \"fedvls-flwr[{extra}]\" (or pip install {module}), "
            "or set tracking='none'"
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), item, out)
    elif isinstance(value, (list, tuple)):
        if not all(v is None or _number(v) is not None for v in value):
            return  # a list of non-numbers (ids, messages) is not a measurement
        width = len(str(len(value) - 1))
        for i, item in enumerate(value):
            if (number := _number(item)) is not None:
                out[f"{prefix}/{i:0{width}d}"] = number
    elif (number := _number(value)) is not None:
        out[prefix] = number


def record_metrics(record: dict[str, Any]) -> dict[str, float]:
    """A rounds.jsonl record as name -> number: nested keys joined by ``/`` (``train/train-loss``,
    ``local_update/head/local``), a list of numbers by zero-padded index (``per_class_accuracy/03``);
    ``null``/NaN entries (e.g. a class absent from the test set), booleans, strings and
    :data:`SKIPPED_KEYS` are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key not in SKIPPED_KEYS:
            _flatten(str(key), value, out)
    return out


def config_text(config: dict[str, Any]) -> str:
    """The run config as a Markdown table (TensorBoard's text dashboard renders it)."""
    rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in config.items())
    return f"| setting | value |\n|---|---|\n{rows}"


class Tracker(Protocol):
    def log_round(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files in ``run_dir``: ``replay`` (the rounds already in rounds.jsonl) first, then
    one :meth:`log_round` per round; older event files there are deleted once replayed."""

    def __init__(self, run_dir: Path, config: dict[str, Any], replay: Iterable[dict[str, Any]] = ()) -> None:
        from torch.utils.tensorboard import SummaryWriter

        run_dir = Path(run_dir)
        older = sorted(run_dir.glob(EVENT_FILES))
        # a suffix of its own: the new file can never be mistaken for one of the older ones
        self.writer = SummaryWriter(
            log_dir=str(run_dir), purge_step=0 if older else None, filename_suffix=f".{uuid.uuid4().hex[:8]}",
        )
        self.writer.add_text("config", config_text(config), global_step=0)
        for record in replay:
            self._add(record)
        self.writer.flush()
        for path in older:
            path.unlink(missing_ok=True)

    def _add(self, record: dict[str, Any]) -> None:
        """One event per round holding every number (as ``add_scalar`` writes each: a
        ``simple_value``): one message through the writer's queue, not one per number."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=value) for name, value in record_metrics(record).items()]
        file_writer: Any = self.writer.file_writer  # set by SummaryWriter.__init__ (typed None there)
        file_writer.add_summary(Summary(value=values), global_step=int(record["round"]))

    def log_round(self, record: dict[str, Any]) -> None:
        """Write the round and flush, so a running TensorBoard shows it now."""
        self._add(record)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Guarded:
    """A tracker whose failure is a warning, not the end of the run."""

    def __init__(self, name: str, tracker: Tracker) -> None:
        self.name, self.tracker = name, tracker
        self.failed = False

    def _failed(self, err: Exception) -> None:
        from flwr.common.logger import log

        self.failed = True
        log(WARNING, "tracking '%s' stopped (%s: %s); rounds.jsonl goes on. Resume the run "
            "(resume=true) to rewrite the event files from it", self.name, type(err).__name__, err)

    def log_round(self, record: dict[str, Any]) -> None:
        if not self.failed:
            try:
                self.tracker.log_round(record)
            except Exception as err:  # any writer error: the run matters more than its events
                self._failed(err)

    def close(self) -> None:
        try:
            self.tracker.close()
        except Exception as err:
            if not self.failed:
                self._failed(err)


def open_tracker(cfg: RunConfig, run_dir: Path, replay: list[dict[str, Any]]) -> Tracker | None:
    """The run's tracker (None for ``tracking = "none"``), holding ``replay`` already."""
    check_tracking(cfg)
    if cfg.tracking == "tensorboard":
        return _Guarded(cfg.tracking, TensorBoardTracker(run_dir, cfg.to_flower(), replay))
    return None
