"""Report tables and plots from hand-made run folders with known numbers."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedvls_flwr.experiments.report import (
    _common_title,
    load_run,
    load_runs,
    make_report,
    method_label,
    plot_accuracy,
    plot_partition,
    plot_per_class,
    table,
    write_table,
)
from fedvls_flwr.experiments.tables import format_cell

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# best / final accuracy (fractions) per method and seed, chosen by hand
BEST = {"fedavg": [0.90, 0.85, 0.80], "fedvls": [0.70, 0.75, 0.65]}
FINAL = {"fedavg": [0.88, 0.84, 0.77], "fedvls": [0.69, 0.70, 0.62]}
CLIENTS = {
    "num_classes": 4,
    "clients": [
        {"partition_id": 0, "class_counts": [50, 0, 3, 0]},
        {"partition_id": 1, "class_counts": [0, 40, 0, 0]},
        {"partition_id": 2, "class_counts": [10, 0, 30, 0]},
    ],
}


def _config(method: str, seed: int, **extra) -> dict:
    config = {
        "method": method, "dataset": "mnist10k", "partition": "dirichlet", "dirichlet-beta": 0.05,
        "shards-per-client": 2, "seed": seed, "use-dis": True, "use-logit": True, "lambda-dis": 0.1,
        "num-server-rounds": 3, "run-name": f"{method}-{seed}", "output-dir": "/tmp/x",
    }
    config.update(extra)
    return config


def _write_run(
    path: Path, config: dict, best: float, final: float, *, per_class=True, clients=CLIENTS,
    rounds: int = 3, summary_best=True,
) -> Path:
    """A run folder whose rounds peak at `best` (round 2) and end at `final`."""
    path.mkdir(parents=True)
    records = [{"round": 0, "accuracy": 0.1, "loss": 2.3, "per_class_accuracy": [0.0, 1.0, 0.0, None],
                "seconds": 0.0}]
    accs = {1: best - 0.05, 2: best, 3: final}
    for r in range(1, rounds + 1):
        record = {"round": r, "accuracy": accs[r], "loss": 1.0 / r, "train": {"train-loss": 0.5},
                  "seconds": 1.0, "clients_sampled": 3}
        if per_class:
            record["per_class_accuracy"] = [accs[r], accs[r] / 2, 0.3, None]
        records.append(record)
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"config": config, "wall_seconds": 3.0}
    if summary_best:
        summary.update(best_accuracy=best, best_round=2, final_accuracy=final, final_round=rounds)
    (path / "summary.json").write_text(json.dumps(summary))
    if clients is not None:
        (path / "clients.json").write_text(json.dumps(clients))
    return path


@pytest.fixture()
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for method in BEST:
        for seed in range(3):
            _write_run(root / "sweep" / f"{method}-s{seed}", _config(method, seed),
                       BEST[method][seed], FINAL[method][seed])
    # an incomplete run: rounds but no summary.json
    incomplete = root / "sweep" / "fedavg-crashed"
    incomplete.mkdir(parents=True)
    (incomplete / "rounds.jsonl").write_text(json.dumps({"round": 0, "accuracy": 0.1}) + "\n")
    return root


def _is_png(path: Path) -> bool:
    data = Path(path).read_bytes()
    return len(data) > 1000 and data[:8] == PNG_SIGNATURE


def _sample_std(values):
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# ---------------------------------------------------------------------------------------
def test_load_runs_skips_incomplete(runs_root: Path):
    runs = load_runs(runs_root)
    assert len(runs) == 6
    assert all(r.path.name != "fedavg-crashed" for r in runs)
    run = load_run(runs_root / "sweep" / "fedavg-s1")
    assert run.config["seed"] == 1 and run.clients["num_classes"] == 4
    assert len(run.rounds) == 4 and run.rounds[0]["round"] == 0
    with pytest.raises(FileNotFoundError):
        load_run(runs_root / "sweep" / "fedavg-crashed")
    # a list of run folders works too
    assert len(load_runs([runs_root / "sweep" / "fedavg-s0", runs_root / "sweep" / "fedvls-s2"])) == 2


def test_table_means_and_stds(runs_root: Path):
    t = table(load_runs(runs_root))
    assert t.row_values == [("mnist10k", "dirichlet", 0.05)]
    assert t.col_values == [("FedAvg",), ("FedVLS",)]
    # hand-computed: FedAvg best 90/85/80 -> 85 ± 5; final 88/84/77 -> 83 ± 5.5678
    avg = t.cell(("mnist10k", "dirichlet", 0.05), ("FedAvg",))
    assert avg.n == 3 and sorted(avg.seeds) == [0, 1, 2]
    assert avg.best_mean == pytest.approx(85.0)
    assert avg.best_std == pytest.approx(5.0)
    assert avg.final_mean == pytest.approx(83.0)
    assert avg.final_std == pytest.approx(_sample_std([88, 84, 77]))
    assert avg.final_std == pytest.approx(5.567764, abs=1e-5)
    vls = t.cell(("mnist10k", "dirichlet", 0.05), ("FedVLS",))
    assert vls.best_mean == pytest.approx(70.0) and vls.best_std == pytest.approx(5.0)
    assert vls.final_mean == pytest.approx(67.0) and vls.final_std == pytest.approx(_sample_std([69, 70, 62]))
    assert t.notes == []


def test_table_single_seed_std_zero(tmp_path: Path):
    _write_run(tmp_path / "a", _config("fedntd", 4), 0.8125, 0.8)
    t = table(load_runs(tmp_path))
    cell = t.cell(("mnist10k", "dirichlet", 0.05), ("FedNTD",))
    assert cell.n == 1 and cell.best_mean == pytest.approx(81.25) and cell.best_std == 0.0
    assert cell.final_std == 0.0


def test_a_seed_run_again_on_another_engine_is_counted_once_and_named(tmp_path: Path):
    """The same experiment by both engines (which compute the same) and by an older version (no
    engine recorded): one seed in the cell, the first run in path order, the others named in a note
    with their engines - not "3 seeds per cell, 60.83 ± 0.00"."""
    for name, engine in (("a-inprocess", "inprocess"), ("b-simulation", "simulation"), ("c-old", None)):
        run = _write_run(tmp_path / name, _config("fedavg", 0), 0.6083, 0.6083)
        if engine is not None:
            summary = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**summary, "engine": engine}))
    _write_run(tmp_path / "d-seed1", _config("fedavg", 1), 0.7, 0.7)
    t = table(load_runs(tmp_path))
    cell = t.cell(("mnist10k", "dirichlet", 0.05), ("FedAvg",))
    assert cell.n == 2 and cell.seeds == [0, 1] and cell.run_paths == [tmp_path / "a-inprocess", tmp_path / "d-seed1"]
    assert cell.best_mean == pytest.approx((60.83 + 70) / 2)
    assert t.notes == [f"[mnist10k, dirichlet, 0.05, FedAvg] seed 0 has 3 runs: counted once, {tmp_path / 'a-inprocess'} "
                       f"(inprocess); left out: {tmp_path / 'b-simulation'} (simulation); {tmp_path / 'c-old'} "
                       "(engine not recorded)"]
    notes: list[str] = []
    make_report(tmp_path, tmp_path / "report", notes=notes)  # what `fedvls report` says as a warning
    assert notes == t.notes
    assert "2 seeds per cell" in (tmp_path / "report" / "results.md").read_text()


def test_best_and_final_from_rounds_when_summary_lacks_them(tmp_path: Path):
    _write_run(tmp_path / "old", {"method": "fedavg", "seed": 0}, 0.6, 0.55, summary_best=False,
               per_class=False, clients=None)
    run = load_runs(tmp_path)[0]
    assert run.best_accuracy == pytest.approx(60.0) and run.final_accuracy == pytest.approx(55.0)
    t = table([run])
    assert t.row_values == [(None, None, None)]
    assert t.cell((None, None, None), ("FedAvg",)).best_mean == pytest.approx(60.0)


def test_written_table_round_trips(runs_root: Path, tmp_path: Path):
    t = table(load_runs(runs_root))
    md, csv_path = write_table(t, tmp_path / "out")
    text = md.read_text()
    assert "85.00 ± 5.00 (83.00 ± 5.57)" in text
    assert "70.00 ± 5.00 (67.00 ± 4.36)" in text
    assert "best over rounds (final round)" in text and "3 seeds per cell" in text
    assert "| FedAvg | FedVLS |" in text
    with csv_path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    by_method = {r["method"]: r for r in rows}
    for label in ("FedAvg", "FedVLS"):
        cell = t.cell(t.row_values[0], (label,))
        row = by_method[label]
        assert row["dataset"] == "mnist10k" and row["partition"] == "dirichlet"
        assert float(row["dirichlet-beta"]) == 0.05
        assert int(row["n"]) == 3
        assert float(row["best_mean"]) == cell.best_mean and float(row["best_std"]) == cell.best_std
        assert float(row["final_mean"]) == cell.final_mean and float(row["final_std"]) == cell.final_std
        assert sorted(int(s) for s in row["seeds"].split(";")) == [0, 1, 2]
        assert [float(v) for v in row["best_per_seed"].split(";")] == cell.best_values


def test_ablation_variants_form_separate_groups(tmp_path: Path):
    variants = {
        "full": {}, "nodis": {"use-dis": False}, "nologit": {"use-logit": False},
        "none": {"use-dis": False, "use-logit": False},
    }
    for i, (name, extra) in enumerate(variants.items()):
        for seed in range(2):
            _write_run(tmp_path / f"{name}-{seed}", _config("fedvls", seed, **extra), 0.6 + 0.05 * i, 0.5)
    t = table(load_runs(tmp_path))
    labels = [c[0] for c in t.col_values]
    assert labels == ["FedVLS", "FedVLS −L_logit", "FedVLS −L_dis", "FedVLS −L_dis −L_logit"]
    row = t.row_values[0]
    assert t.cell(row, ("FedVLS −L_dis",)).best_mean == pytest.approx(65.0)
    assert t.cell(row, ("FedVLS −L_dis −L_logit",)).best_mean == pytest.approx(75.0)
    assert all(t.cell(row, (label,)).n == 2 for label in labels)
    # the flags do not split methods they do not apply to
    assert method_label({"method": "fedavg", "use-dis": False}) == "FedAvg"
    assert method_label({"method": "fedvls-paper"}) == "FedVLS (paper form)"
    assert method_label({"method": "fedlc", "fedlc-form": "paper"}) == "FedLC (paper form)"


def test_table_notes_mixed_settings_and_unused_partition_keys(tmp_path: Path):
    _write_run(tmp_path / "a", _config("fedavg", 0), 0.8, 0.8)
    _write_run(tmp_path / "b", _config("fedavg", 1, **{"num-server-rounds": 50}), 0.9, 0.9)
    _write_run(tmp_path / "c", _config("fedavg", 0, partition="shards"), 0.5, 0.5)
    t = table(load_runs(tmp_path), include_incomplete=True)  # run b has 3 of its 50 rounds
    assert ("mnist10k", "shards", None) in t.row_values  # beta of a shards run is not shown
    assert any("num-server-rounds" in note for note in t.notes)
    assert not any("lambda-dis" in note for note in t.notes)


def test_synthetic_runs_are_labelled_by_alpha_beta_not_by_an_unused_dirichlet_default(tmp_path: Path):
    synthetic = {"dataset": "synthetic", "synthetic-alpha": 0.5, "synthetic-beta": 0.5}
    _write_run(tmp_path / "s", _config("fedavg", 0, **synthetic), 0.7, 0.7)
    _write_run(tmp_path / "m", _config("fedavg", 0, **{"synthetic-alpha": 1.0}), 0.9, 0.9)
    runs = load_runs(tmp_path)
    t = table(runs, rows=("dataset", "partition", "dirichlet-beta", "synthetic-alpha"))
    assert ("synthetic", "natural", None, 0.5) in t.row_values
    assert ("mnist10k", "dirichlet", 0.05, None) in t.row_values  # alpha of mnist10k is not shown
    synthetic_run = next(r for r in runs if r.config["dataset"] == "synthetic")
    assert _common_title([synthetic_run]) == "synthetic · Synthetic(α=0.5, β=0.5)"


def test_plots_are_pngs(runs_root: Path, tmp_path: Path):
    runs = load_runs(runs_root)
    out = tmp_path / "plots"
    assert _is_png(plot_accuracy(runs, out / "acc.png"))
    assert _is_png(plot_partition(CLIENTS, out / "part.png"))
    assert _is_png(plot_per_class(runs, out / "pc.png", clients=CLIENTS))
    assert _is_png(plot_per_class(runs, out / "pc-noclients.png"))


def test_plots_single_seed_missing_per_class_and_clients(tmp_path: Path):
    _write_run(tmp_path / "runs" / "one", _config("fedvls", 0), 0.7, 0.6, per_class=False, clients=None)
    runs = load_runs(tmp_path / "runs")
    out = tmp_path / "plots"
    assert _is_png(plot_accuracy(runs, out / "acc.png"))
    assert _is_png(plot_per_class(runs, out / "pc.png"))  # only round 0 has per-class values
    # no per-class values at all, no rounds at all: a PNG that says so
    run = runs[0]
    run.rounds = [{k: v for k, v in r.items() if k != "per_class_accuracy"} for r in run.rounds]
    assert _is_png(plot_per_class([run], out / "pc-none.png"))
    run.rounds = []
    assert _is_png(plot_accuracy([run], out / "acc-none.png"))
    assert _is_png(plot_partition({}, out / "part-none.png"))


def test_plots_tolerate_nan_and_large_grids(tmp_path: Path):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(30, 100)) * (rng.random((30, 100)) < 0.2)
    big = {"clients": [{"partition_id": i, "class_counts": c.tolist()} for i, c in enumerate(counts)]}
    assert _is_png(plot_partition(big, tmp_path / "big.png"))
    path = _write_run(tmp_path / "runs" / "r", _config("fedavg", 0), 0.5, 0.4, clients=None)
    records = [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]
    records[-1]["per_class_accuracy"] = [None, float("nan"), 0.5, None]  # json.dumps writes NaN
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = load_runs(tmp_path / "runs")[0]
    assert np.isnan(run.final_per_class()[[0, 1, 3]]).all()
    assert _is_png(plot_per_class([run], tmp_path / "pc.png", clients=CLIENTS))


def test_make_report(runs_root: Path, tmp_path: Path):
    out = tmp_path / "report"
    written = make_report(runs_root, out)
    assert written["table_md"].exists() and written["table_csv"].exists()
    pngs = [p for name, p in written.items() if name.startswith(("accuracy", "per-class", "partition"))]
    assert any(name.startswith("accuracy") for name in written)
    assert any(name.startswith("per-class") for name in written)
    # all runs share one partition here: it is drawn once per seed at most, deduplicated
    assert sum(name.startswith("partition") for name in written) == 1
    assert all(_is_png(p) for p in pngs)
    # default output folder
    assert make_report(runs_root)["table_md"].parent == runs_root / "report"


def test_diagnostics_table_averages_the_last_rounds_then_the_seeds(tmp_path):
    """Drift diversity and the local-update view: mean over the last LAST_ROUNDS rounds of
    each run (12 rounds here: rounds 1-2 are left out), then over seeds."""
    from fedvls_flwr.experiments.diagnostics_table import LAST_ROUNDS, write_diagnostics

    assert LAST_ROUNDS == 10
    runs_dir = tmp_path / "runs"
    for seed, (drift, vacant_local) in enumerate([(2.0, 0.10), (4.0, 0.30)]):
        run = _write_run(runs_dir / f"fedvls-{seed}", _config("fedvls", seed, **{"local-eval": True}), 0.7, 0.6)
        records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()][:1]
        for r in range(1, 13):
            early = r <= 2  # outside the last 10 rounds: must not count
            records.append({
                "round": r, "accuracy": 0.5, "drift_diversity": 100.0 if early else drift,
                "local_update": {
                    "vacant": {"local": 0.9 if early else vacant_local, "global": 0.5, "clients": 2},
                    "minority": {"local": 0.6, "global": 0.5, "clients": 1},
                    "majority": {"local": 0.8, "global": None, "clients": 2},
                },
            })
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    runs = load_runs(runs_dir)
    md, csv_path = write_diagnostics(table(runs), runs, tmp_path / "report")
    row = next(csv.DictReader(csv_path.open()))
    assert float(row["drift_diversity_mean"]) == pytest.approx(3.0)
    assert float(row["drift_diversity_std"]) == pytest.approx(math.sqrt(2.0))
    assert float(row["vacant_local_mean"]) == pytest.approx(20.0)
    assert float(row["vacant_global_mean"]) == pytest.approx(50.0)
    assert float(row["minority_local_mean"]) == pytest.approx(60.0)
    assert row["majority_global_mean"] == ""  # never recorded: empty, not a number
    assert "| mnist10k | dirichlet | 0.05 | FedVLS | 2 | 3.00 ± 1.41 | 20.00 ± 14.14 |" in md.read_text()


def test_no_diagnostics_table_without_drift_records(tmp_path):
    from fedvls_flwr.experiments.diagnostics_table import write_diagnostics

    _write_run(tmp_path / "runs" / "a", _config("fedavg", 0), 0.9, 0.8)
    runs = load_runs(tmp_path / "runs")
    assert write_diagnostics(table(runs), runs, tmp_path / "report") is None


def test_stages_table_gives_each_stages_rounds_seconds_and_accuracy(tmp_path):
    """FedConcat's runs: stage 1 (2 rounds, nothing to test), stage 2 (3 rounds); per stage the
    rounds, the summed seconds and the accuracy at the stage's end and at its best, then mean ±
    sample std over the seeds; a run without stages (FedAvg's cell) gets no line."""
    runs_dir = tmp_path / "runs"
    for seed, (seconds, end) in enumerate([(1.0, 0.80), (3.0, 0.90)]):
        run = _write_run(runs_dir / f"concat-{seed}", _config("fedavg", seed, protocol="fedconcat"), 0.9, end)
        records = [{"round": 0, "stage": 1, "accuracy": None, "seconds": 0.0}]
        records += [{"round": r, "stage": 1, "accuracy": None, "seconds": seconds} for r in (1, 2)]
        records += [{"round": r, "stage": 2, "accuracy": a, "seconds": 2 * seconds}
                    for r, a in ((3, 0.5), (4, end + 0.05), (5, end))]
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _write_run(runs_dir / "fedavg-0", _config("fedavg", 0), 0.9, 0.8)
    runs = load_runs(runs_dir)
    written = make_report(runs_dir, tmp_path / "report", rows=("dataset",), cols=("method",))
    rows = list(csv.DictReader(written["stages_csv"].open()))
    assert [(r["stage"], r["n"]) for r in rows] == [("1", "2"), ("2", "2")]
    one, two = rows
    assert float(one["rounds_mean"]) == 2 and float(one["rounds_std"]) == 0
    assert float(one["seconds_mean"]) == pytest.approx(4.0) and float(one["seconds_std"]) == pytest.approx(math.sqrt(8))
    assert one["end_accuracy_mean"] == "" and one["best_accuracy_mean"] == ""  # K cluster models: nothing tested
    assert float(two["rounds_mean"]) == 3 and float(two["seconds_mean"]) == pytest.approx(12.0)
    assert float(two["seconds_std"]) == pytest.approx(_sample_std([6.0, 18.0]))
    assert float(two["end_accuracy_mean"]) == pytest.approx(85.0)
    assert float(two["end_accuracy_std"]) == pytest.approx(_sample_std([80.0, 90.0]))
    assert float(two["best_accuracy_mean"]) == pytest.approx(90.0)
    text = written["stages_md"].read_text()
    assert "| mnist10k | FedConcat K=2 | 1 | 2 | 2 | 4.0 ± 2.8 | n/a | n/a |" in text
    assert "| mnist10k | FedConcat K=2 | 2 | 2 | 3 | 12.0 ± 8.5 | 85.00 ± 7.07 | 90.00 ± 7.07 |" in text
    assert "| FedAvg |" not in text  # FedAvg's run has no stages
    assert len(runs) == 3


def test_no_stages_table_without_staged_runs(tmp_path):
    _write_run(tmp_path / "runs" / "a", _config("fedavg", 0), 0.9, 0.8)
    assert "stages_md" not in make_report(tmp_path / "runs", tmp_path / "report")


def test_partial_partition_of_a_stopped_run_is_not_drawn_again(tmp_path):
    """A run that stopped early recorded only the clients it heard from: the whole
    partition of another run of the same seed is drawn, the part is not."""
    part = {"num_classes": 4, "clients": CLIENTS["clients"][:2]}
    _write_run(tmp_path / "runs" / "whole", _config("fedavg", 0), 0.9, 0.8)
    _write_run(tmp_path / "runs" / "part", _config("fedvls", 0), 0.5, 0.4, clients=part)
    other = {"num_classes": 4, "clients": [{"partition_id": 0, "class_counts": [1, 2, 3, 4]}]}
    _write_run(tmp_path / "runs" / "other", _config("fedvls-paper", 0), 0.1, 0.1, clients=other)
    written = make_report(tmp_path / "runs", tmp_path / "report")
    partitions = sorted(name for name in written if name.startswith("partition"))
    assert partitions == ["partition-mnist10k-dirichlet-0.05-s0", "partition-mnist10k-dirichlet-0.05-s0-2"]


def test_a_methods_own_setting_labels_only_that_methods_columns(tmp_path):
    """cols [method, fedlc-tau]: FedLC's columns carry its tau; FedAvg's column is not
    labelled with a tau it never used (its config still holds the default)."""
    from fedvls_flwr.experiments.runs import config_value

    root = tmp_path / "runs"
    _write_run(root / "avg", _config("fedavg", 0, **{"fedlc-tau": 0.5}), 0.9, 0.9)
    _write_run(root / "lc5", _config("fedlc", 0, **{"fedlc-tau": 0.5}), 0.8, 0.8)
    _write_run(root / "lc1", _config("fedlc", 0, **{"fedlc-tau": 0.1}), 0.7, 0.7)
    assert config_value(_config("fedavg", 0, **{"fedlc-tau": 0.5}), "fedlc-tau") is None
    assert config_value(_config("fedlc", 0, **{"fedlc-tau": 0.5}), "fedlc-tau") == 0.5
    md = (root / "report" / "results.md")
    make_report(root, out_dir=root / "report", rows=("dataset",), cols=("method", "fedlc-tau"))
    header = next(line for line in md.read_text().splitlines() if line.startswith("| dataset"))
    assert header == "| dataset | FedAvg | FedLC, 0.1 | FedLC, 0.5 |"


def test_failed_and_stopped_runs_stay_out_of_the_means_and_are_named(tmp_path):
    """A diverging method must not look better because its failed seed is averaged in."""
    root = tmp_path / "runs"
    _write_run(root / "ok0", _config("fedvls", 0), 0.80, 0.78)
    _write_run(root / "ok1", _config("fedvls", 1), 0.70, 0.70)
    failed = _write_run(root / "bad2", _config("fedvls", 2), 0.95, 0.10, rounds=2)
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    _write_run(root / "short3", _config("fedvls", 3), 0.99, 0.99, rounds=2)  # asked 3 rounds
    runs = load_runs(root)
    t = table(runs, rows=("dataset",), cols=("method",))
    (cell,) = t.cells.values()
    assert cell.n == 2 and cell.best_mean == pytest.approx(75.0)
    assert cell.excluded == ["seed 2: failed in round 3", "seed 3: stopped after round 2 of 3"]
    md = make_report(root, out_dir=tmp_path / "rep", rows=("dataset",), cols=("method",))["table_md"].read_text()
    assert "75.00 ± 7.07 (74.00 ± 5.66) [n=2 of 4, seed 2: failed in round 3; seed 3: stopped after round 2 of 3]" in md
    everything = table(runs, rows=("dataset",), cols=("method",), include_incomplete=True)
    assert next(iter(everything.cells.values())).n == 4


def test_dropped_client_updates_are_shown_in_the_cell(tmp_path):
    root = tmp_path / "runs"
    run = _write_run(root / "a", _config("fedavg", 0), 0.8, 0.8)
    lines = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    for r in lines[1:]:
        r.update(clients_accepted=3, clients_failed=1, clients_rejected=0)
    lines[2]["clients_failed"] = 0  # rounds drop 1/4, 0/3, 1/4
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (cell,) = table(load_runs(root), rows=("dataset",), cols=("method",)).cells.values()
    assert cell.dropped_share == pytest.approx((0.25 + 0 + 0.25) / 3)
    assert "[17% of updates dropped]" in format_cell(cell)


def test_paired_gap_against_pool_size(tmp_path):
    """FedVLS minus FedAvg seed by seed, per training-pool size; 0 (the whole pool) is
    shown as the pool's real size."""
    root = tmp_path / "runs"
    acc = {(3000, "fedavg"): [0.70, 0.60], (3000, "fedvls"): [0.65, 0.62],
           (0, "fedavg"): [0.80, 0.82], (0, "fedvls"): [0.78, 0.86]}
    for (size, method), values in acc.items():
        for seed, best in enumerate(values):
            run = _write_run(root / f"{method}-{size}-{seed}", _config(method, seed, **{"train-pool-size": size}), best, best)
            summary = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**summary, "num_train_pool": 60000 if size == 0 else size}))
    written = make_report(root, out_dir=tmp_path / "rep", rows=("dataset", "train-pool-size"), cols=("method",),
                          gaps=[("FedVLS", "FedAvg")])
    md = written["gaps_md"].read_text()
    assert "| mnist10k | 3000 | FedVLS − FedAvg | -1.50 ± 4.95 | s0: -5.00, s1: +2.00 |" in md
    assert "| mnist10k | 60000 | FedVLS − FedAvg | +1.00 ± 4.24 | s0: -2.00, s1: +4.00 |" in md
    assert _is_png(written["gaps_plot"])


