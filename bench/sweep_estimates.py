"""How good a sweep's time-left estimates were: each estimate next to the time that really was left.

    python -m fedvls_flwr sweep bench/sweep-digits-small.yaml -o /tmp/est --progress-every 0
    python bench/sweep_estimates.py /tmp/est

Reads ``sweep-progress.jsonl`` (every estimate the sweep made, with the time it was made) and
prints, per round seen, the run's and the sweep's estimated time left against the real one
(the time from that moment to the run's ``run-end`` / the last run's ``run-end``), and the
errors summarised per round of a run and over the whole sweep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedvls_flwr.experiments.progress import PROGRESS_FILE  # noqa: E402


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def _err(estimate: float | None, real: float) -> str:
    if estimate is None:
        return ""
    return f"{estimate - real:+.0f} s" + (f" ({100 * (estimate - real) / real:+.0f}%)" if real > 0 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", type=Path, help="the sweep's output folder")
    args = parser.parse_args()
    events = [json.loads(line) for line in (args.output_dir / PROGRESS_FILE).read_text().splitlines() if line.strip()]
    # a sweep run again (resumed) appends: take the last sweep in the file
    starts = [i for i, e in enumerate(events) if e["event"] == "run-start"]
    ends = {e["run"]: e["t"] for e in events if e["event"] == "run-end"}
    if not starts or not ends:
        raise SystemExit(f"{args.output_dir / PROGRESS_FILE}: no finished run recorded")
    sweep_end = max(ends.values())
    sweep_start = events[starts[0]]["t"]
    print(f"sweep: {len(ends)} runs, {sweep_end - sweep_start:.0f} s from the first submission to the last run's end\n")
    print("| run | round | accuracy | run left: estimated | real | error | sweep left: estimated | real | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    run_errors: dict[int, list[float]] = {}
    sweep_errors: list[float] = []
    for e in events:
        if e["event"] != "round" or e["run"] not in ends:
            continue
        real_run, real_sweep = ends[e["run"]] - e["t"], sweep_end - e["t"]
        acc = "" if e.get("accuracy") is None else f"{100 * e['accuracy']:.1f}%"
        print(f"| {e['run']} | {e['round']}/{e['rounds']} | {acc} | {_fmt(e['run_left'])} | {real_run:.0f} | "
              f"{_err(e['run_left'], real_run)} | {_fmt(e['sweep_left'])} | {real_sweep:.0f} | "
              f"{_err(e['sweep_left'], real_sweep)} |")
        if e["run_left"] is not None and real_run > 0:
            run_errors.setdefault(e["round"], []).append(abs(e["run_left"] - real_run) / real_run)
        if e["sweep_left"] is not None and real_sweep > 0:
            sweep_errors.append(abs(e["sweep_left"] - real_sweep) / real_sweep)
    print("\n| after round | runs | run left: median abs. error |")
    print("|---:|---:|---:|")
    for round_, errors in sorted(run_errors.items()):
        print(f"| {round_} | {len(errors)} | {100 * statistics.median(errors):.0f}% |")
    if sweep_errors:
        print(f"\nsweep left: median abs. error {100 * statistics.median(sweep_errors):.0f}% over "
              f"{len(sweep_errors)} estimates (max {100 * max(sweep_errors):.0f}%)")


if __name__ == "__main__":
    main()
