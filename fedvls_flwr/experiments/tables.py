"""Results tables from run records: best and final accuracy per cell (mean ± std over
seeds) and the paired gaps between two methods, as Markdown and CSV. No Flower, no torch."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedvls_flwr.config.registry import method_settings, run_parts
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.config.unread import unread_settings
from fedvls_flwr.experiments.runs import (
    IGNORED_KEYS,
    RunRecord,
    _fmt_value,
    _value_sort_key,
    config_value,
)


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
    #: runs of this cell left out of the means: "seed 2: failed in round 3"
    excluded: list[str] = field(default_factory=list)
    #: per run in the means: the share of its client updates that were not used
    dropped_shares: list[float] = field(default_factory=list)

    @property
    def dropped_share(self) -> float:
        return float(np.mean(self.dropped_shares)) if self.dropped_shares else 0.0

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
    #: runs left out because their cell already holds their seed (also in ``notes``, said by the report)
    repeated: dict[Path, str] = field(default_factory=dict)

    def cell(self, row: Sequence[Any], col: Sequence[Any]) -> Cell | None:
        return self.cells.get((tuple(row), tuple(col)))

    def seeds_per_cell(self) -> list[int]:
        return sorted({c.n for c in self.cells.values()})

    def cell_runs(self, runs: Sequence[RunRecord]) -> Iterator[tuple[tuple, tuple, list[RunRecord]]]:
        """(row, col, the cell's runs) for every filled cell, in display order (the tables
        beside the results table - diagnostics, stages - are built from these)."""
        by_path = {r.path: r for r in runs}
        for row in self.row_values:
            for col in self.col_values:
                if (cell := self.cell(row, col)) is not None:
                    yield row, col, [by_path[p] for p in cell.run_paths]


def _parts_of(config: dict[str, Any]) -> list:
    try:
        return list(run_parts(config).values())
    except ValueError:  # a part this version does not know
        return []


def _unread(config: dict[str, Any]) -> set[str]:
    """The settings of ``config`` nothing in its run read (FedGF's threshold with a fixed c)."""
    try:
        return set(unread_settings({**RunConfig().to_flower(), **config}))
    except (ValueError, KeyError):  # a part or value this version does not know
        return set()


def _mixed_settings(runs: list[RunRecord], skip: set[str]) -> list[str]:
    """Config keys whose values differ among these runs (that matter to their method)."""
    keys = set().union(*(r.config.keys() for r in runs)) - IGNORED_KEYS - skip
    relevant = {s.key for r in runs for part in _parts_of(r.config) for s in part.settings}
    unread = [_unread(r.config) for r in runs]
    relevant -= set(unread[0]).intersection(*unread[1:]) if unread else set()
    every_method_key = {s.key for s in method_settings()}
    mixed = []
    for key in sorted(keys):
        if key in every_method_key and key not in relevant:
            continue
        values = {json.dumps(config_value(r.config, key), sort_keys=True, default=str) for r in runs}
        if len(values) > 1:
            mixed.append(key)
    return mixed


def table(
    runs: Sequence[RunRecord],
    rows: Sequence[str] = ("dataset", "partition", "dirichlet-beta"),
    cols: Sequence[str] = ("method",),
    include_incomplete: bool = False,
) -> ReportTable:
    """Group runs by config values of ``rows`` x ``cols``; per cell mean/std over seeds.

    ``method`` groups by the variant label (see :func:`method_label`), so ablations stay
    apart. Std is the sample std (ddof = 1), 0 for a single seed. A run that failed or
    stopped before its last round is left out of the means (a diverging method must not
    look better for it) and counted in its cell, unless ``include_incomplete``. Runs
    without any accuracy are left out (named in ``notes``). A seed a cell holds twice (the same
    experiment run again, e.g. on the other engine, which computes the same) is counted once,
    its first run in path order, and ``notes`` names the runs left out and each run's engine;
    ``notes`` also names cells whose runs differ in other settings.
    """
    rows, cols = tuple(rows), tuple(cols)
    row_sort: dict[tuple, tuple] = {}
    col_sort: dict[tuple, tuple] = {}
    cells: dict[tuple[tuple, tuple], Cell] = {}
    members: dict[tuple[tuple, tuple], list[RunRecord]] = {}
    notes: list[str] = []
    repeated: dict[tuple[tuple, tuple, str], list[RunRecord]] = {}  # a seed's runs after the first of a cell
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
        why = run.incomplete()
        if why is not None and not include_incomplete:
            cell.excluded.append(f"seed {run.seed}: {why}")
            members.setdefault((row, col), [])
            continue
        if str(run.seed) in map(str, cell.seeds):  # the same experiment again (e.g. on the other engine)
            repeated.setdefault((row, col, str(run.seed)), []).append(run)
            continue
        cell.dropped_shares.append(run.dropped_share())
        cell.seeds.append(run.seed)
        cell.best_values.append(best)
        cell.final_values.append(final if final is not None else math.nan)
        cell.run_paths.append(run.path)
        members.setdefault((row, col), []).append(run)
    left_out: dict[Path, str] = {}
    for (row, col, seed), again in repeated.items():
        where = ", ".join(_fmt_value(v) for v in row + col)
        kept = next(r for r in members[(row, col)] if str(r.seed) == seed)
        others = "; ".join(f"{r.path} ({_engine(r)})" for r in again)
        note = (f"[{where}] seed {seed} has {len(again) + 1} runs: counted once, {kept.path} ({_engine(kept)}); "
                f"left out: {others}")
        notes.append(note)
        left_out.update((r.path, note) for r in again)
    for row, col in cells:
        where = ", ".join(_fmt_value(v) for v in row + col)
        mixed = _mixed_settings(members[(row, col)], set(rows) | set(cols)) if members[(row, col)] else []
        if mixed:
            notes.append(f"[{where}] runs differ in: {', '.join(mixed)}")
    return ReportTable(
        row_keys=rows,
        col_keys=cols,
        row_values=sorted(row_sort, key=row_sort.__getitem__),
        col_values=sorted(col_sort, key=col_sort.__getitem__),
        cells=cells,
        notes=notes,
        repeated=left_out,
    )


def format_cell(cell: Cell | None, show_n: bool = False) -> str:
    """"best ± std (final ± std)" in %; no ± for a single seed; "–" for no runs. Runs left
    out and updates dropped are said in brackets: "[n=2 of 3, seed 0: failed in round 1]",
    "[8% of updates dropped]"."""
    if cell is None or (cell.n == 0 and not cell.excluded):
        return "–"
    notes = []
    if cell.excluded:
        notes.append(f"n={cell.n} of {cell.n + len(cell.excluded)}, " + "; ".join(cell.excluded))
    elif show_n:
        notes.append(f"n={cell.n}")
    if cell.dropped_share > 0:
        notes.append(f"{100 * cell.dropped_share:.0f}% of updates dropped")
    suffix = f" [{'; '.join(notes)}]" if notes else ""
    if cell.n == 0:
        return "no complete run" + suffix

    def part(mean: float, std: float) -> str:
        if not math.isfinite(mean):
            return "n/a"
        return f"{mean:.2f}" if cell.n == 1 else f"{mean:.2f} ± {std:.2f}"

    return f"{part(cell.best_mean, cell.best_std)} ({part(cell.final_mean, cell.final_std)})" + suffix


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
        f"mean ± sample std over seeds; {seeds_text}. A single seed shows no ±. Runs that failed "
        "or stopped early are left out of the means and named in their cell ([n=2 of 3, ...]); "
        "[x% of updates dropped]: the mean share of client updates per round that could not be "
        "used (client failed, no reply, or reply rejected - e.g. non-finite weights).",
        "",
    ]
    # a column key that does not apply to a column's runs (another method's setting) is left out
    col_names = [", ".join(_fmt_value(v) for v in col if v is not None) or "–" for col in t.col_values]
    header = list(t.row_keys) + col_names
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for row in t.row_values:
        cells = [format_cell(t.cell(row, col), show_n=not uniform) for col in t.col_values]
        lines.append("| " + " | ".join([_fmt_value(v) for v in row] + cells) + " |")
    if t.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in t.notes]
    return "\n".join(lines) + "\n"