def test_generated_federations_of_different_sizes_are_not_runs_of_different_pools(tmp_path):
    """Synthetic(alpha, beta) draws its clients' sizes with the seed: three seeds are one cell,
    not three pool sizes (the report said "runs differ in: train-pool-size")."""
    root = tmp_path / "runs"
    for seed, pool in enumerate((28497, 17915, 26884)):
        config = {**_config("fedavg", seed, **{"train-pool-size": 0}), "dataset": "synthetic"}
        run = _write_run(root / f"s{seed}", config, 0.6 + seed / 100, 0.6)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "num_train_pool": pool}))
    report = table(load_runs(root), rows=("dataset",), cols=("method",))
    assert not [n for n in report.notes if "differ in" in n]
    (cell,) = report.cells.values()
    assert len(cell.best_values) == 3


# ---- a report from nothing says so ----------------------------------------------------
def test_report_of_a_path_that_does_not_exist_writes_nothing_and_fails(tmp_path, capsys):
    """Not exit 0 and an empty results.csv in a report/ folder created under the path."""
    from fedvls_flwr.experiments.report import main

    missing = tmp_path / "nope"
    assert main([str(missing)]) == 2
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert not missing.exists()


def test_report_of_an_empty_folder_fails(tmp_path, capsys):
    from fedvls_flwr.experiments.report import main

    assert main([str(tmp_path)]) == 2
    assert f"no run folder (one with summary.json) found in {tmp_path}; nothing written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_report_of_runs_still_going_or_failed_names_each_and_why(tmp_path, capsys):
    from fedvls_flwr.experiments.report import main

    going = tmp_path / "going"
    going.mkdir()
    (going / "rounds.jsonl").write_text(json.dumps({"round": 0, "accuracy": 0.1}) + "\n")
    failed = _write_run(tmp_path / "failed", _config("fedavg", 0), 0.5, 0.4)
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no complete run folder" in err and "nothing written" in err
    assert f"left out {going}: no summary.json - a run still going" in err
    assert f"left out {failed}: failed in round 4 (--include-incomplete tabulates it)" in err
    assert not (tmp_path / "report").exists()
    # with a complete run beside them, the report is written and the others are named
    _write_run(tmp_path / "ok", _config("fedavg", 1), 0.6, 0.5)
    assert main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"left out {going}: no summary.json" in err and f"left out {failed}: failed" in err
    assert (tmp_path / "report" / "results.csv").is_file()


