"""The stages table of a protocol in stages (FedConcat): per table cell and stage, the
rounds, the seconds and the test accuracy at the stage's end and at its best, mean ± sample
std over seeds (Markdown and CSV). A staged method's accuracy is only comparable with the
rounds it took, so the report puts both stages' rounds and costs beside it. No Flower, no
torch."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedvls_flwr.experiments.runs import RunRecord, _fmt_value, _num, _round_of
from fedvls_flwr.experiments.tables import Cell, ReportTable, csv_float

STATS = ("rounds", "seconds", "end_accuracy", "best_accuracy")
NAMES = {"rounds": "rounds", "seconds": "seconds", "end_accuracy": "accuracy at the stage's end (%)",
         "best_accuracy": "best accuracy in the stage (%)"}


def stage_stats(run: RunRecord) -> dict[str, dict[str, float]]:
    """Stage name -> rounds, seconds and accuracies (%, NaN where the stage tests nothing, as
    FedConcat's stage 1 with its K cluster models) from a run's round records."""
    out: dict[str, dict[str, float]] = {}
    for record in sorted((r for r in run.rounds if _round_of(r) >= 1 and "stage" in r), key=_round_of):
        entry = out.setdefault(str(record["stage"]), {"rounds": 0.0, "seconds": 0.0, "end_accuracy": math.nan,
                                                      "best_accuracy": math.nan})
        entry["rounds"] += 1
        entry["seconds"] += _num(record.get("seconds")) if math.isfinite(_num(record.get("seconds"))) else 0.0
        accuracy = _num(record.get("accuracy")) * run.scale
        entry["end_accuracy"] = accuracy
        if math.isfinite(accuracy):
            best = entry["best_accuracy"]
            entry["best_accuracy"] = accuracy if not math.isfinite(best) else max(best, accuracy)
    return out


def stages_rows(report_table: ReportTable, runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """One entry per (table cell, stage) whose runs recorded stages, stages in order."""
    out = []
    for row, col, members in report_table.cell_runs(runs):
        per_run = [stage_stats(run) for run in members]
        for stage in sorted({s for stats in per_run for s in stats}, key=lambda s: (len(s), s)):
            present = [stats[stage] for stats in per_run if stage in stats]
            out.append({"row": row, "col": col, "stage": stage, "n": len(present),
                        **{k: [p[k] for p in present] for k in STATS}})
    return out


def _cell_text(values: list[float], digits: int) -> str:
    mean, std = Cell._mean(values), Cell._std(values)
    if not math.isfinite(mean):
        return "n/a"
    if std == 0.0:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def write_stages(report_table: ReportTable, runs: Sequence[RunRecord], out_dir: str | Path) -> tuple[Path, Path] | None:
    """``stages.md``/``.csv`` when some run recorded stages; None otherwise."""
    rows = stages_rows(report_table, runs)
    if not rows:
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = list(report_table.row_keys) + list(report_table.col_keys)
    lines = [
        "Protocols in stages (FedConcat: stage 1 trains the K cluster encoders, stage 2 the head on "
        "their concatenation): per stage, the rounds it ran, its seconds (the rounds' wall-clock, "
        "evaluation included), the test accuracy after its last round and its best, mean ± sample std "
        "over seeds; n/a where a stage has no global model to test.",
        "",
        "| " + " | ".join(keys + ["stage", "n"] + [NAMES[k] for k in STATS]) + " |",
        "|" + "|".join(" --- " for _ in range(len(keys) + 2 + len(STATS))) + "|",
    ]
    csv_path = out_dir / "stages.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(keys + ["stage", "n"] + [f"{k}_{m}" for k in STATS for m in ("mean", "std")])
        for e in rows:
            cells = [_cell_text(e[k], 0 if k == "rounds" else 1 if k == "seconds" else 2) for k in STATS]
            lines.append("| " + " | ".join([_fmt_value(v) for v in e["row"] + e["col"]] + [e["stage"], str(e["n"])]
                                           + cells) + " |")
            stats = [(Cell._mean(e[k]), Cell._std(e[k])) for k in STATS]
            writer.writerow(["" if v is None else v for v in e["row"] + e["col"]] + [e["stage"], e["n"]]
                            + [csv_float(x) for m, d in stats for x in (m, d)])
    md_path = out_dir / "stages.md"
    md_path.write_text("\n".join(lines) + "\n")
    return md_path, csv_path
