"""The client's side of a round: received weights + config in, trained weights + metrics out."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from .config import parse_run_config
from .models import build_model, default_model
from .node_data import dataset_for, node_client_data
from .strategy import ARRAYS_KEY, CONFIG_KEY, METRICS_KEY
from .training import evaluate, resolve_device, train_local


def model_name(cfg) -> str:
    return default_model(cfg.dataset) if cfg.model == "auto" else cfg.model


FAULT_ENV = "FEDVLS_INJECT_FAULT"


def injected_fault(partition_id: int, server_round: int) -> str | None:
    """Fault injection for the reliability tests: ``FEDVLS_INJECT_FAULT`` holds entries
    ``kind:partition:round`` (kind ``raise`` or ``nan``) separated by commas, read from the
    environment of the process that runs the ClientApp. Unset in normal use."""
    for entry in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, pid, rnd = entry.split(":")
        if int(pid) == partition_id and int(rnd) == server_round:
            return kind
    return None


def local_test_per_class(cfg, model, device) -> list[float]:
    bundle = dataset_for(cfg)
    res = evaluate(
        model, bundle.test_x, bundle.test_y, bundle.num_classes, device=device,
        batch_size=cfg.eval_batch_size, mean=bundle.mean, std=bundle.std,
    )
    return [float(a) for a in res.per_class_accuracy]


def train_round(content: RecordDict, node_config: dict[str, Any]) -> RecordDict:
    config = dict(content[CONFIG_KEY])
    cfg = parse_run_config(config, strict=False)
    server_round = int(config.get("server-round", 0))
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    device = resolve_device(cfg.device)

    data = node_client_data(cfg, node_config)
    partition_id = data.partition_id
    fault = injected_fault(partition_id, server_round)
    if fault == "raise":
        raise RuntimeError(f"injected fault: partition {partition_id} raises in round {server_round}")
    model = build_model(model_name(cfg), tuple(data.x.shape[1:]), data.num_classes)
    model.load_state_dict(content[ARRAYS_KEY].to_torch_state_dict(), strict=True)

    # Batch order depends on (seed, round, partition) only: reproducible on any node.
    seed = int(np.random.SeedSequence([cfg.seed, server_round, partition_id]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(seed)
    result = train_local(
        model, data.x, data.y, data.num_classes, cfg,
        device=device, generator=generator, mean=data.mean, std=data.std,
        augment=cfg.augment,  # no effect on the MNIST-like sets (stored normalised, mean=None)
    )
    metrics = {
        "num-examples": result.num_examples,
        "train-loss": result.loss,
        "num-vacant": result.num_vacant,
        "partition-id": partition_id,
        "class-counts": result.class_counts,
        **{f"train-{name}": value for name, value in result.terms.items()},
    }
    if cfg.local_eval:
        # The paper's local-update view: this client's updated model on the test set.
        metrics["local-per-class-accuracy"] = local_test_per_class(cfg, model, device)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if fault == "nan":
        state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}
    return RecordDict({ARRAYS_KEY: ArrayRecord(state), METRICS_KEY: MetricRecord(metrics)})


def evaluate_round(content: RecordDict, node_config: dict[str, Any]) -> RecordDict:
    """Federated evaluation: the received global model on this node's local test split.

    Replies per-class correct/total counts so the server can pool them exactly; a node
    without a local test split (node config test-fraction = 0) replies num-examples 0.
    """
    cfg = parse_run_config(dict(content[CONFIG_KEY]), strict=False)
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    data = node_client_data(cfg, node_config)
    metrics: dict[str, Any] = {"num-examples": 0, "partition-id": data.partition_id}
    if data.test_x is not None and data.test_y.numel() > 0:
        device = resolve_device(cfg.device)
        model = build_model(model_name(cfg), tuple(data.x.shape[1:]), data.num_classes)
        model.load_state_dict(content[ARRAYS_KEY].to_torch_state_dict(), strict=True)
        res = evaluate(
            model, data.test_x, data.test_y, data.num_classes, device=device,
            batch_size=cfg.eval_batch_size, mean=data.mean, std=data.std,
        )
        total = torch.bincount(data.test_y, minlength=data.num_classes)
        correct = [0 if n == 0 else round(a * n) for a, n in zip(res.per_class_accuracy, total.tolist())]
        metrics.update({
            "num-examples": res.num_examples,
            "loss-sum": res.loss * res.num_examples,
            "correct-per-class": correct,
            "total-per-class": [int(n) for n in total.tolist()],
        })
    return RecordDict({METRICS_KEY: MetricRecord(metrics)})