@pytest.mark.parametrize("args, message", [
    (["--rows", "datset"], "--rows: unknown key 'datset' (did you mean 'dataset'?); give method, label or run-config keys"),
    (["--cols", "method,seeed"], "--cols: unknown key 'seeed' (did you mean 'seed'?)"),
    (["--gap", "FedVLS:FedAvgg"], "--gap FedVLS:FedAvgg: the table has no column 'FedAvgg' (did you mean 'FedAvg'?); "
                                  "its columns (method): FedAvg, FedVLS"),
    (["--gap", "FedVLS"], "--gap 'FedVLS': expected two column labels A:B"),
])
def test_a_report_option_naming_no_key_or_column_is_refused_and_writes_nothing(runs_root, tmp_path, capsys, args,
                                                                                 message):
    """An unknown key would group every run under '-', an unknown gap label skip the gaps table."""
    from fedvls_flwr.experiments.report import main

    out = tmp_path / "report"
    assert main([str(runs_root), "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("damage", ["last line lost", "file missing"])
def test_a_complete_run_whose_rounds_file_lost_lines_is_tabulated_and_named(tmp_path, capsys, damage):
    """summary.json says every round was completed: the run is complete, not stopped; the
    report says which rounds its rounds.jsonl lacks."""
    from fedvls_flwr.experiments.report import main

    run = _write_run(tmp_path / "runs" / "a", _config("fedavg", 0), 0.8, 0.7)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "completed", "rounds_completed": 3}))
    rounds = run / "rounds.jsonl"
    if damage == "file missing":
        rounds.unlink()
    else:
        rounds.write_text("".join(rounds.read_text().splitlines(keepends=True)[:-1]))
    assert load_run(run).incomplete() is None
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    what = "rounds.jsonl is missing" if damage == "file missing" else "rounds.jsonl ends with round 2"
    assert f"warning: {run}: {what}, but summary.json says all 3 rounds were completed" in err
    assert "stop" not in err and "left out" not in err
    assert "80.00 (70.00)" in (tmp_path / "report" / "results.md").read_text()


