"""The yardstick: a plain PyTorch federated loop in one process, no Flower.

It does the same work as the app - the project's data loading
(:func:`fedvls_flwr.data.datasets.load_dataset`), partitioning
(:func:`fedvls_flwr.data.partition.partition_indices`), models
(:func:`fedvls_flwr.algorithms.run_model.build_run_model`) and objectives
(:func:`fedvls_flwr.algorithms.objectives.base.objective_for`) - but trains and aggregates with its
own, deliberately plain loop: sampled clients one after the other, then the server's update,
then the global model on the test set. Every other part of a run - the local optimizers
(SGD, FedSAM, FedGF), the state a client keeps across rounds (carried momentum, MOON's
previous model), the server optimizers, FedGF's server side, the sampling and the FedConcat
protocol - is written out here and in :mod:`bench.reference_parts` from docs/methods.md,
not taken from the app, so that ``tests/test_differential.py`` can hold the two against
each other for every registered part.

It reproduces the app's randomness, so that it computes the app's numbers round for round:

* initial model: ``torch.manual_seed(seed)`` then ``build_run_model`` (as the server does);
* the sampled clients of round ``r``: ``random.Random(seed * 1_000_003 + r).sample`` over the
  partitions in id order (``fraction-train`` of them, at least one; all when it is 1);
* client ``i`` in round ``r`` shuffles with a CPU ``torch.Generator`` seeded with
  ``SeedSequence([seed, r, i]).generate_state(1)[0]``, one ``randperm`` per epoch (FedConcat's
  head rounds: one ``randperm``, ``fedconcat-head-steps`` batches of it);
* a fresh ``torch.optim.SGD`` per client and round, its momentum buffers carried over from the
  client's previous round under ``optimizer-state = carry``;
* the teacher is a frozen copy of the received global model (MOON: and of the client's model
  after its previous round, both in eval mode); when its output does not change from epoch to
  epoch (``eval`` teacher mode, or a model without BatchNorm or dropout) what the loss needs
  of it (``Objective.prepare_teacher``) is computed once per round (chunks of
  ``eval-batch-size``), otherwise on every batch;
* the per-step loss is the objective's hot path, ``Objective.loss_terms``, with the features
  the objective names and its weight-space gradient (``Objective.after_backward``: FedProx);
* aggregation: ``sum_i (n_i / sum_j n_j) w_i`` over the round's clients, accumulated in
  float64 and cast back to each array's dtype (integer buffers rounded); the server
  optimizers in float64 from the formulas;
* FedConcat's new head: PyTorch's initialisation of an ``nn.Linear`` from a generator seeded
  ``seed * 1_000_003 + 21``.

Two ways to feed batches:

* ``index`` (default): batches are index slices of the client's tensors;
* ``dataloader``: the idiomatic ``DataLoader(TensorDataset(x, y[, teacher_rows]),
  batch_sampler=<this epoch's batches>)``: the same batch order as ``index`` (one ``randperm``
  per epoch from the client's generator), but per-sample indexing and ``default_collate``
  stacking instead of one gather per batch. That data path is the only difference between the
  two variants.

Command line (prints one JSON object; ``--json`` also writes it to a file). Every run-config key
is an option (``--method fedvls``) or a ``--set KEY=VALUE``::

    python bench/reference_loop.py --method fedvls --dataset mnist10k \\
        --data-dir ../shared/data --clients 10 --rounds 20 --local-epochs 5 --threads 1
    python bench/reference_loop.py --dataset mnist10k --clients 10 --rounds 6 \\
        --set protocol=fedconcat --set fedconcat-encoder-rounds=2 --set method=fedavg

The JSON's ``rounds`` hold each round's wall seconds (``seconds``: training, the server's
update, evaluation); ``steady_round_seconds`` is the median of rounds 2..R, and with
FedConcat ``stages`` gives each stage's rounds and the median of its rounds after the first
(``steady_round_seconds``: a head round, for stage 2).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_T_PROCESS = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from bench.reference_parts import (  # noqa: E402
    KEEPS_PREVIOUS_MODEL,
    FedGFPoint,
    FedGFServer,
    check_covered,
    cluster_assignment,
    concatenated_features,
    encoder_rounds,
    last_linear,
    local_step,
    new_head,
    sampled_partitions,
    server_optimizer,
    weighted_average,
)
from fedvls_flwr.algorithms.objectives.base import objective_for  # noqa: E402
from fedvls_flwr.algorithms.run_model import build_run_model  # noqa: E402
from fedvls_flwr.config.registry import get_part  # noqa: E402
from fedvls_flwr.config.run_config import SETTINGS, RunConfig, model_name, parse_run_config  # noqa: E402
from fedvls_flwr.data.datasets import load_dataset  # noqa: E402
from fedvls_flwr.data.partition import partition_indices  # noqa: E402

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (PROJECT_DIR / ".." / "shared" / "data").resolve()


#: The benchmark's workload where it differs from the app's defaults: the paper's MNIST
#: protocol on mnist10k, 20 rounds.
BENCH_SETTINGS = {"dataset": "mnist10k", "data-dir": str(DEFAULT_DATA_DIR), "num-server-rounds": 20}
LOADERS = ("index", "dataloader")


@dataclass(frozen=True)
class RefConfig:
    """One experiment: the app's own validated run config (so the loop reads every setting
    the app reads, under the same names and rules) plus how the loop itself runs.
    ``cfg.lr`` etc. read the run config."""

    run: RunConfig
    num_clients: int = 10  # the app's num-supernodes
    threads: int = 1
    loader: str = "index"  # "index" | "dataloader"

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")

    def __getattr__(self, name: str) -> Any:
        if name == "run":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.run, name)

    @classmethod
    def make(cls, *, num_clients: int = 10, threads: int = 1, loader: str = "index", **settings: Any) -> RefConfig:
        """Settings as keyword arguments (``dirichlet_beta=0.5``) over the bench defaults."""
        overrides = {key.replace("_", "-"): value for key, value in settings.items()}
        return cls(parse_run_config({**BENCH_SETTINGS, **overrides}), num_clients, threads, loader)

    def replace(self, **changes: Any) -> RefConfig:
        own = {k: changes.pop(k) for k in ("num_clients", "threads", "loader") if k in changes}
        run = parse_run_config({**self.run.to_flower(), **{k.replace("_", "-"): v for k, v in changes.items()}})
        return dataclasses.replace(self, run=run, **own)

    def run_config(self) -> dict[str, Any]:
        """The app's run config that describes the same experiment."""
        return self.run.to_flower()

    def params(self, kind: str) -> dict[str, Any]:
        """The settings of the run's part of ``kind`` (run-config keys)."""
        values = self.run.to_flower()
        return get_part(kind, values[kind]).own_settings(values)


