"""The reference loop's local training: a client's round, FedConcat's head round, the evaluation.

Part of :mod:`bench.reference_loop` (which see); like it, shares no code with the app. A client's
round: consecutive slices of ``batch-size`` of each epoch's shuffled order (a BatchNorm model's
last batch under half a batch joins the one before: docs/datasets-and-models.md); a fresh
``torch.optim.SGD`` every round, or its momentum buffers carried over from the client's previous
round (``optimizer-state = carry``: the authors' baseline clients keep one optimizer); the
teacher a frozen copy of the received global model in ``teacher-mode`` (MOON: and of the
client's previous model, in eval mode), run on every batch; the local step of the run's local
optimizer (:data:`bench.reference_parts.LOCAL_STEPS`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench import reference_data as data
from bench import reference_models as models
from bench.reference_objectives import Batch, Objective
from bench.reference_objectives import build as build_objective
from bench.reference_parts import LOCAL_STEPS, FedGFPoint, LocalStep, concatenated_features
from bench.reference_settings import RefConfig


def batch_seed(seed: int, server_round: int, client: int) -> int:
    """The seed of a client's batch-order generator in a round."""
    return int(np.random.SeedSequence([seed, server_round, client]).generate_state(1)[0])


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})


def epoch_batches(n: int, batch_size: int, batchnorm: bool) -> list[tuple[int, int]]:
    """Consecutive slices of batch_size; with BatchNorm a last batch under half a batch joins the one before."""
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    if batchnorm and len(bounds) > 1 and 2 * (bounds[-1][1] - bounds[-1][0]) < batch_size:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


# --------------------------------------------------------------------------- local training


@dataclass
class ClientMemory:
    """What a client keeps from one of its rounds to its next: the momentum buffers
    (``optimizer-state = carry``) and MOON's previous local model."""

    momentum: list[torch.Tensor | None] | None = None
    previous: dict[str, torch.Tensor] | None = None


@dataclass
class Client:
    x: torch.Tensor
    y: torch.Tensor
    memory: ClientMemory = field(default_factory=ClientMemory)


@dataclass(frozen=True)
class Inputs:
    """How a batch of stored images becomes the model's input: as it is (the grayscale sets are
    stored normalised), or normalised per batch (the RGB sets)."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.mean is None or self.std is None else data.normalise_batch(x, self.mean, self.std)


def frozen(model: nn.Module, train_mode: bool) -> nn.Module:
    twin = copy.deepcopy(model)
    twin.train(train_mode)
    twin.requires_grad_(False)
    return twin


def teacher_of(objective: Objective, model: nn.Module, memory: ClientMemory, mode: str) -> Callable | None:
    """What the loss reads of the received global model on a batch (None if nothing)."""
    if objective.teacher == "logits":
        return frozen(model, mode == "train")
    if objective.teacher == "projections":  # MOON: the global and the previous model, eval mode
        glob = frozen(model, False)
        previous = None
        if memory.previous is not None:
            previous = frozen(model, False)
            previous.load_state_dict(memory.previous)
        return lambda xb: (glob.features(xb), None if previous is None else previous.features(xb))
    return None


def train_client(model: nn.Module, client: Client, num_classes: int, cfg: RefConfig, generator: torch.Generator,
                 inputs: Inputs, point: FedGFPoint | None = None) -> int:
    """Train ``model`` (holding the weights the client received) in place; returns the sample count."""
    x, y, memory = client.x, client.y, client.memory
    counts = torch.bincount(y, minlength=num_classes)
    params = cfg.params("method")
    objective = build_objective(cfg.method, counts, params)
    teacher = teacher_of(objective, model, memory, str(params.get("teacher-mode", "eval")))
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    weights = [p for _, p in trained]
    anchor = [p.detach().clone() for p in weights] if objective.weight_space else None
    optimizer = torch.optim.SGD(weights, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer_state == "carry" and memory.momentum is not None:
        for p, buf in zip(weights, memory.momentum):
            if buf is not None:
                optimizer.state[p]["momentum_buffer"] = buf.clone()
    local = cfg.params("local-optimizer")
    state = LocalStep(weights, [name for name, _ in trained], optimizer, float(local.get("sam-rho", 0.0)), point)
    step_kind = LOCAL_STEPS[cfg.local_optimizer]
    model.train()

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        xb = inputs(xb)
        with torch.no_grad():
            teacher_out = None if teacher is None else teacher(xb)

        def gradient() -> None:
            optimizer.zero_grad(set_to_none=True)
            feats = None
            if objective.features == "projection":
                logits, feats = model.project(xb)
            elif objective.features == "penultimate":
                feats = model.features(xb)
                logits = model.classifier(feats)
            else:
                logits = model(xb)
            batch = Batch(logits, yb, teacher_out, feats, weights, anchor)
            objective.loss(batch).backward()

        step_kind(state, gradient)

    n = len(y)
    bounds = epoch_batches(n, cfg.batch_size, models.has_batchnorm(model))
    for _ in range(cfg.local_epochs):
        order = torch.randperm(n, generator=generator).to(x.device)
        batches = [order[a:b] for a, b in bounds]
        if cfg.loader == "dataloader":
            for xb, yb in DataLoader(TensorDataset(x, y), batch_sampler=[b.tolist() for b in batches]):
                step(xb, yb)
        else:
            for idx in batches:
                step(x[idx], y[idx])
    if cfg.optimizer_state == "carry":
        memory.momentum = [None if optimizer.state[p].get("momentum_buffer") is None
                           else optimizer.state[p]["momentum_buffer"].detach().clone() for p in weights]
    if objective.keeps_previous:
        memory.previous = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return n


def train_head(encoders: list[nn.Module], head: dict[str, torch.Tensor], client: Client, cfg: RefConfig,
               generator: torch.Generator, steps: int, inputs: Inputs) -> dict[str, torch.Tensor]:
    """FedConcat's stage 2 on one client (the authors' code): ``steps`` mini-batches of one shuffled
    pass (at most one pass) on the head over the frozen encoders, plain CE, a fresh SGD."""
    linear = nn.Linear(head["weight"].shape[1], head["weight"].shape[0]).to(client.x.device)
    linear.load_state_dict(head)
    optimizer = torch.optim.SGD(linear.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    n = len(client.y)
    order = torch.randperm(n, generator=generator)
    for s in range(min(steps, math.ceil(n / cfg.batch_size))):
        idx = order[s * cfg.batch_size : (s + 1) * cfg.batch_size].to(client.x.device)
        loss = F.cross_entropy(linear(concatenated_features(encoders, inputs(client.x[idx]))), client.y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in linear.state_dict().items()}


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, inputs: Inputs) -> tuple[float, float]:
    """(top-1 accuracy, mean cross-entropy) of ``model`` in eval mode on ``x``/``y``."""
    model.eval()
    correct = 0
    loss = 0.0
    for i in range(0, len(y), batch_size):
        logits = model(inputs(x[i : i + batch_size])).float()
        yb = y[i : i + batch_size]
        correct += int((logits.argmax(dim=1) == yb).sum())
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
    return correct / max(len(y), 1), loss / max(len(y), 1)


class Concatenated(nn.Module):
    """FedConcat's model: the K frozen encoders' features side by side, then the head."""

    def __init__(self, encoders: list[nn.Module], head: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.encoders = encoders
        self.head = nn.Linear(head["weight"].shape[1], head["weight"].shape[0])
        self.head.load_state_dict(head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.to(x.device)(concatenated_features(self.encoders, x))