def test_report_help_says_which_keys_rows_and_cols_take(capsys):
    from fedvls_flwr.experiments.report import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "keys that make the table's rows (default: dataset,partition,dirichlet-beta); comma-separated: method" in text
    assert "or any run-config key" in text and "keys that make its columns (default: method)" in text


def test_runs_differing_only_in_a_setting_they_do_not_read_are_not_noted_as_mixed(tmp_path: Path):
    """FedGF runs with a fixed c recorded fedgf-threshold 1.5 (its old default) or 0 (unset):
    neither reads it, so a cell holding both is not 'mixed'; a fixed c that differs is."""
    fedgf = {"local-optimizer": "fedgf", "fedgf-c-mode": "fixed", "fedgf-c": 0.3}
    _write_run(tmp_path / "a", _config("fedavg", 0, **fedgf, **{"fedgf-threshold": 1.5}), 0.8, 0.8)
    _write_run(tmp_path / "b", _config("fedavg", 1, **fedgf, **{"fedgf-threshold": 0.0}), 0.9, 0.9)
    assert not any("runs differ" in note for note in table(load_runs(tmp_path)).notes)
    _write_run(tmp_path / "c", _config("fedavg", 2, **{**fedgf, "fedgf-c": 0.5}), 0.9, 0.9)
    assert any("runs differ in: fedgf-c" in note and "fedgf-threshold" not in note
               for note in table(load_runs(tmp_path)).notes)


