"""YAML presets: a named set of runs (a grid of run-config values, variants, the federation and
the table layout), validated as a whole before any run starts.

Preset format (see conf/*.yaml)::

    name: table1-mnist10k
    description: ...
    base: {dataset: mnist10k, data-dir: ~/fedvls-data, num-server-rounds: 50}
    grid: {method: [fedavg, fedvls], dirichlet-beta: [0.5, 0.05], seed: [0, 1, 2]}
    variants: [{}, {use-dis: false}]   # optional: each combined with every grid point
    # grid may also be a list of such mappings: the runs are the union of their products
    federation: {num-supernodes: 10, client-resources-num-cpus: 1}
    table: {rows: [dataset, dirichlet-beta], cols: [method]}

Relative ``data-dir`` values in a preset are taken relative to the project folder (of a
checkout; for an installed package, relative to the preset's own folder).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedvls_flwr.config.run_config import DEFAULT_MODELS, ConfigError, RunConfig, did_you_mean, model_name, parse_run_config
from fedvls_flwr.ops.launch import PROJECT_DIR

DEFAULT_FEDERATION = {"num-supernodes": 10, "client-resources-num-cpus": 1}


# Keys that belong to the simulated federation, not to the app's run config; allowed in
# `grid`/`variants` so that e.g. the number of clients can be swept.
FEDERATION_KEYS = ("num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus")


NAME_KEYS = ("dataset", "method", "partition", "dirichlet-beta", "shards-per-client", "seed")


TOP_LEVEL_KEYS = ("name", "description", "base", "grid", "variants", "federation", "table")


TABLE_KEYS = ("rows", "cols")


#: What a table row/column may group by besides the run-config keys (report.config_value).
TABLE_EXTRA_VALUES = ("method", "label")


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
    skew = {"dirichlet": f"dir{cfg.dirichlet_beta:g}", "shards": f"shards{cfg.shards_per_client}",
            "noniid-labeldir": f"labeldir{cfg.shards_per_client}", "iid": "iid"}
    parts = [cfg.dataset, cfg.method, "natural" if cfg.dataset == "synthetic" else skew[cfg.partition]]
    if "model" not in varying and (model := model_name(cfg)) != DEFAULT_MODELS[cfg.dataset]:
        # a preset that fixes a non-default model (fmnist-cnn) must not share folder names
        # with the default model's preset (table1-fmnist) in the same output directory
        parts.append(f"model{model}")
    for key in varying:
        if key in NAME_KEYS or key in FEDERATION_KEYS or key not in run:
            continue
        parts.append(f"{key}{run[key]}")
    if "num-supernodes" in federation and "num-supernodes" in varying:
        parts.append(f"n{federation['num-supernodes']}")
    parts.append(f"s{cfg.seed}")
    return "-".join(str(p).replace("/", "_") for p in parts)


class _DuplicateKey(yaml.YAMLError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error: YAML keeps the
    last silently, so a grid meant for three methods would run one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(f"key {key!r} is given twice in one mapping (lines {seen[key]} and {line}); "
                                    "YAML would keep only the last. Give it once (several values of a grid "
                                    f"key are one list: {key}: [a, b, c])")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _mapping(path: Path, what: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PresetError(f"preset {path}: '{what}' must be a mapping of key: value, got {value!r}")
    return dict(value)


def _check_keys(path: Path | None, what: str, keys: Iterable[str], allowed: Iterable[str], extra: str = "") -> None:
    """Every key of ``keys`` in ``allowed``, or a PresetError with a did-you-mean."""
    allowed = list(allowed)
    for key in keys:
        if key not in allowed:
            raise PresetError(
                f"preset {path}: unknown {what} {key!r}{did_you_mean(str(key), allowed)}; "
                f"allowed: {', '.join(allowed)}{extra}"
            )


def check_federation(path: Path, federation: dict[str, Any]) -> None:
    """The federation settings a preset hands to ``flwr run --federation-config``."""
    _check_keys(path, "federation key", federation, FEDERATION_KEYS)
    for key, value in federation.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "num-supernodes" and not (number and int(value) == value and value >= 1):
            raise PresetError(f"preset {path}: federation 'num-supernodes' = {value!r}: must be an integer >= 1")
        if key == "client-resources-num-cpus" and not (number and value > 0):
            raise PresetError(f"preset {path}: federation '{key}' = {value!r}: must be a number > 0")
        if key == "client-resources-num-gpus" and not (number and value >= 0):
            raise PresetError(f"preset {path}: federation '{key}' = {value!r}: must be a number >= 0")


def _table_keys(path: Path, table: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(rows, cols) of a preset's ``table``, each a run-config key or method/label."""
    _check_keys(path, "table key", table, TABLE_KEYS)
    allowed = list(dict.fromkeys([*TABLE_EXTRA_VALUES, *RunConfig().to_flower()]))
    out = []
    for part, default in (("rows", Preset.table_rows), ("cols", Preset.table_cols)):
        keys = table.get(part, default)
        keys = [keys] if isinstance(keys, str) else keys
        if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) for k in keys):
            raise PresetError(f"preset {path}: table '{part}' must be a non-empty list of run-config keys, got {keys!r}")
        _check_keys(path, f"table {part} entry", keys, allowed)
        out.append(tuple(keys))
    return out[0], out[1]


