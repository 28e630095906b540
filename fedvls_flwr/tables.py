"""Results tables from run records: best and final accuracy per cell (mean ± std over
seeds), as Markdown and CSV, and the diagnostics table (drift diversity, the local-update
view). No Flower, no torch."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .methods import METHODS, method_settings
from .runs import (
    IGNORED_KEYS,
    RunRecord,
    _fmt_value,
    _num,
    _round_of,
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
    relevant = {s.key for m in METHODS if m.name in methods for s in m.settings}
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
                        100.0 * _late_mean(r, lambda x, g=group, s=side: (x.get("local_update") or {}).get(g, {}).get(s))
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

