"""Properties of the results table over run folders written here as the app writes them
(summary.json with the run config, rounds.jsonl one record per line; older runs without best
and final in their summary; failed and stopped runs), with hypothesis-chosen accuracies, seeds,
methods, rows and folder names: every (row, col) that has runs is one cell holding exactly
those runs; each cell's mean and sample std over its complete seeds equal a plain computation
here, in the table and in its CSV; runs that did not complete are named, not averaged; the
paired gap between two columns is, per row, the plain difference seed by seed over the seeds
both ran. And the summary the app writes: best and final over the trained rounds, the accepted
replies per machine summed over the rounds."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fedvls_flwr.app.results import summarize
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.experiments.runs import load_runs
from fedvls_flwr.experiments.tables import paired_gaps, table, write_table
from tests.hypothesis_profiles import examples

FAST = examples(30)

ROWS = ("dataset", "dirichlet-beta")
COLS = ("method",)
METHODS = ("fedavg", "fedvls", "fedlc", "fedntd")
BETAS = (0.5, 0.1, 0.05)
LABELS = {"fedavg": "FedAvg", "fedvls": "FedVLS", "fedlc": "FedLC", "fedntd": "FedNTD"}  # the table's column names
TEST_SET = 2000  # accuracies are multiples of 1 / 2000, as on a 2,000-image test set
ACCURACY = st.integers(0, TEST_SET).map(lambda k: k / TEST_SET)


@st.composite
def run_specs(draw):
    """One run: seed, accuracy per round 0..R, how it ended, whether its summary has best/final."""
    rounds = draw(st.integers(1, 4))
    return {
        "accuracies": draw(st.lists(ACCURACY, min_size=rounds + 1, max_size=rounds + 1)),
        "ended": draw(st.sampled_from(["completed"] * 4 + ["failed", "stopped"])),
        "summary_has_best": draw(st.booleans()),
    }


@st.composite
def sweeps(draw):
    """{(beta, method): {seed: run spec}}: some cells empty, seeds differing between cells."""
    betas = draw(st.lists(st.sampled_from(BETAS), min_size=1, max_size=3, unique=True))
    methods = draw(st.lists(st.sampled_from(METHODS), min_size=1, max_size=3, unique=True))
    cells = {}
    for beta in betas:
        for method in methods:
            seeds = draw(st.lists(st.integers(0, 9), max_size=4, unique=True))
            cells[(beta, method)] = {seed: draw(run_specs()) for seed in seeds}
    return cells


def write_sweep(root: Path, cells: dict, order_seed: int) -> dict[Path, tuple]:
    """The run folders (names in a drawn order, unrelated to seeds and methods); path -> (beta,
    method, seed, spec)."""
    runs = [(beta, method, seed, spec) for (beta, method), by_seed in cells.items() for seed, spec in by_seed.items()]
    names = list(range(len(runs)))
    # a drawn permutation of the folder names: find_runs's sorted order is not the seeds' order
    names.sort(key=lambda i: (i * 7919 + order_seed) % 10007)
    where = {}
    for name, (beta, method, seed, spec) in zip(names, runs):
        path = (root / "sweep" / f"run{name:03d}").resolve()
        path.mkdir(parents=True)
        accs = spec["accuracies"]
        asked = len(accs) - 1
        recorded = accs[:-1] if spec["ended"] == "stopped" else accs  # stopped one round early
        (path / "rounds.jsonl").write_text("".join(
            json.dumps({"round": r, "accuracy": a, "loss": 1.0, "seconds": 0.5}) + "\n" for r, a in enumerate(recorded)))
        config = RunConfig(method=method, dataset="mnist10k", partition="dirichlet", dirichlet_beta=beta, seed=seed,
                           num_server_rounds=asked).to_flower()
        summary = {"config": config, "status": "failed" if spec["ended"] == "failed" else "completed",
                   "rounds_completed": len(recorded) - 1}
        trained = recorded[1:]
        if spec["summary_has_best"] and trained:
            best = max(trained)
            summary.update(best_accuracy=best, best_round=1 + trained.index(best), final_accuracy=trained[-1],
                           final_round=len(trained))
        (path / "summary.json").write_text(json.dumps(summary))
        where[path] = (beta, method, seed, spec)
    return where


def plain_mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def recorded_accuracy(spec: dict) -> bool:
    """Whether the run evaluated a trained round (a run stopped after round 0 did not)."""
    return not (spec["ended"] == "stopped" and len(spec["accuracies"]) == 2)


def best_and_final(spec: dict) -> tuple[float, float]:
    """In percent, over the trained rounds 1..R (round 0 is the initial model)."""
    trained = spec["accuracies"][1:]
    return 100 * max(trained), 100 * trained[-1]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@FAST
@given(cells=sweeps(), order_seed=st.integers(0, 10006))
def test_every_cell_is_the_plain_mean_and_sample_std_of_its_complete_seeds(tmp_path_factory, cells, order_seed):
    root = tmp_path_factory.mktemp("runs")
    where = write_sweep(root, cells, order_seed)
    t = table(load_runs(root), rows=ROWS, cols=COLS)

    expected = {(("mnist10k", beta), (LABELS[method],)): (beta, method) for (beta, method), runs in cells.items()
                if any(recorded_accuracy(spec) for spec in runs.values())}
    assert set(t.cells) == set(expected)  # every (row, col) with runs, nothing else
    assert set(t.row_values) == {row for row, _ in expected} and set(t.col_values) == {col for _, col in expected}
    _, csv_path = write_table(t, tmp_path_factory.mktemp("out"))
    with csv_path.open() as handle:
        written = {(float(r["dirichlet-beta"]), r["method"]): r for r in csv.DictReader(handle)}
    assert len(written) == len(expected)

    unrecorded = sorted(str(p) for p, (*_, spec) in where.items() if not recorded_accuracy(spec))
    assert sorted(n.split(": ", 1)[1] for n in t.notes if n.startswith("left out (no accuracy")) == unrecorded
    for key, (beta, method) in expected.items():
        cell = t.cells[key]
        runs = {p: (seed, spec) for p, (b, m, seed, spec) in where.items()
                if (b, m) == (beta, method) and recorded_accuracy(spec)}
        complete = {p: run for p, run in runs.items() if run[1]["ended"] == "completed"}
        assert sorted(cell.run_paths) == sorted(complete), "the cell holds other runs than its complete ones"
        assert len(cell.excluded) == len(runs) - len(complete)
        row = written[(beta, LABELS[method])]
        assert int(row["n"]) == cell.n == len(complete)
        if not complete:
            continue
        assert sorted(cell.seeds) == sorted(seed for seed, _ in complete.values())
        best, final = zip(*(best_and_final(spec) for _, spec in complete.values()))
        (best_mean, best_std), (final_mean, final_std) = plain_mean_std(list(best)), plain_mean_std(list(final))
        assert close(cell.best_mean, best_mean) and close(cell.best_std, best_std)
        assert close(cell.final_mean, final_mean) and close(cell.final_std, final_std)
        assert close(float(row["best_mean"]), best_mean) and close(float(row["best_std"]), best_std)
        assert close(float(row["final_mean"]), final_mean) and close(float(row["final_std"]), final_std)


@FAST
@given(cells=sweeps(), order_seed=st.integers(0, 10006))
def test_a_paired_gap_is_the_plain_difference_over_the_seeds_both_columns_ran(tmp_path_factory, cells, order_seed):
    root = tmp_path_factory.mktemp("runs")
    write_sweep(root, cells, order_seed)
    t = table(load_runs(root), rows=ROWS, cols=COLS)

    methods = sorted({method for _, method in cells})
    pairs = [(a, b) for a in methods for b in methods if a != b]
    gaps = {(g.row, g.minuend, g.subtrahend): g for g in paired_gaps(t, [(LABELS[a], LABELS[b]) for a, b in pairs])}

    def complete_best(beta: float, method: str) -> dict[int, float]:
        return {seed: best_and_final(spec)[0] for seed, spec in cells.get((beta, method), {}).items()
                if spec["ended"] == "completed"}

    expected = 0
    for beta in {beta for beta, _ in cells}:
        for a, b in pairs:
            first, second = complete_best(beta, a), complete_best(beta, b)
            both = sorted(set(first) & set(second))
            gap = gaps.get((("mnist10k", beta), LABELS[a], LABELS[b]))
            if not both:
                assert gap is None
                continue
            expected += 1
            assert gap is not None
            assert sorted(gap.seeds) == both
            differences = {s: first[s] - second[s] for s in both}
            assert all(close(v, differences[s]) for s, v in zip(gap.seeds, gap.values))
            mean, std = plain_mean_std([differences[s] for s in both])
            assert close(gap.mean, mean) and close(gap.std, std)
    assert len(gaps) == expected


ROUND = st.fixed_dictionaries({
    "accuracy": st.one_of(st.none(), ACCURACY),
    "nodes": st.dictionaries(st.sampled_from(["ray:head", "ray:worker-1", "host-a", "host-b"]), st.integers(1, 8),
                             max_size=3),
})


@FAST
@given(records=st.lists(ROUND, min_size=1, max_size=8))
def test_the_summary_takes_best_and_final_over_trained_rounds_and_sums_replies_per_machine(records):
    rounds = [{"round": r, **record} for r, record in enumerate(records)]
    s = summarize(rounds)
    evaluated = [(r["round"], r["accuracy"]) for r in rounds if r["round"] >= 1 and r["accuracy"] is not None]
    if not evaluated:
        assert s["best_accuracy"] is None and s["final_accuracy"] is None
    else:
        best = max(a for _, a in evaluated)
        assert s["best_accuracy"] == best
        assert s["best_round"] == min(r for r, a in evaluated if a == best)
        assert (s["final_round"], s["final_accuracy"]) == evaluated[-1]
        totals: dict[str, int] = {}
        for r in rounds:
            for machine, count in r["nodes"].items():
                totals[machine] = totals.get(machine, 0) + count
        assert s["replies_per_node"] == totals
        assert list(s["replies_per_node"].values()) == sorted(totals.values(), reverse=True)
