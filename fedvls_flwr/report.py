"""Tables and figures from finished run folders (no Flower, no torch).

A run folder (see :mod:`fedvls_flwr.results`) holds ``rounds.jsonl``, ``summary.json``
and, where the run recorded its partition, ``clients.json``. This module reads any
number of them and writes:

* a results table (Markdown + CSV): mean ± sample std over seeds of the best-over-rounds
  and of the final-round top-1 accuracy, one cell per (rows x cols) config combination;
* accuracy-per-round curves (mean over seeds, band = min..max over seeds);
* the partition heatmap (clients x classes, vacant cells marked), like the FedVLS
  paper's appendix Figure 7;
* final-round per-class accuracy of the global model per method;
* a diagnostics table: drift diversity and (runs with ``local-eval``) the local-update
  view, averaged over the last rounds.

Accuracies are stored as fractions in [0, 1] and reported in percent. Runs written by
older versions may lack fields; everything here tolerates missing keys, ``null``/NaN
per-class entries (classes absent from a test set), a single seed and a single method.

Command line: ``python -m fedvls_flwr.report RUNS_ROOT [--out DIR]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

SUMMARY_FILE = "summary.json"
ROUNDS_FILE = "rounds.jsonl"
CLIENTS_FILE = "clients.json"

METHOD_ORDER = ("fedavg", "fedlc", "fedntd", "fedvls", "fedvls-paper")
METHOD_NAMES = {
    "fedavg": "FedAvg",
    "fedlc": "FedLC",
    "fedntd": "FedNTD",
    "fedvls": "FedVLS",
    "fedvls-paper": "FedVLS (paper form)",
}
# Settings that only matter to some methods: a difference in them between runs of another
# method is not a real difference (see _mixed_settings).
METHOD_KEYS = {
    "fedlc": {"fedlc-tau", "fedlc-form"},
    "fedntd": {"fedntd-beta", "fedntd-tau", "teacher-mode"},
    "fedvls": {"lambda-dis", "logit-weight", "use-dis", "use-logit", "teacher-mode"},
    "fedvls-paper": {"lambda-dis", "paper-logit-weight", "use-dis", "use-logit", "teacher-mode"},
}
_ALL_METHOD_KEYS = set().union(*METHOD_KEYS.values())
# Settings that do not change the experiment (where it ran, how it is named).
IGNORED_KEYS = {
    "seed", "run-name", "output-dir", "data-dir", "download", "device", "torch-threads",
    "eval-batch-size", "round-timeout", "min-nodes",
}
# Keys whose values read best in descending order (Table 1: beta 0.5 / 0.1 / 0.05).
DESCENDING_KEYS = {"dirichlet-beta"}

BAND_NOTE = "line: mean over seeds; band: min–max over seeds"

_BASE_COLOURS = {
    "FedAvg": "#1f77b4",
    "FedLC": "#ff7f0e",
    "FedNTD": "#2ca02c",
    "FedVLS": "#d62728",
    "FedVLS (paper form)": "#9467bd",
}
_EXTRA_COLOURS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939")


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
    value = record.get("round")
    try:
        return int(value)
    except (TypeError, ValueError):
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
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    rounds: list[dict[str, Any]] = []
    rounds_path = run_dir / ROUNDS_FILE
    if rounds_path.is_file():
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
    return RunRecord(path=run_dir, config=dict(config), summary=summary, rounds=rounds, clients=clients)


def load_runs(root_or_dirs: str | Path | Iterable[str | Path]) -> list[RunRecord]:
    """Every folder holding a summary.json under the given root(s), recursively, sorted.

    Folders without summary.json (runs still going or crashed) are skipped; so is a
    summary.json that cannot be read (with a warning).
    """
    roots = [root_or_dirs] if isinstance(root_or_dirs, (str, Path)) else list(root_or_dirs)
    found: dict[Path, None] = {}
    for root in roots:
        root = Path(root)
        if (root / SUMMARY_FILE).is_file():
            found[root.resolve()] = None
        if root.is_dir():
            for summary_path in sorted(root.rglob(SUMMARY_FILE)):
                if summary_path.is_file():
                    found[summary_path.parent.resolve()] = None
    runs = []
    for run_dir in sorted(found):
        try:
            runs.append(load_run(run_dir))
        except (OSError, ValueError) as exc:
            warnings.warn(f"skipping {run_dir}: {exc}", stacklevel=2)
    return runs


# ---------------------------------------------------------------------------------------
# labels and config values
# ---------------------------------------------------------------------------------------
def _flag(config: dict[str, Any], key: str, default: bool = True) -> bool:
    value = config.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off")
    return bool(value) if value is not None else default


def method_label(config: dict[str, Any]) -> str:
    """Human-readable method name, with the ablation / variant it ran as.

    ``fedvls`` with ``use-dis = false`` -> "FedVLS −L_dis"; both terms off ->
    "FedVLS −L_dis −L_logit" (calibrated CE alone, Table 5's first row); FedLC with
    ``fedlc-form = paper`` -> "FedLC (paper form)"; a teacher in train mode is marked too.
    """
    method = config.get("method")
    if method is None:
        return "unknown method"
    name = METHOD_NAMES.get(str(method), str(method))
    parts = [name]
    if method in ("fedvls", "fedvls-paper"):
        if not _flag(config, "use-dis"):
            parts.append("−L_dis")
        if not _flag(config, "use-logit"):
            parts.append("−L_logit")
    if method == "fedlc" and str(config.get("fedlc-form", "standard")) == "paper":
        parts.append("(paper form)")
    if method in ("fedntd", "fedvls", "fedvls-paper") and str(config.get("teacher-mode", "eval")) == "train":
        parts.append("(teacher train)")
    return " ".join(parts)


def _method_sort_key(config: dict[str, Any]) -> tuple:
    method = str(config.get("method"))
    index = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    return (
        index,
        method,
        not _flag(config, "use-dis"),
        not _flag(config, "use-logit"),
        str(config.get("fedlc-form", "standard")) == "paper",
        str(config.get("teacher-mode", "eval")) == "train",
    )


def config_value(config: dict[str, Any], key: str) -> Any:
    """The value of a config key for grouping; ``method`` gives the variant label.

    Partition parameters that do not apply (``dirichlet-beta`` of a shards run,
    ``shards-per-client`` of a Dirichlet run, both of a ``synthetic`` run, whose partition
    reads ``natural``; ``synthetic-*`` of any other dataset) read as None, so such runs
    are not split or mislabelled by an unused default.
    """
    if key in ("method", "label"):
        return method_label(config)
    synthetic = config.get("dataset") == "synthetic"
    if key.startswith("synthetic-") and not synthetic:
        return None
    # Synthetic's clients are the generator's own (a natural split): no partitioner runs
    partition = "natural" if synthetic else config.get("partition")
    if key == "partition":
        return partition
    if key == "dirichlet-beta" and partition is not None and partition != "dirichlet":
        return None
    if key == "shards-per-client" and partition is not None and partition != "shards":
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


# ---------------------------------------------------------------------------------------
# table
# ---------------------------------------------------------------------------------------
@dataclass
class Cell:
    row: tuple
    col: tuple
    seeds: list[Any]
    best_values: list[float]
    final_values: list[float]
    run_paths: list[Path]

    @property
    def n(self) -> int:
        return len(self.best_values)

    @staticmethod
    def _mean(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return float(np.mean(finite)) if finite else math.nan

    @staticmethod
    def _std(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return math.nan
        return float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0

    @property
    def best_mean(self) -> float:
        return self._mean(self.best_values)

    @property
    def best_std(self) -> float:
        return self._std(self.best_values)

    @property
    def final_mean(self) -> float:
        return self._mean(self.final_values)

    @property
    def final_std(self) -> float:
        return self._std(self.final_values)


@dataclass
class ReportTable:
    """Cells keyed by (row values, col values); rows/cols in display order."""

    row_keys: tuple[str, ...]
    col_keys: tuple[str, ...]
    row_values: list[tuple]
    col_values: list[tuple]
    cells: dict[tuple[tuple, tuple], Cell]
    notes: list[str] = field(default_factory=list)

    def cell(self, row: Sequence[Any], col: Sequence[Any]) -> Cell | None:
        return self.cells.get((tuple(row), tuple(col)))

    def seeds_per_cell(self) -> list[int]:
        return sorted({c.n for c in self.cells.values()})


def _mixed_settings(runs: list[RunRecord], skip: set[str]) -> list[str]:
    """Config keys whose values differ among these runs (that matter to their method)."""
    keys = set().union(*(r.config.keys() for r in runs)) - IGNORED_KEYS - skip
    methods = {r.method for r in runs}
    relevant = set().union(*(METHOD_KEYS.get(m, set()) for m in methods)) if methods else set()
    mixed = []
    for key in sorted(keys):
        if key in _ALL_METHOD_KEYS and key not in relevant:
            continue
        values = {json.dumps(config_value(r.config, key), sort_keys=True, default=str) for r in runs}
        if len(values) > 1:
            mixed.append(key)
    return mixed


def table(
    runs: Sequence[RunRecord],
    rows: Sequence[str] = ("dataset", "partition", "dirichlet-beta"),
    cols: Sequence[str] = ("method",),
) -> ReportTable:
    """Group runs by config values of ``rows`` x ``cols``; per cell mean/std over seeds.

    ``method`` groups by the variant label (see :func:`method_label`), so ablations stay
    apart. Std is the sample std (ddof = 1), 0 for a single seed. Runs without any
    accuracy are left out (named in ``notes``); so are notes on cells whose runs differ in
    other settings or repeat a seed.
    """
    rows, cols = tuple(rows), tuple(cols)
    row_sort: dict[tuple, tuple] = {}
    col_sort: dict[tuple, tuple] = {}
    cells: dict[tuple[tuple, tuple], Cell] = {}
    members: dict[tuple[tuple, tuple], list[RunRecord]] = {}
    notes: list[str] = []
    for run in runs:
        best = run.best_accuracy
        if best is None:
            notes.append(f"left out (no accuracy recorded): {run.path}")
            continue
        final = run.final_accuracy
        row = tuple(config_value(run.config, k) for k in rows)
        col = tuple(config_value(run.config, k) for k in cols)
        row_sort.setdefault(row, tuple(_value_sort_key(k, v, run.config) for k, v in zip(rows, row)))
        col_sort.setdefault(col, tuple(_value_sort_key(k, v, run.config) for k, v in zip(cols, col)))
        cell = cells.setdefault((row, col), Cell(row, col, [], [], [], []))
        cell.seeds.append(run.seed)
        cell.best_values.append(best)
        cell.final_values.append(final if final is not None else math.nan)
        cell.run_paths.append(run.path)
        members.setdefault((row, col), []).append(run)
    for (row, col), cell in cells.items():
        where = ", ".join(_fmt_value(v) for v in row + col)
        repeated = [s for s, k in Counter(map(str, cell.seeds)).items() if k > 1]
        if repeated:
            notes.append(f"[{where}] seed repeated: {', '.join(repeated)}")
        mixed = _mixed_settings(members[(row, col)], set(rows) | set(cols))
        if mixed:
            notes.append(f"[{where}] runs differ in: {', '.join(mixed)}")
    return ReportTable(
        row_keys=rows,
        col_keys=cols,
        row_values=sorted(row_sort, key=row_sort.__getitem__),
        col_values=sorted(col_sort, key=col_sort.__getitem__),
        cells=cells,
        notes=notes,
    )


def format_cell(cell: Cell | None, show_n: bool = False) -> str:
    """"best ± std (final ± std)" in %; no ± for a single seed; "–" for no runs."""
    if cell is None or cell.n == 0:
        return "–"

    def part(mean: float, std: float) -> str:
        if not math.isfinite(mean):
            return "n/a"
        return f"{mean:.2f}" if cell.n == 1 else f"{mean:.2f} ± {std:.2f}"

    text = f"{part(cell.best_mean, cell.best_std)} ({part(cell.final_mean, cell.final_std)})"
    return f"{text} [n={cell.n}]" if show_n else text


def markdown_table(report_table: ReportTable) -> str:
    t = report_table
    counts = t.seeds_per_cell()
    uniform = len(counts) <= 1
    if not counts:
        seeds_text = "no runs"
    elif uniform:
        seeds_text = f"{counts[0]} seed{'s' if counts[0] != 1 else ''} per cell"
    else:
        seeds_text = "seeds per cell differ, given as [n=...] in each cell"
    lines = [
        "Top-1 test accuracy (%) of the global model: **best over rounds (final round)**, "
        f"mean ± sample std over seeds; {seeds_text}. A single seed shows no ±.",
        "",
    ]
    col_names = [", ".join(_fmt_value(v) for v in col) for col in t.col_values]
    header = list(t.row_keys) + col_names
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for row in t.row_values:
        cells = [format_cell(t.cell(row, col), show_n=not uniform) for col in t.col_values]
        lines.append("| " + " | ".join([_fmt_value(v) for v in row] + cells) + " |")
    if t.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in t.notes]
    return "\n".join(lines) + "\n"


def _csv_float(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else ""


def write_table(report_table: ReportTable, out_dir: str | Path, name: str = "results") -> tuple[Path, Path]:
    """Write ``<name>.md`` and ``<name>.csv`` (one row per cell) into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / f"{name}.md"
    csv_path = out_dir / f"{name}.csv"
    md_path.write_text(markdown_table(report_table))
    t = report_table
    header = list(t.row_keys) + list(t.col_keys) + [
        "n", "best_mean", "best_std", "final_mean", "final_std",
        "seeds", "best_per_seed", "final_per_seed",
    ]
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in t.row_values:
            for col in t.col_values:
                cell = t.cell(row, col)
                if cell is None:
                    continue
                writer.writerow(
                    ["" if v is None else v for v in row + col]
                    + [
                        cell.n,
                        _csv_float(cell.best_mean), _csv_float(cell.best_std),
                        _csv_float(cell.final_mean), _csv_float(cell.final_std),
                        ";".join("" if s is None else str(s) for s in cell.seeds),
                        ";".join(_csv_float(v) for v in cell.best_values),
                        ";".join(_csv_float(v) for v in cell.final_values),
                    ]
                )
    return md_path, csv_path


# ---------------------------------------------------------------------------------------
# diagnostics table (drift diversity, the local-update view)
# ---------------------------------------------------------------------------------------
#: The diagnostics are averaged over the last rounds of a run (a late, well-trained global
#: model, as in the paper's appendix Table 12), then over seeds.
LAST_ROUNDS = 10
LOCAL_GROUPS = ("vacant", "minority", "majority")


def _late_mean(run: RunRecord, value) -> float:
    """Mean of ``value(round record)`` over the last LAST_ROUNDS trained rounds (NaN-free)."""
    late = sorted((r for r in run.rounds if _round_of(r) >= 1), key=_round_of)[-LAST_ROUNDS:]
    values = [v for v in (_num(value(r)) for r in late) if math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def diagnostics_rows(report_table: ReportTable, runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """Per table cell: drift diversity and, where recorded, the local-update view (%)."""
    by_path = {r.path: r for r in runs}
    out = []
    for row in report_table.row_values:
        for col in report_table.col_values:
            cell = report_table.cell(row, col)
            if cell is None:
                continue
            members = [by_path[p] for p in cell.run_paths]
            entry: dict[str, Any] = {"row": row, "col": col, "n": len(members)}
            entry["drift_diversity"] = [_late_mean(r, lambda x: x.get("drift_diversity")) for r in members]
            for group in LOCAL_GROUPS:
                for side in ("local", "global"):
                    entry[f"{group}_{side}"] = [
                        100.0 * _late_mean(r, lambda x: (x.get("local_update") or {}).get(group, {}).get(side))
                        for r in members
                    ]
            out.append(entry)
    return out


def write_diagnostics(report_table: ReportTable, runs: Sequence[RunRecord], out_dir: str | Path) -> tuple[Path, Path] | None:
    """``diagnostics.md``/``.csv`` when the runs recorded drift diversity; None otherwise."""
    rows = diagnostics_rows(report_table, runs)
    has = lambda key: any(math.isfinite(v) for e in rows for v in e[key])  # noqa: E731
    if not rows or not has("drift_diversity"):
        return None
    keys = ["drift_diversity"] + [f"{g}_{s}" for g in LOCAL_GROUPS for s in ("local", "global") if has(f"{g}_local")]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def stat(values: list[float]) -> tuple[float, float]:
        return Cell._mean(values), Cell._std(values)

    names = {"drift_diversity": "drift diversity"}
    names.update({f"{g}_{s}": f"{g}: {s} model (%)" for g in LOCAL_GROUPS for s in ("local", "global")})
    lines = [
        f"Diagnostics, mean over the last {LAST_ROUNDS} rounds of each run, then mean ± sample std over seeds. "
        "Drift diversity: sum_i ||m_i||^2 / ||sum_i m_i||^2, m_i = w_i - w_global. Local-update view "
        "(runs with local-eval): accuracy on each client's vacant / minority / majority classes of the "
        "client's model right after its local training (local) and of the global model it started from "
        "(global), averaged over clients.",
        "",
        "| " + " | ".join(list(report_table.row_keys) + list(report_table.col_keys) + ["n"] + [names[k] for k in keys]) + " |",
        "|" + "|".join(" --- " for _ in range(len(report_table.row_keys) + len(report_table.col_keys) + 1 + len(keys))) + "|",
    ]
    csv_path = out_dir / "diagnostics.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(report_table.row_keys) + list(report_table.col_keys) + ["n"]
                        + [f"{k}_{m}" for k in keys for m in ("mean", "std")])
        for e in rows:
            stats = [stat(e[k]) for k in keys]
            cells = ["n/a" if not math.isfinite(m) else f"{m:.2f}" if e["n"] == 1 else f"{m:.2f} ± {d:.2f}"
                     for m, d in stats]
            lines.append("| " + " | ".join([_fmt_value(v) for v in e["row"] + e["col"]] + [str(e["n"])] + cells) + " |")
            writer.writerow(["" if v is None else v for v in e["row"] + e["col"]] + [e["n"]]
                            + [_csv_float(x) for m, d in stats for x in (m, d)])
    md_path = out_dir / "diagnostics.md"
    md_path.write_text("\n".join(lines) + "\n")
    return md_path, csv_path


# ---------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------
def _figure(width: float, height: float):
    # A bare Figure renders with Agg on savefig and never touches pyplot's global state.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig, out_path: str | Path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png")
    return out_path


def _group_keys(group_by: str | Sequence[str]) -> tuple[str, ...]:
    return (group_by,) if isinstance(group_by, str) else tuple(group_by)


def _groups(runs: Sequence[RunRecord], group_by: str | Sequence[str]) -> list[tuple[str, list[RunRecord]]]:
    """(label, runs) per distinct value of the group keys, in method/natural order."""
    keys = _group_keys(group_by)
    groups: dict[tuple, list[RunRecord]] = {}
    sort: dict[tuple, tuple] = {}
    for run in runs:
        value = tuple(config_value(run.config, k) for k in keys)
        groups.setdefault(value, []).append(run)
        sort.setdefault(value, tuple(_value_sort_key(k, v, run.config) for k, v in zip(keys, value)))
    ordered = sorted(groups, key=sort.__getitem__)
    return [(", ".join(_fmt_value(v) for v in value), groups[value]) for value in ordered]


def _colours(labels: Sequence[str]) -> dict[str, str]:
    colours, extra = {}, iter(_EXTRA_COLOURS * 4)
    for label in labels:
        colours[label] = _BASE_COLOURS.get(label) or next(extra, "#000000")
    return colours


def _common_title(runs: Sequence[RunRecord]) -> str:
    """"dataset · partition β=… · N rounds" from the values all runs share."""
    def shared(key: str) -> Any:
        values = {json.dumps(config_value(r.config, key), default=str) for r in runs}
        return config_value(runs[0].config, key) if len(values) == 1 else None

    parts = []
    if shared("dataset") is not None:
        parts.append(str(shared("dataset")))
    partition = shared("partition")
    if partition == "natural" and shared("synthetic-alpha") is not None and shared("synthetic-beta") is not None:
        parts.append(f"Synthetic(α={_fmt_value(shared('synthetic-alpha'))}, β={_fmt_value(shared('synthetic-beta'))})")
    elif partition == "dirichlet" and shared("dirichlet-beta") is not None:
        parts.append(f"Dirichlet β={_fmt_value(shared('dirichlet-beta'))}")
    elif partition == "shards" and shared("shards-per-client") is not None:
        parts.append(f"shards s={_fmt_value(shared('shards-per-client'))}")
    elif partition is not None:
        parts.append(str(partition))
    return " · ".join(parts)


def _message_plot(out_path: str | Path, title: str, message: str) -> Path:
    fig = _figure(6, 3)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=11)
    return _save(fig, out_path)


def plot_accuracy(
    runs: Sequence[RunRecord],
    out_path: str | Path,
    group_by: str | Sequence[str] = "method",
    title: str | None = None,
) -> Path:
    """Test accuracy (%) per round, one line per group (mean over seeds), round 0 included.

    The shaded band spans min..max over the group's seeds at each round (drawn when a
    group has two or more seeds with that round). Seeds with fewer rounds only contribute
    to the rounds they have.
    """
    title = title if title is not None else "Test accuracy per round" + (
        f" — {_common_title(runs)}" if runs and _common_title(runs) else ""
    )
    curves = [(label, [r.accuracy_curve() for r in group]) for label, group in _groups(runs, group_by)]
    curves = [(label, [c for c in cs if c[0].size]) for label, cs in curves]
    curves = [(label, cs) for label, cs in curves if cs]
    if not curves:
        return _message_plot(out_path, title, "no accuracy recorded in these runs")
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    colours = _colours([label for label, _ in curves])
    styles = ("-", "--", "-.", ":")
    any_band = False
    for i, (label, cs) in enumerate(curves):
        rounds = np.array(sorted(set().union(*(c[0].tolist() for c in cs))), dtype=int)
        grid = np.full((len(cs), rounds.size), np.nan)
        for j, (xs, ys) in enumerate(cs):
            grid[j, np.searchsorted(rounds, xs)] = ys
        counts = np.isfinite(grid).sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(grid, axis=0)
            lo, hi = np.nanmin(grid, axis=0), np.nanmax(grid, axis=0)
        colour = colours[label]
        style = "-" if label in _BASE_COLOURS else styles[(i % (len(styles) - 1)) + 1]
        ax.plot(rounds, mean, style, color=colour, lw=1.8, label=f"{label} (n={len(cs)})",
                marker="o" if rounds.size <= 25 else None, ms=3)
        if len(cs) > 1:
            band = counts > 1
            ax.fill_between(rounds, lo, hi, where=band, color=colour, alpha=0.18, lw=0, interpolate=False)
            any_band = any_band or bool(band.any())
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round (0 = initial model)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(0, 100)
    multi = any(len(cs) > 1 for _, cs in curves)
    legend_title = BAND_NOTE if any_band else ("line: mean over seeds" if multi else None)
    ax.legend(title=legend_title, fontsize=9, title_fontsize=8,
              loc="lower right")
    return _save(fig, out_path)


def _client_matrix(clients: dict[str, Any]) -> tuple[np.ndarray, list[Any]]:
    """(clients x classes count matrix, client ids) from a clients.json dict."""
    entries = clients.get("clients") or []

    def order(entry: dict[str, Any]) -> float:
        pid = _num(entry.get("partition_id"))
        return pid if math.isfinite(pid) else math.inf

    entries = sorted((e for e in entries if isinstance(e, dict)), key=order)
    width = int(clients.get("num_classes") or 0)
    width = max([width] + [len(e.get("class_counts") or []) for e in entries])
    matrix = np.zeros((len(entries), width), dtype=np.int64)
    for i, e in enumerate(entries):
        counts = [0 if not math.isfinite(_num(v)) else int(_num(v)) for v in (e.get("class_counts") or [])]
        matrix[i, : len(counts)] = counts
    ids = [e.get("partition_id", i) for i, e in enumerate(entries)]
    return matrix, ids


def _client_rows(clients: dict[str, Any]) -> dict[Any, tuple[int, ...]]:
    """partition id -> class counts, for comparing recorded partitions."""
    matrix, ids = _client_matrix(clients)
    return {pid: tuple(int(v) for v in row) for pid, row in zip(ids, matrix)}


def holders_per_class(clients: dict[str, Any]) -> np.ndarray:
    """How many clients hold at least one sample of each class."""
    matrix, _ = _client_matrix(clients)
    return (matrix > 0).sum(axis=0)


def plot_partition(clients: dict[str, Any], out_path: str | Path, title: str | None = None) -> Path:
    """Heatmap clients x classes of local sample counts (log colour scale).

    Vacant cells (count 0) are light grey with hatching; counts are written in the cells
    when the grid is at most 20 x 20. Row labels give each client's total and the number
    of classes it holds.
    """
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    matrix, ids = _client_matrix(clients or {})
    n_clients, n_classes = matrix.shape
    if matrix.size == 0:
        return _message_plot(out_path, title or "Label distribution", "no client class counts recorded")
    vacant = int((matrix == 0).sum())
    title = title if title is not None else (
        f"Label distribution: {n_clients} clients × {n_classes} classes "
        f"({vacant} vacant client-class pairs)"
    )
    small = n_clients <= 20 and n_classes <= 20
    width = min(22.0, max(6.5, 2.8 + 0.55 * n_classes if small else 3.0 + 0.12 * n_classes))
    height = min(16.0, max(3.2, 1.6 + 0.42 * n_clients if small else 1.8 + 0.12 * n_clients))
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ax.set_facecolor("#eeeeee")
    masked = np.ma.masked_equal(matrix, 0)
    vmax = max(int(matrix.max()), 2)
    im = ax.imshow(masked, cmap="viridis", norm=LogNorm(vmin=1, vmax=vmax), aspect="auto",
                   interpolation="nearest")
    # hatch the vacant cells
    for i, j in zip(*np.nonzero(matrix == 0)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#eeeeee", edgecolor="#b0b0b0",
                               hatch="///", lw=0))
    if small:
        cmap, norm = im.get_cmap(), im.norm
        for i in range(n_clients):
            for j in range(n_classes):
                count = int(matrix[i, j])
                if count == 0:
                    continue
                r, g, b, _ = cmap(norm(count))
                colour = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                ax.text(j, i, str(count), ha="center", va="center", fontsize=7.5, color=colour)
    ax.set_xlabel("class        (hatched grey = vacant: 0 samples)")
    ax.set_ylabel("client  (local samples, classes held)")
    tick_step = max(1, int(math.ceil(n_classes / 25)))
    ax.set_xticks(range(0, n_classes, tick_step))
    held = (matrix > 0).sum(axis=1)
    totals = matrix.sum(axis=1)
    row_step = max(1, int(math.ceil(n_clients / 30)))
    ax.set_yticks(range(0, n_clients, row_step))
    ax.set_yticklabels([f"{ids[i]}  (n={totals[i]}, {held[i]} cl.)" for i in range(0, n_clients, row_step)],
                       fontsize=8)
    ax.set_xlim(-0.5, n_classes - 0.5)
    ax.set_ylim(n_clients - 0.5, -0.5)
    fig.colorbar(im, ax=ax, label="samples (log scale)", shrink=0.9, pad=0.01)
    ax.set_title(title, fontsize=11)
    return _save(fig, out_path)


