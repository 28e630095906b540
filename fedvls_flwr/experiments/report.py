"""Tables and figures from finished run folders (no Flower, no torch): the command and
:func:`make_report`, which writes everything a folder of runs supports.

* a results table (Markdown + CSV, :mod:`fedvls_flwr.experiments.tables`): mean ± sample std over
  seeds of the best-over-rounds and of the final-round top-1 accuracy, one cell per
  (rows x cols) config combination, the diagnostics table and, for a protocol in stages
  (FedConcat), the stages table (:mod:`fedvls_flwr.experiments.stages_table`);
* figures (:mod:`fedvls_flwr.experiments.plots`): accuracy per round, the partition heatmap,
  final-round per-class accuracy.

Run records and labels: :mod:`fedvls_flwr.experiments.runs`.

Command line: ``python -m fedvls_flwr report RUNS_ROOT [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np

from fedvls_flwr.app.results import atomic_write_json
from fedvls_flwr.config.run_config import RunConfig, did_you_mean
from fedvls_flwr.experiments.diagnostics_table import write_diagnostics
from fedvls_flwr.experiments.plots import (
    _client_matrix,
    _client_rows,
    _common_title,
    plot_accuracy,
    plot_gaps,
    plot_partition,
    plot_per_class,
)
from fedvls_flwr.experiments.preset import TABLE_EXTRA_VALUES
from fedvls_flwr.experiments.runs import (
    NoRunsError,
    RunRecord,
    _fmt_value,
    _slug,
    config_value,
    find_runs,
    load_run,
    load_runs,
    method_label,
)
from fedvls_flwr.experiments.stages_table import write_stages
from fedvls_flwr.experiments.tables import ReportTable, paired_gaps, table, write_gaps, write_table

__all__ = [
    "make_report", "main", "load_run", "load_runs", "method_label", "table", "write_table",
    "plot_accuracy", "plot_partition", "plot_per_class",
]

class ReportInputError(ValueError):
    """A report option that cannot be what the user meant (an unknown key or column); nothing
    is written."""


def table_keys(option: str, text: str) -> tuple[str, ...]:
    """The comma-separated keys of ``--rows``/``--cols``: ``method``, ``label`` or run-config
    keys (as a preset's ``table``); an unknown one would group every run under '-'."""
    allowed = list(dict.fromkeys([*TABLE_EXTRA_VALUES, *RunConfig().to_flower()]))
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    for key in keys:
        if key not in allowed:
            raise ReportInputError(f"{option}: unknown key {key!r}{did_you_mean(key, allowed)}; give method, "
                                   f"label or run-config keys: {', '.join(allowed[len(TABLE_EXTRA_VALUES):])}")
    return keys


def check_gaps(report_table: ReportTable, gaps: Sequence[tuple[str, ...]]) -> None:
    """Every ``--gap A:B`` names two columns the table has (labels as the table shows them)."""
    labels = [", ".join(_fmt_value(v) for v in col if v is not None) for col in report_table.col_values]
    for gap in gaps:
        if len(gap) != 2 or not all(gap):
            raise ReportInputError(f"--gap {':'.join(gap)!r}: expected two column labels A:B, e.g. 'FedVLS:FedAvg'")
        for label in gap:
            if label not in labels:
                raise ReportInputError(
                    f"--gap {':'.join(gap)}: the table has no column {label!r}{did_you_mean(label, labels)}; its "
                    f"columns ({', '.join(report_table.col_keys)}): {', '.join(labels) or 'none'}")


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
    include_incomplete: bool = False,
    gaps: Sequence[tuple[str, str]] = (),
    left_out: list[str] | None = None,
    notes: list[str] | None = None,
    preset: str | None = None,
    preset_file: str | None = None,
) -> dict[str, Path]:
    """Load every finished run under root; write the table and every plot with data
    (failed or stopped runs out of the table's means unless ``include_incomplete``).

    Output (default ``<root>/report``): results.md/.csv; per table row (dataset x
    partition ...): ``accuracy-<row>.png`` and ``per-class-<row>.png``; one
    ``partition-<row>-s<seed>.png`` per distinct recorded partition; diagnostics.md and
    stages.md (/.csv) where runs recorded them, and :data:`MANIFEST`: the files it wrote (and
    ``preset`` and ``preset_file``, the preset whose report it is and its YAML, for ``fedvls sweep``). The files an earlier report
    listed in its manifest that this one does not write (a row it no longer has) are removed: the
    folder shows one report. Nothing else is removed: a folder without a manifest (the user's own,
    an earlier version's report) keeps every file; the manifest is written before the first file,
    and after each, so a report stopped midway is known as one by the next. Returns name -> path (the
    manifest aside);
    ``left_out`` (a list) receives the run folders not tabulated, each with why; ``notes``
    the tabulated runs whose rounds.jsonl lacks rounds their summary.json says completed, and
    the files of a report's names left in ``out_dir`` that this report did not write.

    Raises :class:`NoRunsError` (nothing written) when a root does not exist, no run folder
    is found, or no run completed (unless ``include_incomplete``), and
    :class:`ReportInputError` (nothing written) for a ``gaps`` label the table has no column for, or an
    ``out_dir`` that a file stands in the way of.
    """
    runs, skipped = find_runs(root)
    where = root if isinstance(root, (str, Path)) else (", ".join(map(str, root)) or "no folder (none was given)")
    incomplete = [f"{r.path}: {why} (--include-incomplete tabulates it)" for r in runs
                  if (why := r.incomplete()) is not None and not include_incomplete]
    if not runs or len(incomplete) == len(runs):
        listed = "".join(f"\n  left out {line}" for line in skipped + incomplete)
        raise NoRunsError(
            f"no {'complete ' if runs else ''}run folder (one with summary.json) found in {where}; nothing "
            f"written{listed}" if listed else
            f"no run folder (one with summary.json) found in {where}; nothing written. Give the runs' output-dir "
            "or a run folder")
    if left_out is not None:
        left_out.extend(skipped + incomplete)
    if out_dir is None:
        if not isinstance(root, (str, Path)):
            raise ValueError("out_dir is required when several roots are given")
        out_dir = Path(root) / "report"
    out_dir = Path(out_dir)
    if not out_dir.is_dir() and (blocking := next((p for p in (out_dir, *out_dir.parents) if p.exists()), None)) \
            and not blocking.is_dir():
        raise ReportInputError(f"the report folder {out_dir} cannot be made: {blocking} is a file; give --out a folder "
                               "(a new one, or one that holds a report)")
    written: dict[str, Path] = {}
    report_table = table(runs, rows=rows, cols=cols, include_incomplete=include_incomplete)
    check_gaps(report_table, gaps)
    if notes is not None:
        notes.extend(f"{r.path}: {why}" for r in runs if (why := r.rounds_lost()) is not None)
        notes.extend(dict.fromkeys(report_table.repeated.values()))  # a seed run again: counted once
    runs = [r for r in runs if r.path not in report_table.repeated]  # nor drawn twice in the plots
    previous = read_manifest(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    claimed = set((previous or {}).get("files", []))

    def claim() -> None:
        """The manifest, while the report is written: the last report's files and each file this
        one has written so far (a report stopped midway - Ctrl-C, a full disk - leaves one that
        lists what it wrote, which the next report removes or replaces; a file written in the
        instant before its claim is merely named as not a report's, as a user's file is)."""
        claimed.update(Path(p).name for p in written.values())
        atomic_write_json(out_dir / MANIFEST, {"preset": preset, "preset_file": preset_file,
                                               "files": sorted(claimed), "writing": True})

    claim()  # before the first file: whose report this folder holds
    written["table_md"], written["table_csv"] = write_table(report_table, out_dir)
    claim()
    if (diag := write_diagnostics(report_table, runs, out_dir)) is not None:
        written["diagnostics_md"], written["diagnostics_csv"] = diag
        claim()
    if (staged := write_stages(report_table, runs, out_dir)) is not None:
        written["stages_md"], written["stages_csv"] = staged
        claim()
    if gaps and (found := paired_gaps(report_table, gaps)):
        written["gaps_md"], written["gaps_csv"] = write_gaps(report_table, found, out_dir)
        if all(isinstance(g.row[-1], (int, float)) for g in found):
            written["gaps_plot"] = plot_gaps(found, report_table.row_keys[-1], out_dir / "gaps.png")
        claim()
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
            claim()
        if any(r.final_per_class() is not None for r in group):
            written[f"per-class-{slug}"] = plot_per_class(
                group, out_dir / f"per-class-{slug}.png", clients=_same_partition(group)
            )
            claim()
        seen: list[dict] = []
        # most clients first: a run that stopped early recorded only the clients it heard
        # from, a part of a partition another run of the same seed shows whole
        with_clients = [(r, r.clients) for r in group if r.clients and _client_matrix(r.clients)[0].size]
        for run, clients in sorted(with_clients, key=lambda rc: (str(rc[0].seed), -len(_client_rows(rc[1])))):
            rows_ = _client_rows(clients)
            if any(all(other.get(pid) == counts for pid, counts in rows_.items()) for other in seen):
                continue  # the same partition (or a part of one) is plotted already
            seen.append(rows_)
            name = f"partition-{slug}-s{_slug(str(run.seed))}"
            if name in written:
                name = f"{name}-{len(seen)}"
            title = f"Label distribution — {_common_title([run])}, seed {run.seed}"
            written[name] = plot_partition(clients, out_dir / f"{name}.png", title=title)
            claim()
    _remove_stale(out_dir, written.values(), previous)
    atomic_write_json(out_dir / MANIFEST, {"preset": preset, "preset_file": preset_file,
                                           "files": sorted(Path(p).name for p in written.values())})
    if notes is not None and (left := report_files_left(out_dir, written.values())):
        notes.append(f"{out_dir} also holds {some_names(left)}, which this report did not write (no report's manifest "
                     "lists them: your own files, or an earlier version's report); they are left as they are: "
                     "remove the ones that are stale")
    return written


#: The files a report writes (:func:`make_report`); only these can be removed as stale, and
#: only where the folder's manifest says a report wrote them.
REPORT_FILES = ("results.md", "results.csv", "diagnostics.md", "diagnostics.csv", "stages.md", "stages.csv",
                "gaps.md", "gaps.csv", "gaps.png", "accuracy-*.png", "per-class-*.png", "partition-*.png")
#: A report's record, in its folder, of the files it wrote and whose report it is (JSON:
#: ``{"preset": name or null, "preset_file": its YAML or null, "files": [names]}``); while a
#: report is being written, also ``"writing": true``, and ``files`` lists the last report's files
#: and those this one has written so far.
MANIFEST = ".fedvls-report.json"


def read_manifest(out_dir: str | Path) -> dict[str, Any] | None:
    """The manifest a report left in ``out_dir``: ``files`` (plain names of report files) and
    ``preset`` and ``preset_file`` (str or None); None where there is none (no report of this version wrote there)
    or it cannot be read."""
    try:
        data = json.loads((Path(out_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(files := data.get("files"), list):
        return None
    preset, preset_file = data.get("preset"), data.get("preset_file")
    return {"preset": preset if isinstance(preset, str) else None,
            "preset_file": preset_file if isinstance(preset_file, str) else None,
            "files": [f for f in files if isinstance(f, str) and _is_report_file(f)]}


def _is_report_file(name: str) -> bool:
    """A plain file name (no folder, not hidden) of a report's names."""
    return Path(name).name == name and not name.startswith(".") and any(fnmatch(name, p) for p in REPORT_FILES)


def report_files_left(out_dir: Path, written: Iterable[Path] = ()) -> list[str]:
    """The files of a report's names in ``out_dir`` that neither ``written`` nor its manifest lists."""
    listed = {Path(p).name for p in written} | set((read_manifest(out_dir) or {}).get("files", []))
    return sorted(p.name for pattern in REPORT_FILES for p in out_dir.glob(pattern)
                  if p.is_file() and p.name not in listed)


def some_names(names: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` of ``names``, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _remove_stale(out_dir: Path, written: Iterable[Path], previous: dict[str, Any] | None) -> None:
    """The files the last report here wrote (its manifest lists them) and this one did not write
    again: left, they would read as part of this report. No manifest: nothing is removed."""
    kept = {Path(p).name for p in written}
    for name in (previous or {}).get("files", []):
        if name not in kept and (path := out_dir / name).is_file():
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedvls report", description="Tables and plots from fedvls-flwr run folders.")
    parser.add_argument("root", nargs="+", help="run folder(s) or folder(s) holding run folders")
    parser.add_argument("--out", default=None, help="output folder (default: ROOT/report)")
    keys = ("comma-separated: method (the method's label, variants apart), label (the same), or any "
            "run-config key, e.g. dataset, dirichlet-beta, seed, lr (fedvls check --help; docs/configuration.md)")
    parser.add_argument("--rows", default="dataset,partition,dirichlet-beta",
                        help=f"keys that make the table's rows (default: %(default)s); {keys}")
    parser.add_argument("--cols", default="method", help=f"keys that make its columns (default: %(default)s); {keys}")
    parser.add_argument("--gap", action="append", default=[], metavar="A:B",
                        help="also tabulate column A minus column B, seed by seed (labels as in the table, "
                             "e.g. 'FedVLS:FedAvg'); plotted against the last row key when it is numeric")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="average failed and stopped runs into the means too (they are left out by default)")
    args = parser.parse_args(argv)
    root = args.root[0] if len(args.root) == 1 else args.root
    left_out: list[str] = []
    notes: list[str] = []
    try:
        written = make_report(
            root, args.out, rows=table_keys("--rows", args.rows), cols=table_keys("--cols", args.cols),
            include_incomplete=args.include_incomplete,
            gaps=[tuple(g.split(":", 1)) for g in args.gap], left_out=left_out, notes=notes,
        )
    except (NoRunsError, ReportInputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in left_out:
        print(f"left out {line}", file=sys.stderr)
    for line in notes:
        print(f"warning: {line}", file=sys.stderr)
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
