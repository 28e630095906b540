"""Run a YAML preset (a set of runs) as real `flwr run` simulations, then tabulate and plot.

Each run is a real ``flwr run`` submission to one SuperLink that this command starts and
stops itself: the same code path a user's ``flwr run .`` takes, so a table is evidence
about the app, not about a re-implementation. Runs whose folder already holds a
``summary.json`` are skipped, so an interrupted sweep resumes where it stopped.

Preset format (see conf/*.yaml)::

    name: table1-mnist10k
    description: ...
    base: {dataset: mnist10k, data-dir: ../shared/data, num-server-rounds: 50}
    grid: {method: [fedavg, fedvls], dirichlet-beta: [0.5, 0.05], seed: [0, 1, 2]}
    variants: [{}, {use-dis: false}]   # optional: each combined with every grid point
    federation: {num-supernodes: 10, client-resources-num-cpus: 1}
    table: {rows: [dataset, dirichlet-beta], cols: [method]}

Relative ``data-dir`` values in a preset are taken relative to the project folder.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, parse_run_config
from .launch import PROJECT_DIR, LocalSuperLink
from .results import SUMMARY_FILE

DEFAULT_FEDERATION = {"num-supernodes": 10, "client-resources-num-cpus": 1}
# Keys that belong to the simulated federation, not to the app's run config; allowed in
# `grid`/`variants` so that e.g. the number of clients can be swept.
FEDERATION_KEYS = ("num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus")
NAME_KEYS = ("dataset", "method", "partition", "dirichlet-beta", "shards-per-client", "seed")


class PresetError(ValueError):
    """A preset file that cannot be run; the message names the file and the problem."""


@dataclass
class Preset:
    name: str
    path: Path | None
    runs: list[dict[str, Any]]
    federation: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_FEDERATION))
    table_rows: tuple[str, ...] = ("dataset", "partition", "dirichlet-beta")
    table_cols: tuple[str, ...] = ("method",)
    description: str = ""


def split_federation(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run config, federation settings) of one run's overrides."""
    run = {k: v for k, v in overrides.items() if k not in FEDERATION_KEYS}
    return run, {k: v for k, v in overrides.items() if k in FEDERATION_KEYS}


def run_name(overrides: dict[str, Any], varying: tuple[str, ...] = ()) -> str:
    """A readable folder name: dataset, method, skew, seed, plus the ``varying`` keys."""
    run, federation = split_federation(overrides)
    cfg = parse_run_config({k: v for k, v in run.items() if k != "run-name"})
    skew = {"dirichlet": f"dir{cfg.dirichlet_beta:g}", "shards": f"shards{cfg.shards_per_client}", "iid": "iid"}
    parts = [cfg.dataset, cfg.method, "natural" if cfg.dataset == "synthetic" else skew[cfg.partition]]
    for key in varying:
        if key in NAME_KEYS or key in FEDERATION_KEYS or key not in run:
            continue
        parts.append(f"{key}{run[key]}")
    if "num-supernodes" in federation and "num-supernodes" in varying:
        parts.append(f"n{federation['num-supernodes']}")
    parts.append(f"s{cfg.seed}")
    return "-".join(str(p).replace("/", "_") for p in parts)


def load_preset(path: Path | str, *, sets: dict[str, Any] | None = None, seeds: list[int] | None = None) -> Preset:
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PresetError(f"preset {path} does not exist; presets live in {PROJECT_DIR / 'conf'}") from None
    except yaml.YAMLError as err:
        raise PresetError(f"preset {path} is not valid YAML: {err}") from None
    if not isinstance(spec, dict):
        raise PresetError(f"preset {path}: expected a mapping with 'base' and 'grid'")
    unknown = set(spec) - {"name", "description", "base", "grid", "variants", "federation", "table"}
    if unknown:
        raise PresetError(f"preset {path}: unknown top-level keys {sorted(unknown)}")
    base = dict(spec.get("base") or {})
    grid = dict(spec.get("grid") or {})
    if seeds is not None:
        grid["seed"] = seeds
    variants = spec.get("variants") or [{}]
    keys = list(grid)
    values = [v if isinstance(v, list) else [v] for v in grid.values()]
    runs = []
    for combo in itertools.product(*values):
        for variant in variants:
            overrides = {**base, **dict(zip(keys, combo)), **variant, **(sets or {})}
            if isinstance(overrides.get("data-dir"), str) and not overrides["data-dir"].startswith(("/", "~")):
                overrides["data-dir"] = str((PROJECT_DIR / overrides["data-dir"]).resolve())
            try:
                parse_run_config(split_federation(overrides)[0])
            except ConfigError as err:
                raise PresetError(f"preset {path}: run {overrides}: {err}") from None
            runs.append(overrides)
    varying = tuple(sorted({k for r in runs for k in r if len({repr(x.get(k)) for x in runs}) > 1}))
    for r in runs:
        r.setdefault("run-name", run_name(r, varying))
    names = [r["run-name"] for r in runs]
    if len(set(names)) != len(names):
        raise PresetError(f"preset {path}: two runs are identical (same settings); remove the duplicate")
    table = spec.get("table") or {}
    return Preset(
        name=str(spec.get("name") or path.stem),
        path=path,
        runs=runs,
        federation={**DEFAULT_FEDERATION, **(spec.get("federation") or {})},
        table_rows=tuple(table.get("rows", Preset.table_rows)),
        table_cols=tuple(table.get("cols", Preset.table_cols)),
        description=str(spec.get("description") or ""),
    )