def plot_per_class(
    runs: Sequence[RunRecord],
    out_path: str | Path,
    clients: dict[str, Any] | None = None,
    group_by: str | Sequence[str] = "method",
    title: str | None = None,
) -> Path:
    """Final-round per-class accuracy (%) of the global model, grouped bars per method.

    Bars are the mean over seeds (NaN entries ignored), whiskers min..max over seeds.
    With ``clients``, each class tick reads "c\\n(k cl.)": k = clients holding class c.
    Classes with no defined accuracy (absent from the test set) are marked "n/a".
    """
    title = title if title is not None else "Final-round per-class accuracy" + (
        f" — {_common_title(runs)}" if runs and _common_title(runs) else ""
    )
    groups = []
    for label, group in _groups(runs, group_by):
        arrays = [a for a in (r.final_per_class() for r in group) if a is not None]
        if arrays:
            groups.append((label, arrays))
    if not groups:
        return _message_plot(out_path, title, "no per-class accuracy recorded in these runs")
    n_classes = max(a.size for _, arrays in groups for a in arrays)
    holders = holders_per_class(clients) if clients else None
    if holders is not None:
        n_classes = max(n_classes, holders.size)
    stats = []
    for label, arrays in groups:
        grid = np.full((len(arrays), n_classes), np.nan)
        for j, a in enumerate(arrays):
            grid[j, : a.size] = a
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            stats.append((label, len(arrays), np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0)))
    colours = _colours([s[0] for s in stats])
    x = np.arange(n_classes)
    many = n_classes > 30
    fig = _figure(min(22.0, max(7.0, 2.0 + (0.16 if many else 0.28 + 0.1 * len(stats)) * n_classes)), 4.6)
    ax = fig.add_subplot()
    width = 0.8 / len(stats)
    for k, (label, n, mean, lo, hi) in enumerate(stats):
        name = f"{label} (n={n})"
        if many:
            ax.plot(x, mean, "-", marker=".", color=colours[label], lw=1.0, label=name)
            continue
        offset = (k - (len(stats) - 1) / 2) * width
        heights = np.nan_to_num(mean, nan=0.0)
        bars = ax.bar(x + offset, heights, width=width * 0.95, color=colours[label], label=name)
        for bar, m in zip(bars, mean):
            if not math.isfinite(m):
                bar.set_visible(False)
        if n > 1:
            ok = np.isfinite(mean)
            ax.errorbar(x[ok] + offset, mean[ok], yerr=[mean[ok] - lo[ok], hi[ok] - mean[ok]],
                        fmt="none", ecolor="black", elinewidth=0.7, capsize=1.5, alpha=0.7)
    undefined = np.all([~np.isfinite(s[2]) for s in stats], axis=0)
    for c in np.nonzero(undefined)[0]:
        ax.text(c, 2, "n/a", ha="center", va="bottom", fontsize=7, color="#555555", rotation=90)
    step = max(1, int(math.ceil(n_classes / 40)))
    ticks = x[::step]
    ax.set_xticks(ticks)
    if holders is not None:
        ax.set_xticklabels([f"{c}\n({holders[c] if c < holders.size else 0} cl.)" for c in ticks], fontsize=8)
        ax.set_xlabel("class (clients holding it)")
    else:
        ax.set_xlabel("class")
    ax.set_xlim(-0.6, n_classes - 0.4)
    ax.set_ylim(0, 105)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    any_whiskers = (not many) and any(s[1] > 1 for s in stats)
    ax.legend(
        fontsize=8, ncols=min(len(stats), 5), loc="upper center", frameon=False,
        bbox_to_anchor=(0.5, -0.16 if holders is not None else -0.11),
        title="bar: mean over seeds; whisker: min–max" if any_whiskers else None, title_fontsize=8,
    )
    return _save(fig, out_path)