def batch_seed(seed: int, server_round: int, client: int) -> int:
    """The seed of a client's batch-order generator in a round (as the app's client)."""
    return int(np.random.SeedSequence([seed, server_round, client]).generate_state(1)[0])


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy(model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def mode_dependent(model: nn.Module) -> bool:
    """Whether the model computes differently in train mode (BatchNorm, dropout)."""
    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return any(isinstance(m, kinds) for m in model.modules())


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


def _frozen(model: nn.Module, train_mode: bool) -> nn.Module:
    copy_ = copy.deepcopy(model)
    copy_.train(train_mode)
    for p in copy_.parameters():
        p.requires_grad_(False)
    return copy_


def train_client(model: nn.Module, client: Client, num_classes: int, cfg: RefConfig, generator: torch.Generator,
                 point: FedGFPoint | None = None) -> int:
    """Train ``model`` (holding the weights the client received) in place; returns the sample count."""
    x, y = client.x, client.y
    memory = client.memory
    counts = torch.bincount(y, minlength=num_classes)
    objective = objective_for(cfg.method, counts, cfg.params("method"))
    objective.bind_global(model)  # FedProx's anchor: the received weights

    teacher = None  # a function of a batch: what prepare_teacher takes
    teacher_rows = None  # its prepare_teacher rows for the whole local data, when they do not change
    if objective.needs_teacher:
        train_mode = objective.teacher_mode == "train"
        if objective.teacher_output == "logits":
            global_copy = _frozen(model, train_mode)
            teacher = global_copy
        else:  # MOON: the projections of the received model and of this client's previous one
            global_copy = _frozen(model, False)
            previous = None
            if memory.previous is not None:
                previous = _frozen(model, False)
                previous.load_state_dict(memory.previous)

            def teacher(xb, g=global_copy, p=previous):
                z = [g.project(xb)[1]] + ([] if p is None else [p.project(xb)[1]])
                return torch.cat(z, dim=1)
        if not (train_mode and mode_dependent(model)):
            with torch.no_grad():
                outputs = torch.cat([teacher(x[i : i + cfg.eval_batch_size])
                                     for i in range(0, len(x), cfg.eval_batch_size)])
                teacher_rows = objective.prepare_teacher(outputs, y)

    params = [p for p in model.parameters() if p.requires_grad]
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer_state == "carry" and memory.momentum is not None:
        for p, buf in zip(params, memory.momentum):
            if buf is not None:
                optimizer.state[p]["momentum_buffer"] = buf.clone()

    features: list[torch.Tensor] = []
    hook = None
    if objective.features == "penultimate":
        hook = last_linear(model).register_forward_pre_hook(lambda _m, inputs: features.append(inputs[0]))
    rho = float(cfg.params("local-optimizer").get("sam-rho", 0.0))
    model.train()

    def step(xb: torch.Tensor, yb: torch.Tensor, tb: torch.Tensor | None) -> None:
        if tb is None and teacher is not None:
            with torch.no_grad():
                tb = objective.prepare_teacher(teacher(xb), yb)

        def gradient() -> None:
            optimizer.zero_grad(set_to_none=True)
            features.clear()
            if objective.features == "projection":
                logits, feats = model.project(xb)
            else:
                logits = model(xb)
                feats = features[-1] if features else None
            loss, _ = objective.loss_terms(logits, yb, tb, feats)
            loss.backward()
            objective.after_backward(params)

        local_step(cfg.local_optimizer, params, optimizer, gradient, rho, point, names)

    n = len(y)
    bounds = epoch_batches(n, cfg.batch_size, has_batchnorm(model))
    try:
        for _ in range(cfg.local_epochs):
            order = torch.randperm(n, generator=generator).to(x.device)
            batches = [order[a:b] for a, b in bounds]
            if cfg.loader == "dataloader":
                tensors = (x, y) if teacher_rows is None else (x, y, teacher_rows)
                for batch in DataLoader(TensorDataset(*tensors), batch_sampler=[b.tolist() for b in batches]):
                    step(batch[0], batch[1], batch[2] if len(batch) == 3 else None)
            else:
                for idx in batches:
                    step(x[idx], y[idx], None if teacher_rows is None else teacher_rows[idx])
    finally:
        if hook is not None:
            hook.remove()
    if cfg.optimizer_state == "carry":
        memory.momentum = [None if optimizer.state[p].get("momentum_buffer") is None
                           else optimizer.state[p]["momentum_buffer"].detach().clone() for p in params]
    if cfg.method in KEEPS_PREVIOUS_MODEL:
        memory.previous = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return n


def train_head(encoders: list[nn.Module], head: dict[str, torch.Tensor], client: Client, cfg: RefConfig,
               generator: torch.Generator, steps: int) -> dict[str, torch.Tensor]:
    """FedConcat's stage 2 on one client: ``steps`` mini-batches of one shuffled pass (at most
    one pass) on the head over the frozen encoders, plain CE, a fresh SGD."""
    linear = nn.Linear(head["weight"].shape[1], head["weight"].shape[0])
    linear.load_state_dict(head)
    optimizer = torch.optim.SGD(linear.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    n = len(client.y)
    order = torch.randperm(n, generator=generator)
    for s in range(min(steps, math.ceil(n / cfg.batch_size))):
        idx = order[s * cfg.batch_size : (s + 1) * cfg.batch_size].to(client.x.device)
        loss = F.cross_entropy(linear(concatenated_features(encoders, client.x[idx])), client.y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in linear.state_dict().items()}


@torch.no_grad()
def evaluate(model, x, y, batch_size: int) -> tuple[float, float]:
    """(top-1 accuracy, mean cross-entropy) of ``model`` on ``x``/``y``."""
    model.eval()
    correct = 0
    loss = 0.0
    for i in range(0, len(y), batch_size):
        logits = model(x[i : i + batch_size]).float()
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
        return self.head(concatenated_features(self.encoders, x))


# --------------------------------------------------------------------------- the FL loop


def run(cfg: RefConfig, log=None, keep_arrays: bool = False) -> dict[str, Any]:
    """Run every round; returns per-round accuracy and timings (``keep_arrays``: and the final
    global state under ``arrays``, named as the app's checkpoint names it)."""
    check_covered(cfg.run_config())
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, log, keep_arrays)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: RefConfig, log, keep_arrays: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    bundle = load_dataset(cfg.dataset, cfg.run.resolved_data_dir(), download=cfg.download, pool_size=cfg.train_pool_size)
    if bundle.mean is not None:
        raise ValueError(
            f"dataset {cfg.dataset!r} is normalised per batch (uint8 storage); the reference "
            "loop covers the pre-normalised sets (digits, mnist, mnist10k)"
        )
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    parts = partition_indices(
        bundle.train_y.numpy(), cfg.num_clients, cfg.partition, cfg.seed,
        dirichlet_beta=cfg.dirichlet_beta, shards_per_client=cfg.shards_per_client, min_size=cfg.min_partition_size,
    )
    # device = "cuda": every tensor lives on the GPU for the whole run (the app copies a
    # client's data there once per round); the CPU path is unchanged
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    clients = []
    for idx in parts:
        idx_t = torch.from_numpy(idx)
        clients.append(Client(bundle.train_x[idx_t].to(device), bundle.train_y[idx_t].to(device)))
    test_x, test_y = bundle.test_x.to(device), bundle.test_y.to(device)
    num_classes = bundle.num_classes

    torch.manual_seed(cfg.seed)
    model = build_run_model(cfg.run, tuple(bundle.input_shape), num_classes).to(device)
    name = model_name(cfg.run)
    initial = to_numpy(model)
    protocol = FedConcatLoop(cfg, clients, num_classes, initial) if cfg.protocol == "fedconcat" else None
    server = server_optimizer(cfg.server_optimizer, cfg.params("server-optimizer"))
    fedgf = FedGFServer(cfg.params("local-optimizer")) if cfg.local_optimizer == "fedgf" else None

    global_state = initial
    if protocol is None:
        acc, loss = evaluate(model, test_x, test_y, cfg.eval_batch_size)
        rounds = [{"round": 0, "accuracy": acc, "loss": loss, "seconds": 0.0}]
    else:
        rounds = [{"round": 0, "stage": 1, "accuracy": None, "loss": None, "seconds": 0.0}]
    setup_seconds = time.perf_counter() - t0

    for r in range(1, cfg.num_server_rounds + 1):
        t_round = time.perf_counter()
        sampled = sampled_partitions(cfg.num_clients, cfg.fraction_train, cfg.seed, r)
        record: dict[str, Any] = {"round": r}
        if protocol is not None:
            client_seconds, t_agg, evaluated = protocol.round(r, sampled, model, device)
            record["stage"] = protocol.stage(r)
        else:
            point = fedgf.point() if fedgf is not None else None
            if fedgf is not None:
                record["fedgf_c"] = 0.0 if point is None else point.c
            replies, client_seconds = [], []
            for i in sampled:
                t_client = time.perf_counter()
                load_numpy(model, global_state)
                gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
                n = train_client(model, clients[i], num_classes, cfg, gen, point)
                replies.append((float(n), to_numpy(model)))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                client_seconds.append(time.perf_counter() - t_client)
            t_agg = time.perf_counter()
            average = weighted_average([a for _, a in replies], [n for n, _ in replies])
            new_state = server.step(r, global_state, average, replies)
            if fedgf is not None:
                fedgf.observe(global_state, new_state, replies)
                record["fedgf_divergence"] = fedgf.divergence
            if getattr(server, "step_size", None) is not None:
                record["server_step_size"] = server.step_size
            global_state = new_state
            load_numpy(model, server.evaluated(global_state))
            evaluated = model
        t_eval = time.perf_counter()
        acc, loss = (None, None) if evaluated is None else evaluate(evaluated, test_x, test_y, cfg.eval_batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if loss is not None and not math.isfinite(loss):
            loss = None
        record.update({
            "accuracy": acc, "loss": loss, "sampled_partitions": sampled, "seconds": t_end - t_round,
            "train_seconds": t_agg - t_round, "aggregate_seconds": t_eval - t_agg, "eval_seconds": t_end - t_eval,
            "client_seconds": client_seconds,
        })
        rounds.append(record)
        if log is not None:
            log(f"round {r}/{cfg.num_server_rounds}: accuracy {acc}  {t_end - t_round:.2f}s")

    out: dict[str, Any] = {
        "config": {**cfg.run_config(), "num-clients": cfg.num_clients, "threads": cfg.threads, "loader": cfg.loader},
        "model": name,
        "client_sizes": [len(p) for p in parts],
        "rounds": rounds,
        "steady_round_seconds": steady([r["seconds"] for r in rounds[1:]]),
        "setup_seconds": setup_seconds,
        "loop_seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if protocol is not None:
        out["stages"] = {
            str(stage): {"rounds": [r["round"] for r in rounds[1:] if r["stage"] == stage],
                         "steady_round_seconds": steady([r["seconds"] for r in rounds[1:] if r["stage"] == stage])}
            for stage in (1, 2)
        }
    if keep_arrays:
        out["arrays"] = protocol.state() if protocol is not None else global_state
    return out


def steady(seconds: list[float]) -> float | None:
    """The median of the rounds after the first (the first alone when there is one)."""
    if not seconds:
        return None
    return statistics.median(seconds[1:] or seconds)


class FedConcatLoop:
    """FedConcat written out: rounds 1..E FedAvg of a whole model inside each cluster, then
    the K encoders frozen side by side and a new head that every sampled client trains for
    ``fedconcat-head-steps`` batches, averaged unweighted; the concatenated model evaluated."""

    def __init__(self, cfg: RefConfig, clients: list[Client], num_classes: int, initial: dict[str, np.ndarray]) -> None:
        self.cfg, self.clients, self.num_classes = cfg, clients, num_classes
        p = cfg.params("protocol")
        self.k = int(p["fedconcat-clusters"])
        self.head_steps = int(p["fedconcat-head-steps"])
        self.head_init = str(p["fedconcat-head-init"])
        self.encoder_rounds = encoder_rounds(cfg.num_server_rounds, int(p["fedconcat-encoder-rounds"]))
        counts = np.stack([torch.bincount(c.y, minlength=num_classes).cpu().numpy() for c in clients]).astype(np.float64)
        self.assignment = cluster_assignment(str(p["fedconcat-assignment"]), counts, self.k, cfg.seed)
        self.clusters = [{k: v.copy() for k, v in initial.items()} for _ in range(self.k)]
        self.encoders: list[nn.Module] = []
        self.head: dict[str, torch.Tensor] = {}

    def stage(self, r: int) -> int:
        return 1 if r <= self.encoder_rounds else 2

    def round(self, r: int, sampled: list[int], model: nn.Module, device: torch.device):
        """Returns (the clients' seconds, when the server's part began, the model to evaluate or None)."""
        cfg, seconds = self.cfg, []
        if self.stage(r) == 1:
            replies: dict[int, list[tuple[float, dict[str, np.ndarray]]]] = {}
            for i in sampled:
                t_client = time.perf_counter()
                cluster = self.assignment[i]
                load_numpy(model, self.clusters[cluster])
                gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
                n = train_client(model, self.clients[i], self.num_classes, cfg, gen)
                replies.setdefault(cluster, []).append((float(n), to_numpy(model)))
                seconds.append(time.perf_counter() - t_client)
            t_agg = time.perf_counter()
            for cluster, got in replies.items():
                self.clusters[cluster] = weighted_average([a for _, a in got], [n for n, _ in got])
            if r == self.encoder_rounds:
                self._freeze(model)
            return seconds, t_agg, None
        heads = []
        for i in sampled:
            t_client = time.perf_counter()
            gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
            heads.append(train_head(self.encoders, self.head, self.clients[i], cfg, gen, self.head_steps))
            seconds.append(time.perf_counter() - t_client)
        t_agg = time.perf_counter()
        self.head = {k: torch.stack([h[k].double() for h in heads]).mean(dim=0).to(self.head[k].dtype)
                     for k in self.head}
        return seconds, t_agg, Concatenated(self.encoders, self.head)

    def _freeze(self, model: nn.Module) -> None:
        self.encoders = []
        for arrays in self.clusters:
            encoder = copy.deepcopy(model)
            load_numpy(encoder, arrays)
            encoder.requires_grad_(False)
            encoder.eval()
            self.encoders.append(encoder)
        classifier = last_linear(model)
        prefix = next(name for name, m in model.named_modules() if m is classifier) + "."
        if self.head_init == "concat":
            weight = torch.cat([torch.from_numpy(c[prefix + "weight"]) for c in self.clusters], dim=1)
            bias = torch.stack([torch.from_numpy(c[prefix + "bias"]).double() for c in self.clusters]).sum(dim=0)
        else:
            weight, bias = new_head(classifier.in_features * self.k, self.num_classes, self.cfg.seed)
        dtype = classifier.weight.dtype
        self.head = {"weight": weight.to(dtype).clone(), "bias": bias.to(dtype).clone()}

    def state(self) -> dict[str, np.ndarray]:
        """The protocol's state named as the app's checkpoint names it."""
        out: dict[str, np.ndarray] = {"fedconcat/assignment": np.asarray(self.assignment, np.int64)}
        if not self.head:
            for k, arrays in enumerate(self.clusters):
                out.update({f"cluster{k}/{name}": v for name, v in arrays.items()})
            return out
        for k, arrays in enumerate(self.clusters):
            out.update({f"encoder{k}/{name}": v for name, v in arrays.items()})
        out["head/weight"] = self.head["weight"].numpy()
        out["head/bias"] = self.head["bias"].numpy()
        return out


# --------------------------------------------------------------------------- command line


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_BY_KEY = {s.key: s for s in SETTINGS}


def parse_set(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of a run-config key, the value read as the setting's type."""
    key, sep, text = item.partition("=")
    if not sep or key not in _BY_KEY:
        raise argparse.ArgumentTypeError(f"--set {item!r}: expected KEY=VALUE with a run-config key")
    kind = _BY_KEY[key].kind
    return key, _parse_bool(text) if kind is bool else kind(text)


def cli_args(cfg: RefConfig) -> list[str]:
    """The command line that describes ``cfg`` (what bench_round.py runs this loop with)."""
    args = [f"--{key}={value}" for key, value in cfg.run_config().items()]
    return args + [f"--num-clients={cfg.num_clients}", f"--threads={cfg.threads}", f"--loader={cfg.loader}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    settings = parser.add_argument_group("run config (the app's keys; bench defaults: " + str(BENCH_SETTINGS) + ")")
    for s in SETTINGS:
        settings.add_argument(f"--{s.key}", type=_parse_bool if s.kind is bool else s.kind, default=None, help=s.help)
    parser.add_argument("--set", dest="set_items", metavar="KEY=VALUE", type=parse_set, action="append", default=[],
                        help="a run-config key (repeatable; wins over the options above)")
    parser.add_argument("--num-clients", "--clients", type=int, default=10, help="the app's num-supernodes")
    parser.add_argument("--rounds", type=int, default=None, help="alias of --num-server-rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--loader", choices=LOADERS, default="index")
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--verbose", action="store_true", help="log every round to stderr")
    args = parser.parse_args(argv)
    given = {s.key: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
    if args.rounds is not None:
        given["num-server-rounds"] = args.rounds
    given.update(dict(args.set_items))
    cfg = RefConfig(parse_run_config({**BENCH_SETTINGS, **given}), args.num_clients, args.threads, args.loader)
    out_path, verbose = args.json, args.verbose
    result = run(cfg, log=(lambda m: print(m, file=sys.stderr)) if verbose else None)
    result["process_seconds"] = time.perf_counter() - _T_PROCESS  # imports included
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    text = json.dumps(result)
    if out_path:
        Path(out_path).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