def csv_float(value: float) -> str:
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
        "seeds", "best_per_seed", "final_per_seed", "excluded", "dropped_share",
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
                        csv_float(cell.best_mean), csv_float(cell.best_std),
                        csv_float(cell.final_mean), csv_float(cell.final_std),
                        ";".join("" if s is None else str(s) for s in cell.seeds),
                        ";".join(csv_float(v) for v in cell.best_values),
                        ";".join(csv_float(v) for v in cell.final_values),
                        "; ".join(cell.excluded),
                        csv_float(cell.dropped_share),
                    ]
                )
    return md_path, csv_path


# ---------------------------------------------------------------------------------------
# paired gaps: one method minus another, seed by seed (the same partitions)
# ---------------------------------------------------------------------------------------
@dataclass
class Gap:
    """``minuend`` minus ``subtrahend`` best accuracy (points), per seed both ran."""

    row: tuple
    minuend: str
    subtrahend: str
    seeds: list[Any]
    values: list[float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else 0.0


def paired_gaps(report_table: ReportTable, pairs: Sequence[tuple[str, str]]) -> list[Gap]:
    """Per table row and (minuend, subtrahend) pair of column labels: the best-accuracy
    differences of the seeds that both columns ran (runs with the same seed share their
    partition, so the difference is paired). Rows where a label is missing are skipped."""
    gaps = []
    labels = {", ".join(_fmt_value(v) for v in col if v is not None): col for col in report_table.col_values}
    for row in report_table.row_values:
        for minuend, subtrahend in pairs:
            a = report_table.cell(row, labels.get(minuend, ()))
            b = report_table.cell(row, labels.get(subtrahend, ()))
            if a is None or b is None:
                continue
            b_by_seed = dict(zip(map(str, b.seeds), b.best_values))
            seeds = [s for s in a.seeds if str(s) in b_by_seed]
            values = [a.best_values[a.seeds.index(s)] - b_by_seed[str(s)] for s in seeds]
            if values:
                gaps.append(Gap(row, minuend, subtrahend, seeds, values))
    return gaps


def write_gaps(report_table: ReportTable, gaps: Sequence[Gap], out_dir: str | Path) -> tuple[Path, Path]:
    """``gaps.md`` and ``gaps.csv``: mean ± std over seeds and the per-seed differences."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "Difference of the best-over-rounds top-1 accuracy (percentage points), seed by seed "
        "(same seed = same partition), mean ± sample std over the seeds both ran.",
        "",
        "| " + " | ".join([*report_table.row_keys, "difference", "mean ± std", "per seed"]) + " |",
        "|" + "|".join(" --- " for _ in range(len(report_table.row_keys) + 3)) + "|",
    ]
    csv_path = out_dir / "gaps.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*report_table.row_keys, "minuend", "subtrahend", "n", "mean", "std", "seeds", "values"])
        for g in gaps:
            per_seed = ", ".join(f"s{s}: {v:+.2f}" for s, v in zip(g.seeds, g.values))
            lines.append("| " + " | ".join([*(_fmt_value(v) for v in g.row), f"{g.minuend} − {g.subtrahend}",
                                             f"{g.mean:+.2f} ± {g.std:.2f}", per_seed]) + " |")
            writer.writerow([*("" if v is None else v for v in g.row), g.minuend, g.subtrahend, len(g.values),
                             csv_float(g.mean), csv_float(g.std), ";".join(map(str, g.seeds)),
                             ";".join(csv_float(v) for v in g.values)])
    md_path = out_dir / "gaps.md"
    md_path.write_text("\n".join(lines) + "\n")
    return md_path, csv_path




def _engine(run: RunRecord) -> str:
    """The engine summary.json records (older runs do not say)."""
    return str(run.summary.get("engine") or "engine not recorded")