def check_data(preset: Preset) -> None:
    """Every run's dataset and partition now, so that a missing dataset or a split that
    cannot be drawn fails before any SuperLink starts (datasets and splits are cached)."""
    from .check import check_run_config

    for overrides in preset.runs:
        run, federation = split_federation(overrides)
        nodes = federation.get("num-supernodes", preset.federation.get("num-supernodes"))
        try:
            check_run_config({k: v for k, v in run.items() if k != "run-name"}, num_supernodes=nodes)
        except (ValueError, FileNotFoundError) as err:  # bad key / split, missing dataset
            raise PresetError(f"preset {preset.path}: run {overrides['run-name']}: {err}") from None


def run_preset(
    preset: Preset, output_dir: Path, *, timeout: float = 3600.0, log=print, report: bool = True,
) -> dict[str, Any]:
    """Run every not-yet-finished run of ``preset`` under ``output_dir``; returns a status dict."""
    output_dir = Path(output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    check_data(preset)
    todo, done = [], []
    for overrides in preset.runs:
        name = overrides["run-name"]
        # resume=true: a run interrupted mid-way continues from its last checkpoint.
        entry = {**overrides, "output-dir": str(output_dir), "run-name": name, "resume": True}
        (done if (output_dir / name / SUMMARY_FILE).exists() else todo).append(entry)
    log(f"[sweep] {preset.name}: {len(preset.runs)} runs, {len(done)} already finished, {len(todo)} to run")
    statuses: dict[str, str] = {e["run-name"]: "skipped (finished earlier)" for e in done}
    if todo:
        with LocalSuperLink(output_dir / ".flwr-home") as link:
            for i, entry in enumerate(todo, 1):
                t0 = time.perf_counter()
                log(f"[sweep] ({i}/{len(todo)}) {entry['run-name']} ...")
                run_config, federation = split_federation(entry)
                run_id = link.submit(run_config=run_config, federation_config={**preset.federation, **federation})
                outcome = link.wait(run_id, timeout=timeout)
                statuses[entry["run-name"]] = outcome.status
                summary_path = output_dir / entry["run-name"] / SUMMARY_FILE
                if outcome.completed and summary_path.exists():
                    s = json.loads(summary_path.read_text())
                    log(f"[sweep]     best {100 * s['best_accuracy']:.2f}% (round {s['best_round']}), "
                        f"final {100 * s['final_accuracy']:.2f}%, {time.perf_counter() - t0:.0f}s")
                else:
                    (output_dir / f"{entry['run-name']}.failed.log").write_text(outcome.log)
                    log(f"[sweep]     {outcome.status}; log in {entry['run-name']}.failed.log")
    paths = {}
    if report:
        from .report import make_report

        paths = make_report(output_dir, out_dir=output_dir / "report", rows=preset.table_rows, cols=preset.table_cols)
        log(f"[sweep] report: {output_dir / 'report'}")
    return {"statuses": statuses, "report": paths}


def _parse_sets(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise PresetError(f"--set {item!r}: expected key=value")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedvls_flwr.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", help="a YAML preset, e.g. conf/table1-mnist10k.yaml")
    parser.add_argument("--output-dir", "-o", help="where runs and the report go (default: ~/fedvls-runs/<preset name>)")
    parser.add_argument("--seeds", help="comma-separated seeds, replacing the preset's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key in every run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run before it is stopped")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        preset = load_preset(args.preset, sets=_parse_sets(args.set), seeds=seeds)
    except (PresetError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    output_dir = Path(args.output_dir) if args.output_dir else Path("~/fedvls-runs").expanduser() / preset.name
    if args.dry_run:
        for overrides in preset.runs:
            print(overrides["run-name"], json.dumps(overrides))
        return 0
    try:
        result = run_preset(preset, output_dir, timeout=args.timeout)
    except (PresetError, ConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [name for name, status in result["statuses"].items() if "failed" in status or "timeout" in status]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
