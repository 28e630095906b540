"""The diagnostics table: drift diversity and the local-update view per table cell, averaged
over the last rounds of each run, then over seeds (Markdown and CSV). No Flower, no torch."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedvls_flwr.experiments.runs import RunRecord, _fmt_value, _num, _round_of
from fedvls_flwr.experiments.tables import Cell, ReportTable, csv_float

# ---------------------------------------------------------------------------------------
# diagnostics table (drift diversity, the local-update view)
# ---------------------------------------------------------------------------------------
#: The diagnostics are averaged over the last rounds of a run (a late, well-trained global
#: model, as in the paper's appendix Table 12), then over seeds.
LAST_ROUNDS = 10


LOCAL_GROUPS = ("vacant", "minority", "majority")


def _late_mean(run: RunRecord, value: Callable[[dict[str, Any]], object]) -> float:
    """Mean of ``value(round record)`` over the last LAST_ROUNDS trained rounds (NaN-free)."""
    late = sorted((r for r in run.rounds if _round_of(r) >= 1), key=_round_of)[-LAST_ROUNDS:]
    values = [v for v in (_num(value(r)) for r in late) if math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def _local_update(group: str, side: str) -> Callable[[dict[str, Any]], object]:
    """A round record's local-update accuracy of ``group`` classes for the ``side`` model."""
    return lambda record: (record.get("local_update") or {}).get(group, {}).get(side)


def diagnostics_rows(report_table: ReportTable, runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """Per table cell: drift diversity and, where recorded, the local-update view (%)."""
    out = []
    for row, col, members in report_table.cell_runs(runs):
        entry: dict[str, Any] = {"row": row, "col": col, "n": len(members)}
        entry["drift_diversity"] = [_late_mean(r, lambda x: x.get("drift_diversity")) for r in members]
        for group in LOCAL_GROUPS:
            for side in ("local", "global"):
                entry[f"{group}_{side}"] = [100.0 * _late_mean(r, _local_update(group, side)) for r in members]
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
                            + [csv_float(x) for m, d in stats for x in (m, d)])
    md_path = out_dir / "diagnostics.md"
    md_path.write_text("\n".join(lines) + "\n")
    return md_path, csv_path