def test_a_report_written_again_leaves_no_file_of_the_last_one_it_no_longer_writes(tmp_path):
    """A row the runs no longer have: its plots go with it (they would read as this report's);
    a file of the user's in the report folder stays."""
    root = tmp_path / "runs"
    for beta, name in ((0.5, "a"), (0.1, "b")):
        _write_run(root / name, _config("fedavg", 0, **{"dirichlet-beta": beta}), 0.8, 0.7)
    out = tmp_path / "report"
    first = make_report(root, out)
    (out / "notes.txt").write_text("mine")
    plots_of_b = [p for k, p in first.items() if "0.1" in k]
    assert plots_of_b and all(p.is_file() for p in plots_of_b)
    import shutil

    shutil.rmtree(root / "b")
    second = make_report(root, out)
    assert not any(p.exists() for p in plots_of_b)
    from fedvls_flwr.experiments.report import MANIFEST

    assert {p for p in out.iterdir()} == set(second.values()) | {out / "notes.txt", out / MANIFEST}


def test_a_report_removes_no_file_of_its_names_that_no_manifest_says_a_report_wrote(runs_root, tmp_path):
    """A folder the user gives to --out may hold files of a report's names that no report wrote
    (their own gaps table, a sketch named accuracy-*.png) or an earlier version's report (no
    manifest): none is removed, and the notes name them (they would read as part of the report)."""
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"gaps.md": "my gaps", "diagnostics.csv": "my numbers", "accuracy-my-sketch.png": "not a png",
            "partition-whiteboard.png": "photo", "notes.txt": "mine"}
    for name, text in mine.items():
        (out / name).write_text(text)
    notes: list[str] = []
    written = make_report(runs_root, out, notes=notes)
    assert not {out / name for name in mine} & set(written.values())
    assert {name: (out / name).read_text() for name in mine} == mine
    assert [note for note in notes if note.startswith(str(out))] == [
        f"{out} also holds accuracy-my-sketch.png, diagnostics.csv, gaps.md, partition-whiteboard.png, which this "
        "report did not write (no report's manifest lists them: your own files, or an earlier version's report); "
        "they are left as they are: remove the ones that are stale"]
    make_report(runs_root, out)  # written again: the user's files are still not the report's
    assert {name: (out / name).read_text() for name in mine} == mine