# ---------------------------------------------------------------------------------------
# everything at once
# ---------------------------------------------------------------------------------------
def _same_partition(runs: Sequence[RunRecord]) -> dict[str, Any] | None:
    """The clients.json shared by all runs (same class counts), else None."""
    found = [r.clients for r in runs if r.clients]
    if not found or len(found) != len(runs):
        return None
    first = _client_matrix(found[0])[0]
    for other in found[1:]:
        m = _client_matrix(other)[0]
        if m.shape != first.shape or not np.array_equal(m, first):
            return None
    return found[0]


def make_report(
    root: str | Path | Iterable[str | Path],
    out_dir: str | Path | None = None,
    rows: Sequence[str] = ("dataset", "partition", "dirichlet-beta"),
    cols: Sequence[str] = ("method",),
) -> dict[str, Path]:
    """Load every finished run under root; write the table and every plot with data.

    Output (default ``<root>/report``): results.md/.csv; per table row (dataset x
    partition ...): ``accuracy-<row>.png`` and ``per-class-<row>.png``; one
    ``partition-<row>-s<seed>.png`` per distinct recorded partition. Returns name -> path.
    """
    runs = load_runs(root)
    if out_dir is None:
        if not isinstance(root, (str, Path)):
            raise ValueError("out_dir is required when several roots are given")
        out_dir = Path(root) / "report"
    out_dir = Path(out_dir)
    written: dict[str, Path] = {}
    report_table = table(runs, rows=rows, cols=cols)
    written["table_md"], written["table_csv"] = write_table(report_table, out_dir)
    if (diag := write_diagnostics(report_table, runs, out_dir)) is not None:
        written["diagnostics_md"], written["diagnostics_csv"] = diag
    by_row: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        by_row.setdefault(tuple(config_value(run.config, k) for k in rows), []).append(run)
    for row in report_table.row_values + [r for r in by_row if r not in report_table.row_values]:
        group = by_row.get(row, [])
        if not group:
            continue
        slug = _slug("-".join(_fmt_value(v) for v in row)) if row else "all"
        if any(r.accuracy_curve()[0].size for r in group):
            written[f"accuracy-{slug}"] = plot_accuracy(group, out_dir / f"accuracy-{slug}.png")
        if any(r.final_per_class() is not None for r in group):
            written[f"per-class-{slug}"] = plot_per_class(
                group, out_dir / f"per-class-{slug}.png", clients=_same_partition(group)
            )
        seen: list[dict] = []
        # most clients first: a run that stopped early recorded only the clients it heard
        # from, a part of a partition another run of the same seed shows whole
        with_clients = [r for r in group if r.clients and _client_matrix(r.clients)[0].size]
        for run in sorted(with_clients, key=lambda r: (str(r.seed), -len(_client_rows(r.clients)))):
            rows_ = _client_rows(run.clients)
            if any(all(other.get(pid) == counts for pid, counts in rows_.items()) for other in seen):
                continue  # the same partition (or a part of one) is plotted already
            seen.append(rows_)
            name = f"partition-{slug}-s{_slug(str(run.seed))}"
            if name in written:
                name = f"{name}-{len(seen)}"
            title = f"Label distribution — {_common_title([run])}, seed {run.seed}"
            written[name] = plot_partition(run.clients, out_dir / f"{name}.png", title=title)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Tables and plots from fedvls-flwr run folders.")
    parser.add_argument("root", nargs="+", help="run folder(s) or folder(s) holding run folders")
    parser.add_argument("--out", default=None, help="output folder (default: ROOT/report)")
    parser.add_argument("--rows", default="dataset,partition,dirichlet-beta", help="config keys for rows")
    parser.add_argument("--cols", default="method", help="config keys for columns")
    args = parser.parse_args(argv)
    root = args.root[0] if len(args.root) == 1 else args.root
    written = make_report(
        root, args.out,
        rows=tuple(k for k in args.rows.split(",") if k), cols=tuple(k for k in args.cols.split(",") if k),
    )
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
