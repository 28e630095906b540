"""The server's side of an experiment: initial model, rounds, evaluation, result files."""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from .client import model_name
from .config import RunConfig
from .models import build_model
from .node_data import dataset_for
from .results import RunWriter, summarize
from .strategy import FedVLSStrategy, RoundReport, to_numpy_dict
from .training import evaluate, resolve_device


def run_dir_for(cfg: RunConfig) -> Path:
    return cfg.resolved_output_dir() / (cfg.run_name or cfg.default_run_name())


def run_experiment(grid: Grid, cfg: RunConfig) -> Path:
    """Run every round of ``cfg`` on ``grid``; returns the run folder."""
    t_start = time.perf_counter()
    bundle = dataset_for(cfg)
    device = resolve_device("cpu" if cfg.device == "cpu" else "auto")
    torch.manual_seed(cfg.seed)
    model = build_model(model_name(cfg), tuple(bundle.input_shape), bundle.num_classes)
    run_dir = run_dir_for(cfg)
    writer = RunWriter(run_dir)
    log(INFO, "fedvls: %s on %s (%s), results in %s", cfg.method, cfg.dataset, model_name(cfg), run_dir)

    def evaluate_global(arrays: ArrayRecord) -> dict:
        model.load_state_dict(arrays.to_torch_state_dict())
        res = evaluate(
            model, bundle.test_x, bundle.test_y, bundle.num_classes, device=device,
            batch_size=cfg.eval_batch_size, mean=bundle.mean, std=bundle.std,
        )
        return {"accuracy": res.accuracy, "loss": res.loss, "per_class_accuracy": res.per_class_accuracy}

    clients: dict[int, list[int]] = {}

    def on_round_end(server_round: int, arrays: ArrayRecord, report: RoundReport) -> None:
        t_eval = time.perf_counter()
        new = {c["partition_id"]: c["class_counts"] for c in report.clients if "partition_id" in c}
        if any(pid not in clients for pid in new):
            clients.update(new)
            writer.write_clients(bundle.num_classes, clients)
        metrics = evaluate_global(arrays)
        record = {
            "round": server_round,
            **metrics,
            "train": report.train_metrics,
            "clients_sampled": report.sampled,
            "clients_accepted": report.accepted,
            "clients_failed": len(report.failed),
            "clients_rejected": len(report.rejected),
            "failures": report.failed + report.rejected,
            "seconds": report.seconds + (time.perf_counter() - t_eval),
        }
        writer.append_round(record)
        log(
            INFO, "round %d/%d: accuracy %.4f  loss %.4f  train-loss %s  clients %d/%d  %.2fs",
            server_round, cfg.num_server_rounds, metrics["accuracy"], metrics["loss"],
            f"{report.train_metrics.get('train-loss', float('nan')):.4f}",
            report.accepted, report.sampled, record["seconds"],
        )

    initial = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    writer.append_round({"round": 0, **evaluate_global(initial), "seconds": 0.0})
    strategy = FedVLSStrategy(cfg)
    final = strategy.run(grid, initial, on_round_end=on_round_end)

    writer.save_model(to_numpy_dict(final))
    summary = {
        "config": cfg.to_flower(),
        "run_dir": str(run_dir),
        "model": model_name(cfg),
        "num_train_pool": int(bundle.train_y.shape[0]),
        "num_test": int(bundle.test_y.shape[0]),
        **summarize(writer.rounds),
        "wall_seconds": time.perf_counter() - t_start,
    }
    writer.write_summary(summary)
    log(
        INFO, "fedvls: done - best accuracy %.4f (round %s), final %.4f; %s",
        summary["best_accuracy"], summary["best_round"], summary["final_accuracy"], run_dir,
    )
    return run_dir