def test_a_reports_manifest_lists_what_it_wrote_and_only_its_files_are_removed(runs_root, tmp_path):
    """The manifest names the files written (and the preset); a manifest entry that is not a
    report file's plain name (another folder's file, a hidden or foreign name) is never removed."""
    from fedvls_flwr.experiments.report import MANIFEST, read_manifest

    out = tmp_path / "report"
    written = make_report(runs_root, out, preset="table 1", preset_file="/presets/t1.yaml")
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest == {"preset": "table 1", "preset_file": "/presets/t1.yaml",
                        "files": sorted(p.name for p in written.values())}
    assert read_manifest(out) == manifest and read_manifest(tmp_path) is None
    outside = tmp_path / "results.md"
    for path in (outside, out / "notes.txt", out / ".hidden.png", out / "accuracy-gone.png"):
        path.write_text("x")
    manifest["files"] += ["../results.md", "notes.txt", ".hidden.png", "accuracy-gone.png", str(outside)]
    (out / MANIFEST).write_text(json.dumps(manifest))
    again = make_report(runs_root, out)
    assert not (out / "accuracy-gone.png").exists()  # a report wrote it, this one did not
    assert outside.exists() and (out / "notes.txt").exists() and (out / ".hidden.png").exists()
    assert set(out.iterdir()) == set(again.values()) | {out / "notes.txt", out / ".hidden.png", out / MANIFEST}
    assert read_manifest(out) == {"preset": None, "preset_file": None, "files": sorted(p.name for p in again.values())}


