"""Finished run folders as records, and how a run's config reads in tables and plots
(no Flower, no torch).

A run folder (see :mod:`fedvls_flwr.app.results`) holds ``rounds.jsonl``, ``summary.json``
and, where the run recorded its partition, ``clients.json``. Runs written by older
versions may lack fields; everything here tolerates missing keys, ``null``/NaN per-class
entries (classes absent from a test set), a single seed and a single method.
Accuracies are stored as fractions in [0, 1] and reported in percent.

Method names, their order and which settings belong to which method come from the
registry (:mod:`fedvls_flwr.config.registry`, the parts' specs).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedvls_flwr.app.results import CLIENTS_FILE, CONFIG_FILE, ROUNDS_FILE, STATE_FILE, SUMMARY_FILE
from fedvls_flwr.config.registry import KINDS, combination_label, method_names, method_settings, owners
from fedvls_flwr.config.settings import ConfigError

# Settings that do not change the experiment (where it ran, how it is named).
IGNORED_KEYS = {
    "seed", "run-name", "output-dir", "data-dir", "download", "device", "torch-threads",
    "eval-batch-size", "round-timeout", "min-nodes-timeout", "min-nodes", "tracking",
}
# Keys whose values read best in descending order (Table 1: beta 0.5 / 0.1 / 0.05).
DESCENDING_KEYS = {"dirichlet-beta"}


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One finished run: its folder, config, summary, per-round records and partition."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    clients: dict[str, Any] | None = None
    rounds_file_found: bool = True

    @property
    def method(self) -> str | None:
        return self.config.get("method")

    @property
    def label(self) -> str:
        return method_label(self.config)

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def scale(self) -> float:
        """100 when accuracies are stored as fractions (the normal case), 1 when in percent."""
        values = [_num(self.summary.get("best_accuracy")), _num(self.summary.get("final_accuracy"))]
        values += [_num(r.get("accuracy")) for r in self.rounds]
        finite = [v for v in values if math.isfinite(v)]
        return 1.0 if finite and max(finite) > 1.0 + 1e-9 else 100.0

    def _trained(self) -> list[dict[str, Any]]:
        return [r for r in self.rounds if _round_of(r) >= 1 and math.isfinite(_num(r.get("accuracy")))]

    @property
    def best_accuracy(self) -> float | None:
        """Best test accuracy over rounds >= 1, in %; from the summary, else from the rounds."""
        value = _num(self.summary.get("best_accuracy"))
        if not math.isfinite(value):
            trained = self._trained()
            if not trained:
                return None
            value = max(_num(r["accuracy"]) for r in trained)
        return value * self.scale

    @property
    def final_accuracy(self) -> float | None:
        """Accuracy of the last evaluated round >= 1, in %; from the summary, else the rounds."""
        value = _num(self.summary.get("final_accuracy"))
        if not math.isfinite(value):
            trained = self._trained()
            if not trained:
                return None
            value = _num(max(trained, key=_round_of)["accuracy"])
        return value * self.scale

    def _last_recorded(self) -> int:
        return max((_round_of(r) for r in self.rounds if _round_of(r) >= 1), default=0)

    def _completed(self) -> int | None:
        """The rounds summary.json says were completed (None when it does not say)."""
        done = self.summary.get("rounds_completed")
        return done if isinstance(done, int) and not isinstance(done, bool) else None

    def incomplete(self) -> str | None:
        """Why the run is not a complete run ("failed in round 3", "stopped after round 7 of
        50"), or None for a run that completed every round it was asked for. summary.json's
        count of completed rounds counts: a rounds.jsonl that lost lines is not a stop."""
        last = max(self._last_recorded(), self._completed() or 0)
        asked = self.config.get("num-server-rounds")
        if self.summary.get("status") == "failed":
            return f"failed in round {last + 1}"
        if isinstance(asked, int) and last < asked:
            return f"stopped after round {last} of {asked}"
        return None

    def rounds_lost(self) -> str | None:
        """What rounds.jsonl lacks of the rounds summary.json says were completed, or None."""
        done, last = self._completed(), self._last_recorded()
        if done is None or last >= done:
            return None
        what = (f"{ROUNDS_FILE} is missing" if not self.rounds_file_found else
                f"{ROUNDS_FILE} ends with round {last}" if last else f"{ROUNDS_FILE} holds no trained round")
        lacking = f"round {done}" if last + 1 == done else f"rounds {last + 1}-{done}"
        return (f"{what}, but summary.json says all {done} rounds were completed (a partial copy of the "
                "folder?): tabulated from summary.json's best and final accuracy; the accuracy curve and the "
                f"per-round tables lack {lacking}. Restore {ROUNDS_FILE} from a copy of the run folder to have them")

    def dropped_share(self) -> float:
        """Mean over rounds of the share of client updates that were not used (the client
        failed, sent nothing, or its reply was rejected, e.g. non-finite weights)."""
        shares = []
        for r in self.rounds:
            dropped = _num(r.get("clients_failed", 0)) + _num(r.get("clients_rejected", 0))
            used = _num(r.get("clients_accepted"))
            if _round_of(r) >= 1 and math.isfinite(used) and math.isfinite(dropped) and used + dropped > 0:
                shares.append(dropped / (used + dropped))
        return float(np.mean(shares)) if shares else 0.0

    def accuracy_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, accuracy in %) over all evaluated rounds, round 0 included, sorted."""
        by_round: dict[int, float] = {}
        for r in self.rounds:  # a repeated round number (resumed run): the last one wins
            acc = _num(r.get("accuracy"))
            if math.isfinite(acc) and _round_of(r) >= 0:
                by_round[_round_of(r)] = acc * self.scale
        xs = np.array(sorted(by_round), dtype=int)
        return xs, np.array([by_round[x] for x in xs], dtype=float)

    def final_per_class(self) -> np.ndarray | None:
        """Per-class accuracy (%) of the last round that recorded it; NaN where undefined."""
        for r in sorted(self.rounds, key=_round_of, reverse=True):
            values = r.get("per_class_accuracy")
            if isinstance(values, (list, tuple)) and len(values) > 0:
                return np.array([_num(v) for v in values], dtype=float) * self.scale
        return None


def _num(value: Any) -> float:
    """A float, or NaN for None / non-numbers / booleans."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _round_of(record: dict[str, Any]) -> int:
    try:
        return int(record["round"])
    except (KeyError, TypeError, ValueError):
        return -1


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder. Raises FileNotFoundError when it has no summary.json."""
    run_dir = Path(run_dir)
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no {SUMMARY_FILE} (run incomplete or not a run folder)")
    summary = _read_json(summary_path)
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: expected a JSON object")
    saved_config = summary.get("config")
    config: dict[str, Any] = dict(saved_config) if isinstance(saved_config, dict) else {}
    rounds: list[dict[str, Any]] = []
    rounds_path = run_dir / ROUNDS_FILE
    rounds_file_found = rounds_path.is_file()
    if rounds_file_found:
        for line in rounds_path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line of an old non-atomic writer
            if isinstance(record, dict):
                rounds.append(record)
    clients = None
    clients_path = run_dir / CLIENTS_FILE
    if clients_path.is_file():
        try:
            loaded = _read_json(clients_path)
            clients = loaded if isinstance(loaded, dict) else None
        except json.JSONDecodeError:
            clients = None
    if config.get("train-pool-size") == 0 and isinstance(summary.get("num_train_pool"), int) \
            and config.get("dataset") != "synthetic":
        # 0 = the whole pool: say how large it was (a generated federation's size is drawn with
        # its seed, so its seeds would read as runs of different pool sizes)
        config["train-pool-size"] = summary["num_train_pool"]
    return RunRecord(path=run_dir, config=config, summary=summary, rounds=rounds, clients=clients,
                     rounds_file_found=rounds_file_found)


class NoRunsError(ValueError):
    """Nothing to report on: the message says what was found instead and what to do."""


#: Files a run folder gets before its summary.json (written when the run ends).
_RUN_FILES = (CONFIG_FILE, ROUNDS_FILE, STATE_FILE)


def find_runs(root_or_dirs: str | Path | Iterable[str | Path]) -> tuple[list[RunRecord], list[str]]:
    """Every folder holding a summary.json under the given root(s), recursively, sorted, and
    the run folders left out, each with why: no summary.json yet (a run still going, or one
    killed before it wrote it) or one that cannot be read. A root that does not exist raises
    :class:`NoRunsError`."""
    roots = [root_or_dirs] if isinstance(root_or_dirs, (str, Path)) else list(root_or_dirs)
    found: dict[Path, None] = {}
    unfinished: dict[Path, None] = {}
    for root in map(Path, roots):
        if not root.exists():
            raise NoRunsError(f"{root} does not exist: give a run folder, or a folder holding run folders "
                              "(the runs' output-dir)")
        candidates = [root, *sorted(p for p in root.rglob("*") if p.is_dir())] if root.is_dir() else [root]
        for folder in candidates:
            if (folder / SUMMARY_FILE).is_file():
                found[folder.resolve()] = None
            elif any((folder / name).is_file() for name in _RUN_FILES):
                unfinished[folder.resolve()] = None
    runs, left_out = [], []
    for run_dir in sorted(found):
        try:
            runs.append(load_run(run_dir))
        except (OSError, ValueError) as exc:
            left_out.append(f"{run_dir}: {SUMMARY_FILE} cannot be read ({exc})")
    left_out += [f"{d}: no {SUMMARY_FILE} - a run still going, or one stopped before it ended (continue it with "
                 "resume=true and its run-name)" for d in sorted(unfinished)]
    return runs, left_out


def load_runs(root_or_dirs: str | Path | Iterable[str | Path]) -> list[RunRecord]:
    """Every folder holding a summary.json under the given root(s), recursively, sorted.

    Folders without summary.json (runs still going or crashed) are skipped; so is a
    summary.json that cannot be read (with a warning).
    """
    runs, left_out = find_runs(root_or_dirs)
    for why in left_out:
        if SUMMARY_FILE + " cannot be read" in why:
            warnings.warn(f"skipping {why}", stacklevel=2)
    return runs


# ---------------------------------------------------------------------------------------
# labels and config values
# ---------------------------------------------------------------------------------------
def _typed(config: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """Config values of ``keys`` coerced to their declared types (old runs may hold "false")."""
    declared = {s.key: s for s in method_settings()}
    out = {}
    for key in keys:
        if key in config:
            try:
                out[key] = declared[key].coerce(config[key]) if key in declared else config[key]
            except ConfigError:
                out[key] = config[key]
    return out


def method_label(config: dict[str, Any]) -> str:
    """Human-readable name of the run's parts, with the variant each ran as.

    The registry's labels, naming the local optimizer and server optimizer only where
    they differ from plain SGD and FedAvg, plus the label of every setting whose value has
    one: ``fedvls`` with ``use-dis = false`` -> "FedVLS −L_dis"; both terms off -> "FedVLS
    −L_dis −L_logit" (calibrated CE alone, Table 5's first row); FedLC with ``fedlc-form =
    paper`` -> "FedLC (paper form)"; FedVLS with FedSAM steps and FedExP -> "FedVLS + FedSAM
    + FedExP"; a teacher in train mode or carried momentum is marked too.
    """
    method = config.get("method")
    if method is None:
        return "unknown method"
    if method not in method_names():
        return str(method)
    try:
        label = combination_label(_typed(config, config.keys()))
    except ValueError:  # an unknown optimizer name (a run of another version)
        return str(method)
    if _typed(config, ["optimizer-state"]).get("optimizer-state") == "carry":
        label += " (momentum carried)"
    return label


def _method_sort_key(config: dict[str, Any]) -> tuple:
    """Registry order of each part (method, local optimizer, server optimizer), then its variants."""
    typed = _typed(config, config.keys())
    key: list[Any] = []
    for kind, (parts, default) in KINDS.items():
        names = [p.name for p in parts]
        name = str(typed.get(kind, default))
        if name not in names:
            return (len(method_names()), str(config.get("method")))
        key += [names.index(name), *parts[names.index(name)].variant_flags(typed)]
    return (*key, typed.get("optimizer-state") == "carry")


def config_value(config: dict[str, Any], key: str) -> Any:
    """The value of a config key for grouping; ``method`` gives the variant label.

    A method's own setting (``fedlc-tau``) reads as None for runs of other methods.
    Partition parameters that do not apply (``dirichlet-beta`` of a shards run,
    ``shards-per-client`` of a Dirichlet run, both of a ``synthetic`` run, whose partition
    reads ``natural``; ``synthetic-*`` of any other dataset) read as None, so such runs
    are not split or mislabelled by an unused default.
    """
    if key in ("method", "label"):
        return method_label(config)
    if (readers := owners(key)) and not any(
        str(config.get(kind, KINDS[kind][1])) == name for kind, name in readers
    ):
        return None  # another part's setting: not a property of this run
    synthetic = config.get("dataset") == "synthetic"
    if key.startswith("synthetic-") and not synthetic:
        return None
    # Synthetic's clients are the generator's own (a natural split): no partitioner runs
    partition = "natural" if synthetic else config.get("partition")
    if key == "partition":
        return partition
    if key == "dirichlet-beta" and partition is not None and partition != "dirichlet":
        return None
    if key == "shards-per-client" and partition is not None and partition not in ("shards", "noniid-labeldir"):
        return None
    return config.get(key)


def _value_sort_key(key: str, value: Any, config: dict[str, Any]) -> tuple:
    if key in ("method", "label"):
        return (0, _method_sort_key(config))
    if value is None:
        return (2, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, -value if key in DESCENDING_KEYS else value)
    return (1, str(value))


def _fmt_value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _slug(text: str) -> str:
    text = text.replace("−", "no-").replace("β", "beta")
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "all"