def load_preset(path: Path | str, *, sets: dict[str, Any] | None = None, seeds: list[int] | None = None) -> Preset:
    path = Path(path)
    try:
        spec = yaml.load(path.read_text(), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except FileNotFoundError:
        where = (f"the project's presets are in {PROJECT_DIR / 'conf'}" if (PROJECT_DIR / "conf").is_dir() else
                 "the project's presets are in the conf/ folder of its repository")
        raise PresetError(f"preset {path} does not exist; {where}") from None
    except _DuplicateKey as err:
        raise PresetError(f"preset {path}: {err}") from None
    except yaml.YAMLError as err:
        raise PresetError(f"preset {path} is not valid YAML: {err}") from None
    if not isinstance(spec, dict):
        raise PresetError(f"preset {path}: expected a mapping with 'base' and 'grid'")
    _check_keys(path, "top-level key", spec, TOP_LEVEL_KEYS)
    base = _mapping(path, "base", spec.get("base"))
    grids = spec.get("grid") or {}
    if isinstance(grids, list):
        grids = [_mapping(path, "grid", g) for g in grids]
    else:
        grids = [_mapping(path, "grid", grids)]
    variants = spec.get("variants") or [{}]
    if not isinstance(variants, list):
        raise PresetError(f"preset {path}: 'variants' must be a list of mappings, got {variants!r}")
    variants = [_mapping(path, "variants entry", v) for v in variants]
    federation = _mapping(path, "federation", spec.get("federation"))
    check_federation(path, federation)
    table_rows, table_cols = _table_keys(path, _mapping(path, "table", spec.get("table")))
    run_keys = list(RunConfig().to_flower())
    for part, mapping in [("base", base), *(("grid", g) for g in grids), *(("variants", v) for v in variants),
                          ("--set", sets or {})]:
        _check_keys(path, f"key in {part}", mapping, [*run_keys, *FEDERATION_KEYS],
                    " (run-config keys, or the federation keys)")
    combos = []
    for grid in grids:
        if seeds is not None:
            grid["seed"] = seeds
        for key, value in grid.items():
            if isinstance(value, list) and not value:
                raise PresetError(f"preset {path}: grid key {key!r} is an empty list, so the preset has no runs; "
                                  f"give it at least one value (e.g. {key}: [{RunConfig().to_flower().get(key, '...')}]) "
                                  "or remove the key to use the base value")
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        combos += [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    # a relative data-dir: from the project folder (a checkout), else (an installed package) from the preset's
    relative_to = PROJECT_DIR if (PROJECT_DIR / "pyproject.toml").is_file() else path.resolve().parent
    runs = []
    for combo in combos:
        for variant in variants:
            overrides = {**base, **combo, **variant, **(sets or {})}
            if isinstance(overrides.get("data-dir"), str) and not overrides["data-dir"].startswith(("/", "~")):
                overrides["data-dir"] = str((relative_to / overrides["data-dir"]).resolve())
            try:
                parse_run_config(split_federation(overrides)[0])
            except ConfigError as err:
                raise PresetError(f"preset {path}: run {overrides}: {err}") from None
            check_federation(path, split_federation(overrides)[1])
            runs.append(overrides)
    varying = tuple(sorted({k for r in runs for k in r if len({repr(x.get(k)) for x in runs}) > 1}))
    for r in runs:
        r.setdefault("run-name", run_name(r, varying))
    names = [r["run-name"] for r in runs]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        named = [part for part, mapping in [("base", base), *(("grid", g) for g in grids),
                                            *(("variants", v) for v in variants), ("--set", sets or {})]
                 if "run-name" in mapping]
        if named:
            raise PresetError(
                f"preset {path}: {named[0]} sets run-name = {twice!r}, so {names.count(twice)} runs would share one "
                "run folder (one run folder holds one run); leave run-name out of the preset: each run is named "
                "after its settings (dataset, method, skew, seed, and what else varies)")
        raise PresetError(f"preset {path}: two runs are identical (same settings: {twice}); remove the duplicate")
    return Preset(
        name=str(spec.get("name") or path.stem),
        path=path,
        runs=runs,
        federation={**DEFAULT_FEDERATION, **federation},
        table_rows=table_rows,
        table_cols=table_cols,
        description=str(spec.get("description") or ""),
    )


def check_data(preset: Preset) -> None:
    """Every run's dataset and partition now, so that a missing dataset or a split that
    cannot be drawn fails before any SuperLink starts (datasets and splits are cached)."""
    from fedvls_flwr.experiments.check import check_run_config

    for overrides in preset.runs:
        run, federation = split_federation(overrides)
        nodes = federation.get("num-supernodes", preset.federation.get("num-supernodes"))
        try:
            check_run_config({k: v for k, v in run.items() if k != "run-name"}, num_supernodes=nodes)
        except (ValueError, FileNotFoundError) as err:  # bad key / split, missing dataset
            raise PresetError(f"preset {preset.path}: run {overrides['run-name']}: {err}") from None