def test_a_report_stopped_midway_leaves_a_manifest_that_claims_only_what_it_wrote(tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) between two plots: the manifest, written before the first file and
    after each, says a report was being written and lists the files it wrote. The next report
    removes the ones it does not write again, instead of naming them as the user's in every later
    note; the user's files stay - one put there before the report, and one after it stopped."""
    from fedvls_flwr.experiments import report as report_module
    from fedvls_flwr.experiments.report import MANIFEST, read_manifest

    root = tmp_path / "runs"
    for beta, name in ((0.5, "a"), (0.1, "b")):
        _write_run(root / name, _config("fedavg", 0, **{"dirichlet-beta": beta}), 0.8, 0.7)
    out = tmp_path / "report"
    out.mkdir()
    (out / "accuracy-my-sketch.png").write_text("mine")
    real_plot, calls = report_module.plot_accuracy, []

    def stopped_at_the_second_plot(group, path):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_plot(group, path)

    monkeypatch.setattr(report_module, "plot_accuracy", stopped_at_the_second_plot)
    with pytest.raises(KeyboardInterrupt):
        make_report(root, out, preset="t1")
    first_plot = calls[0]
    assert first_plot.is_file() and (out / "results.md").is_file()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["writing"] is True and manifest["preset"] == "t1"
    assert set(manifest["files"]) >= {first_plot.name, "results.md", "results.csv"}
    assert "accuracy-my-sketch.png" not in manifest["files"] and calls[1].name not in manifest["files"]
    assert read_manifest(out)["files"] == manifest["files"]
    monkeypatch.undo()
    (out / "per-class-my-notes.png").write_text("mine too")  # put there after the report stopped

    import shutil

    shutil.rmtree(root / {"0.5": "a", "0.1": "b"}[next(b for b in ("0.5", "0.1") if b in first_plot.name)])
    notes: list[str] = []
    again = make_report(root, out, notes=notes)
    assert not first_plot.exists()  # the stopped report's plot of a row the runs no longer have
    mine = {out / "accuracy-my-sketch.png": "mine", out / "per-class-my-notes.png": "mine too"}
    assert {path: path.read_text() for path in mine} == mine
    assert set(out.iterdir()) == set(again.values()) | set(mine) | {out / MANIFEST}
    assert [n for n in notes if n.startswith(str(out))] == [
        f"{out} also holds accuracy-my-sketch.png, per-class-my-notes.png, which this report did not write (no "
        "report's manifest lists them: your own files, or an earlier version's report); they are left as they are: "
        "remove the ones that are stale"]
    assert "writing" not in json.loads((out / MANIFEST).read_text())


def test_a_report_folder_a_file_stands_in_the_way_of_is_refused_in_one_line(runs_root, tmp_path, capsys):
    from fedvls_flwr.experiments.report import main

    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        assert main([str(runs_root), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"error: the report folder {out} cannot be made: {tmp_path / 'afile'} is a "
                                           "file; give --out a folder (a new one, or one that holds a report)\n")
    assert (tmp_path / "afile").read_text() == "x"
