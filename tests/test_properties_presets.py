"""Presets in every form the loader accepts, generated as YAML text and loaded through the real
loader: ``grid`` as one mapping, a list of mappings (their union) or nothing; grid values as
lists or single scalars; ``variants`` absent, empty or a list whose entries may be empty;
``base`` absent or a mapping (a relative data-dir taken from the project folder); block or flow
YAML; the sweep's ``--seeds`` (every grid's seeds) and ``--set`` (every run) and ``--only``
(a filter). Each preset expands to exactly the runs computed here, plainly: for every grid the
product of its values, each combined with every variant, later layers overriding earlier ones
(base < grid < variant < --set); a preset whose layers produce the same run twice is refused."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.experiments.preset import PresetError, load_preset
from fedvls_flwr.experiments.sweep import select_runs
from tests.hypothesis_profiles import examples

PROJECT = Path(__file__).resolve().parents[1]
FAST = examples(80)

# keys a preset sweeps, with values the run config accepts (num-supernodes: a federation key)
AXES = {
    "method": ["fedavg", "fedvls", "fedlc", "fedntd", "fedprox"],
    "seed": [0, 1, 2, 3, 7],
    "dirichlet-beta": [0.5, 0.1, 0.05, 1.0],
    "lr": [0.1, 0.01, 0.05],
    "local-epochs": [1, 2, 5],
    "batch-size": [16, 32, 64],
    "momentum": [0.0, 0.9],
    "num-supernodes": [2, 5, 10],
}


def weighted(forms: tuple[str, ...], heavy: tuple[str, ...], weight: int = 3) -> tuple[str, ...]:
    """``forms`` with each of ``heavy`` repeated ``weight`` times: drawn that much more often."""
    return tuple(f for f in forms for _ in range(weight if f in heavy else 1))


def axis_values(key: str):
    """1 to 3 distinct values, steered to 2 or 3 (a sweep) three times in four."""
    return st.sampled_from([2, 3, 1, 2]).flatmap(
        lambda n: st.lists(st.sampled_from(AXES[key]), min_size=min(n, len(AXES[key])),
                           max_size=min(n, len(AXES[key])), unique=True))


@st.composite
def grid_mappings(draw, exclude=()):
    """A grid: key -> values; a single value sometimes written as a bare scalar. Steered to 1-3 keys
    (an empty grid one time in six)."""
    count = draw(st.sampled_from([1, 2, 0, 1, 2, 3]), label="grid keys")
    keys = draw(st.lists(st.sampled_from(sorted(set(AXES) - set(exclude))), min_size=count, max_size=count,
                         unique=True))
    grid = {}
    for key in keys:
        values = draw(axis_values(key))
        grid[key] = values[0] if len(values) == 1 and draw(st.booleans()) else values
    return grid


GRID_FORMS = ("mapping", "list", "none", "empty list", "absent")
VARIANT_FORMS = ("absent", "none", "empty", "list")


@st.composite
def presets(draw, grid_forms=GRID_FORMS, variant_forms=VARIANT_FORMS, min_grids=1):
    """A preset as a Python mapping, in any accepted form (or those named)."""
    spec: dict = {"name": "generated"}
    # the base gives a swept key a value two times in three: a key left to its default in one run
    # and written in another is the same run where the value is the default (refused as a duplicate)
    base = {"dataset": "digits", "partition": "dirichlet",
            **{k: draw(st.sampled_from(v)) for k, v in AXES.items() if draw(st.sampled_from([True, True, False]))}}
    if draw(st.booleans()):
        base["num-server-rounds"] = draw(st.integers(1, 30))
    if draw(st.booleans()):
        base["data-dir"] = draw(st.sampled_from(["~/fedvls-data", "/srv/data", "data/digits"]))
    spec["base"] = base
    form = draw(st.sampled_from(weighted(grid_forms, ("mapping", "list"))))
    if form == "mapping":
        spec["grid"] = draw(grid_mappings())
    elif form == "list":
        spec["grid"] = draw(st.lists(st.one_of(grid_mappings(), st.none()), min_size=min_grids, max_size=3))
    elif form != "absent":
        spec["grid"] = None if form == "none" else []
    variants = draw(st.sampled_from(weighted(variant_forms, ("list",))))
    if variants == "list":
        spec["variants"] = draw(st.lists(st.one_of(st.none(), st.just({}), grid_mappings().map(
            lambda g: {k: (v[0] if isinstance(v, list) else v) for k, v in g.items()})), min_size=1, max_size=3))
    elif variants != "absent":
        spec["variants"] = None if variants == "none" else []
    if draw(st.booleans()):
        spec["federation"] = {"num-supernodes": draw(st.sampled_from([3, 10]))}
    return spec


def expected_runs(spec: dict, seeds: list[int] | None, sets: dict | None) -> list[dict]:
    """The preset's runs, plainly: union over grids of the product of their values, each run
    combined with every variant; base < grid < variant < --set. No grid (absent, null, {} or
    []) is one grid point: the base."""
    grid = spec.get("grid")
    grids = grid if isinstance(grid, list) and grid else [grid]
    variants = spec.get("variants") or [{}]
    runs = []
    for g in grids:
        g = dict(g or {})
        if seeds is not None:
            g["seed"] = seeds
        keys = list(g)
        value_lists = [v if isinstance(v, list) else [v] for v in g.values()]
        for combo in itertools.product(*value_lists):
            for variant in variants:
                run = {**spec["base"], **dict(zip(keys, combo)), **(variant or {}), **(sets or {})}
                if not str(run.get("data-dir", "/")).startswith(("/", "~")):
                    run["data-dir"] = str((PROJECT / run["data-dir"]).resolve())
                runs.append(run)
    return runs


def as_text(run: dict) -> str:
    return json.dumps({k: v for k, v in run.items() if k != "run-name"}, sort_keys=True)


def in_effect(run: dict, spec: dict) -> str:
    """What a run computes with: the declared defaults under its own values, and its number of
    nodes (its own, else the preset's federation's, else 10)."""
    nodes = run.get("num-supernodes", spec.get("federation", {}).get("num-supernodes", 10))
    own = {k: v for k, v in run.items() if k not in ("run-name", "num-supernodes")}
    return json.dumps({**RunConfig().to_flower(), **own, "num-supernodes": nodes}, sort_keys=True)


def write(tmp_path: Path, spec: dict, flow: bool | None, sort_keys: bool) -> Path:
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(spec, default_flow_style=flow, sort_keys=sort_keys))
    return path


def swept_keys(spec: dict) -> list[str]:
    grid = spec.get("grid")
    layers = [*(grid if isinstance(grid, list) else [grid]), *(spec.get("variants") or [])]
    return sorted({key for layer in layers for key in (layer or {})})


SEEDS = st.lists(st.integers(0, 20), min_size=1, max_size=3, unique=True)


@FAST
@given(spec=presets(), flow=st.sampled_from([False, True, None]), sort_keys=st.booleans(), data=st.data())
def test_a_preset_expands_to_exactly_the_product_of_its_grids_and_variants(tmp_path, spec, flow, sort_keys, data):
    seeds = data.draw(st.one_of(st.none(), SEEDS), label="--seeds")
    check_expansion(tmp_path, spec, flow, sort_keys, seeds, data)


@st.composite
def grid_lists(draw):
    """A preset with 2-3 grids that differ in their method and 1-3 variants that differ in their
    batch size (so --seeds and --set decide whether runs coincide)."""
    spec = draw(presets(grid_forms=("absent",), variant_forms=("absent",)))
    methods = draw(st.lists(st.sampled_from(AXES["method"]), min_size=2, max_size=3, unique=True))
    spec["grid"] = [{**draw(grid_mappings(exclude=("method", "batch-size"))), "method": m if draw(st.booleans()) else [m]}
                    for m in methods]
    sizes = draw(st.lists(st.sampled_from(AXES["batch-size"]), min_size=1, max_size=3, unique=True))
    spec["variants"] = [{"batch-size": b} for b in sizes]
    return spec


@FAST
@given(spec=grid_lists(), seeds=SEEDS, flow=st.sampled_from([False, True, None]), data=st.data())
def test_a_list_of_grids_with_variants_and_seeds_expands_to_the_union_of_products(tmp_path, spec, seeds, flow, data):
    check_expansion(tmp_path, spec, flow, False, seeds, data)


def check_expansion(tmp_path: Path, spec: dict, flow: bool | None, sort_keys: bool, seeds: list[int] | None,
                    data) -> None:
    # --set: often a key the grid or a variant sweeps too
    keys = data.draw(st.lists(st.sampled_from([*swept_keys(spec), "lr", "weight-decay"]), max_size=2, unique=True),
                     label="--set keys")
    sets = {k: data.draw(st.sampled_from(AXES.get(k, [0.0, 1e-4])), label=k) for k in keys} or None
    path = write(tmp_path, spec, flow, sort_keys)
    runs = expected_runs(spec, seeds, sets)
    expected = [as_text(r) for r in runs]
    if len({in_effect(r, spec) for r in runs}) < len(runs):  # the same run twice (defaults included): refused
        event("the same run twice: refused")
        with pytest.raises(PresetError, match="identical"):
            load_preset(path, seeds=seeds, sets=sets)
        return
    event(f"{min(len(expected), 10)}{'+' if len(expected) >= 10 else ''} run(s)")
    preset = load_preset(path, seeds=seeds, sets=sets)
    got = [as_text(r) for r in preset.runs]
    assert len(got) == len(expected)
    assert sorted(got) == sorted(expected)
    names = [r["run-name"] for r in preset.runs]
    assert len(set(names)) == len(names)
    assert preset.federation["num-supernodes"] == spec.get("federation", {}).get("num-supernodes", 10)


@FAST
@given(spec=presets(), data=st.data())
def test_only_keeps_exactly_the_runs_with_that_setting(tmp_path, spec, data):
    path = write(tmp_path, spec, False, False)
    expected = expected_runs(spec, None, None)
    if len({in_effect(r, spec) for r in expected}) < len(expected):
        return  # refused at load (the test above)
    defaults = RunConfig().to_flower()
    key = data.draw(st.sampled_from(sorted(AXES) + ["augment", "weight-decay"]), label="key")
    value = data.draw(st.sampled_from(AXES.get(key, [defaults.get(key)])), label="value")
    kept = [as_text(r) for r in expected if r.get(key, defaults.get(key)) == value]
    preset = load_preset(path)
    if not kept:
        with pytest.raises(PresetError, match="no run"):
            select_runs(preset, {key: value})
        return
    assert sorted(as_text(r) for r in select_runs(preset, {key: value}).runs) == sorted(kept)
