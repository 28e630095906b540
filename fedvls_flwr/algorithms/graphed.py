"""A client's local training on a GPU as CUDA graphs: every kernel of a step launched by one call.

At the paper's batch of 64 a step of the CIFAR models costs less GPU time than it takes Python
to launch its few thousand kernels one by one. A CUDA graph records the launches of one step
once (``torch.cuda.CUDAGraph``) and replays them with one call. Replaying needs everything the
step reads and writes at fixed addresses, so this module keeps, per process, a
:class:`GraphedTrainer` for each kind of step (:func:`trainer_key`: the network and its input
shape, the objective and its settings, the local optimizer and its constants, batch size,
``amp``, ``channels-last``, how the teacher runs) holding

* its own copy of the network (and of the frozen teacher, MOON's previous model), into which
  each round copies the received weights in place (``load_state_dict`` copies into the
  existing tensors);
* the SGD momentum buffers, held (``LocalSGD.hold_buffers``) and zeroed in place each round
  (SGD's first step from a zero buffer, ``0 * m + g``, is the fresh optimizer's ``buf = g``
  exactly) or loaded with the carried ones (the local optimizer's client state);
* one objective and one local-optimizer step, into which each client's per-client tensors
  (class counts and what derives from them, FedGF's perturbed global point) are copied in
  place (``Objective.load_client``, ``load_round``); objectives built with
  ``fixed_shapes=True`` compute with masks what their eager step selects by index;
* static input buffers (a batch of raw images, its labels, its cached teacher rows) that each
  step fills by ``index_select`` before the replay, and the loss-term sums the graph adds to;
* the augmentation's GPU generator, registered with the graph so each replay draws new numbers
  (reseeded each round from the client's seed: the same images for the same seed).

A round's first steps run eagerly on a side stream (warm-up, as PyTorch's whole-network
capture recipe asks), then the step is captured and replayed for every full batch. The last
short batch (and a BatchNorm model's merged last batch) runs eagerly through the same
:func:`~fedvls_flwr.algorithms.training.local_step`. Nothing inside the graph reads a value
back to the host; the non-finite check and the term sums are read once per epoch, as in the
eager loop. A capture that fails falls back to the eager step for that trainer (logged once).

The same trainer runs on a CPU with ``capture=False`` (the tests of the static-buffer handling):
every step then runs eagerly on the static buffers, and FedAvg's weights equal
:func:`~fedvls_flwr.algorithms.training.train_local`'s bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

import torch
from torch import nn

from fedvls_flwr.algorithms.batchnorm import batch_bounds, has_batchnorm
from fedvls_flwr.algorithms.device import use_amp, use_channels_last
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.local_optim import LocalOptimizer
from fedvls_flwr.algorithms.objectives.base import Objective, build_objective
from fedvls_flwr.algorithms.parts import ClientState, ObjectiveContext
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.algorithms.training import (
    StepParts,
    TeacherRows,
    TrainResult,
    _predict,
    _teacher_output,
    autocast_context,
    check_finite,
    keep_client_state,
    local_step,
    make_teacher,
    mode_dependent,
    prepare_model,
    round_optimizer,
    round_result,
    to_device,
)
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.augment import make_batch_transform
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import FeatureTap

__all__ = ["GraphedTrainer", "MAX_TRAINERS", "WARMUP_STEPS", "capture_counts", "clear_trainers", "round_key",
           "train_graphed", "trainer_key"]

logger = logging.getLogger(__name__)

#: Eager steps on a side stream before the capture (PyTorch's recipe: lazy initialisation,
#: cuBLAS workspaces and the autograd engine's streams settle before anything is recorded).
WARMUP_STEPS = 2
#: Trainers kept per process (least recently used dropped): each holds a network, its teacher,
#: momentum buffers and the graph's memory pool.
MAX_TRAINERS = 4

_TRAINERS: OrderedDict[Hashable, GraphedTrainer] = OrderedDict()
_LOCK = threading.Lock()


#: Captures this process made and captures that failed (their trainers then step eagerly): a
#: bench reporting graphed figures says whether they were graphed.
_CAPTURES = {"captured": 0, "failed": 0}


def capture_counts() -> dict[str, int]:
    """How many step captures this process made and how many failed, so far."""
    return dict(_CAPTURES)


def clear_trainers() -> None:
    """Drop every kept trainer (their graphs and memory)."""
    with _LOCK:
        _TRAINERS.clear()


def _model_signature(model: nn.Module) -> tuple[Any, ...]:
    """The network's architecture: its modules as printed, and every tensor's name, shape and dtype."""
    return (repr(model), tuple((k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()))


def teacher_plan(objective: Objective, model: nn.Module, augments: bool, cache_teacher: bool) -> str:
    """How the loss reads the teacher: "none", "rows" (prepared once per round for the whole
    local data, as :class:`~fedvls_flwr.algorithms.training.TeacherRows` does when the teacher's
    output cannot change within the round) or "forward" (a teacher forward pass every step)."""
    if not objective.needs_teacher:
        return "none"
    train_mode = objective.teacher_mode == "train"
    deterministic = not augments and not (train_mode and mode_dependent(model))
    return "rows" if cache_teacher and deterministic else "forward"


def trainer_key(model: nn.Module, data: ClientData, cfg: RunConfig, objective: Objective, optimizer_signature: tuple,
                device: torch.device, cache_teacher: bool = True) -> tuple[Any, ...]:
    """Everything that shapes a captured step: two rounds with the same key replay one graph.
    A setting that is a constant of the captured kernels (learning rate, momentum, weight
    decay, the objective's and the optimizer's settings), a shape (network, input, batch,
    classes, teacher rows) or a code path (amp, channels-last, augmentation, teacher plan,
    MOON's previous model, deterministic kernels) is part of it."""
    augments = data.mean is not None and cfg.augment
    plan = teacher_plan(objective, model, augments, cache_teacher)
    previous = objective.teacher_output == "projections" and objective.previous_model is not None
    return (
        str(device), _model_signature(model), tuple(data.x.shape[1:]), data.x.dtype, data.num_classes,
        data.mean, data.std, augments, cfg.batch_size, cfg.lr, cfg.momentum, cfg.weight_decay,
        use_amp(cfg, device), use_channels_last(cfg, device), cfg.deterministic,
        objective.graph_signature(), optimizer_signature, plan, previous,
    )


class GraphedTrainer:
    """One kind of step (see :func:`trainer_key`) with its static buffers and, on CUDA, its graph."""

    def __init__(self, model: nn.Module, data: ClientData, cfg: RunConfig, device: torch.device,
                 objective: Objective, plan: str, previous: bool, capture: bool) -> None:
        self.device, self.plan, self.capture = device, plan, capture and device.type == "cuda"
        self.batch_size = cfg.batch_size
        self.channels_last = use_channels_last(cfg, device)
        self.amp = use_amp(cfg, device)
        self.model = prepare_model(copy.deepcopy(model), device, self.channels_last)
        self.sgd = LocalSGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        if self.sgd.momentum != 0.0:
            self.sgd.hold_buffers()
        self.objective = objective
        self.optimizer: LocalOptimizer | None = None
        self.teacher: nn.Module | None = None
        self.previous: nn.Module | None = None
        if plan == "forward":
            self.teacher = prepare_model(make_teacher(self.model, objective.teacher_mode), device, self.channels_last)
        if previous:
            self.previous = prepare_model(make_teacher(self.model, "eval"), device, self.channels_last)
        self.tap = FeatureTap(self.model) if objective.features == "penultimate" else None  # after the copies
        self.generator = torch.Generator(device=device) if device.type == "cuda" else None
        self.transform = make_batch_transform(data.mean, data.std, train=True, augment=cfg.augment,
                                              generator=self.generator)
        width = tuple(data.x.shape[1:])
        self.xb = torch.empty((self.batch_size, *width), dtype=data.x.dtype, device=device)
        self.yb = torch.empty(self.batch_size, dtype=torch.int64, device=device)
        self.rows: torch.Tensor | None = None  # sized on the first round (the prepared rows' width)
        self.term_sums = torch.zeros(len(objective.term_names), device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm_steps = 0
        self.side_stream = torch.cuda.Stream(device) if self.capture else None
        self.replays = 0

    # -- a round ------------------------------------------------------------------------
    def train(self, model: nn.Module, data: ClientData, cfg: RunConfig, generator: torch.Generator,
              state: ClientState, objective: Objective, received: Received) -> TrainResult:
        """Train the received weights (in ``model``) on ``data``; ``model`` ends holding the result."""
        device = self.device
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())
            if self.teacher is not None:
                self.teacher.load_state_dict(model.state_dict())
            if self.previous is not None:
                assert objective.previous_model is not None
                self.previous.load_state_dict(objective.previous_model)
        if objective is not self.objective:
            self.objective.load_client(objective)
        self.objective.bind_global(self.model)
        optimizer = round_optimizer(cfg, self.sgd, received)
        optimizer.load_client_state(state.of("local-optimizer"))  # into the held momentum buffers
        if self.optimizer is None:
            optimizer.own_round_tensors()
            self.optimizer = optimizer
        else:
            self.optimizer.load_round(optimizer)
        self.transform.generator = self.generator if self.generator is not None else generator
        if self.generator is not None:  # the seed augmentation_generator gives the eager loop
            self.generator.manual_seed(generator.initial_seed())
        x, y = to_device(data.x, device), to_device(data.y, device)
        n = int(x.shape[0])
        autocast = autocast_context(device, self.amp, cache=not self.capture)
        rows = self._teacher_rows(x, y, cfg, autocast)
        teacher = TeacherRows(self.objective, forward=self._teacher_forward())
        parts = StepParts(self.model, self.objective, teacher, self.sgd, self.optimizer,
                          autocast, self.tap, self.transform, self.channels_last)
        bounds = batch_bounds(n, cfg.batch_size, batchnorm=has_batchnorm(self.model))
        self.model.train()
        self.term_sums.zero_()
        steps = 0
        for _ in range(cfg.local_epochs):
            order = torch.randperm(n, generator=generator).to(device)
            for start, stop in bounds:
                idx = order[start:stop]
                if stop - start == self.batch_size:
                    torch.index_select(x, 0, idx, out=self.xb)
                    torch.index_select(y, 0, idx, out=self.yb)
                    if rows is not None:
                        assert self.rows is not None
                        torch.index_select(rows, 0, idx, out=self.rows)
                    self._full_step(parts)
                else:  # the short (or merged) last batch: the same step, eagerly
                    terms = local_step(parts, x[idx], y[idx], None if rows is None else rows[idx])
                    self.term_sums.add_(terms, alpha=stop - start)
                steps += 1
            check_finite(self.term_sums, cfg)
        # copies: the buffers and the network are this trainer's, the next client's steps overwrite them
        keep_client_state(state, objective, optimizer, self.model)
        with torch.no_grad():
            model.load_state_dict(self.model.state_dict())
        counts = torch.bincount(y, minlength=data.num_classes)
        return round_result(self.term_sums, steps, n, cfg, self.objective, counts)

    def _teacher_forward(self) -> Any:
        if self.teacher is None:
            return None
        return _teacher_output(self.objective, self.teacher, self.previous)

    def _teacher_rows(self, x: torch.Tensor, y: torch.Tensor, cfg: RunConfig,
                      autocast: contextlib.AbstractContextManager) -> torch.Tensor | None:
        """The teacher's prepared rows for the whole local data (plan "rows"), from the network
        while it still holds the received weights, as the eager loop computes them."""
        if self.plan != "rows":
            return None
        self.model.train(self.objective.teacher_mode == "train")
        with autocast:
            out = _predict(_teacher_output(self.objective, self.model, self.previous), x, self.transform,
                           cfg.eval_batch_size)
        rows = self.objective.prepare_teacher(out, y)
        assert rows is not None
        if self.rows is None:
            self.rows = torch.empty((self.batch_size, *rows.shape[1:]), dtype=rows.dtype, device=self.device)
        return rows

    # -- a full batch ---------------------------------------------------------------------
    def _accumulate(self, parts: StepParts) -> None:
        """The step on the static buffers, its terms added to the sums (what the graph records)."""
        self.term_sums.add_(local_step(parts, self.xb, self.yb, self.rows if self.plan == "rows" else None),
                            alpha=self.batch_size)

    def _full_step(self, parts: StepParts) -> None:
        if not self.capture:
            self._accumulate(parts)
            return
        if self.graph is None and self.warm_steps < WARMUP_STEPS:
            with self._on_side_stream():
                self._accumulate(parts)
            self.warm_steps += 1
            return
        if self.graph is None:
            self._capture(parts)
            if self.graph is None:  # the capture failed: this trainer steps eagerly from now on
                self._accumulate(parts)
                return
        assert self.graph is not None
        self.graph.replay()
        self.replays += 1

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        assert self.side_stream is not None
        self.side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side_stream):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.side_stream)

    def _capture(self, parts: StepParts) -> None:
        """Record one step on the static buffers. Capturing runs nothing: the replay that
        follows is this batch's step."""
        assert self.generator is not None
        before = self.generator.get_state()  # seed and offset
        self.sgd.zero_grad()  # the gradients are allocated in the graph's memory pool
        try:
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph):
                self._accumulate(parts)
        except Exception as err:  # noqa: BLE001 - reported, and the step runs eagerly instead
            _CAPTURES["failed"] += 1
            # the error that broke the capture (an op that synchronised, say) is often the context
            # of the one ending it ("operation failed due to a previous error during capture")
            first = err.__cause__ or err.__context__
            logger.warning("CUDA graph capture of the training step failed (%s: %s%s); this kind of step runs "
                           "eagerly in this process (cuda-graphs = false avoids the attempt)", type(err).__name__, err,
                           "" if first is None else f"; raised first: {type(first).__name__}: {first}")
            self.capture = False
            fresh = torch.Generator(device=self.device)  # the capture may have left the old one mid-capture
            fresh.set_state(before)
            self.generator = fresh
            self.transform.generator = fresh
            self.sgd.zero_grad()
            return
        _CAPTURES["captured"] += 1
        self.graph = graph


def round_key(model: nn.Module, data: ClientData, cfg: RunConfig, *, device: torch.device, state: ClientState,
              received: Received, cache_teacher: bool = True, capture: bool = True) -> tuple[tuple[Any, ...], Objective]:
    """The trainer this round needs (:func:`trainer_key`, and whether it captures), with the
    round's objective (built with fixed shapes for this client, holding what it kept)."""
    counts = torch.bincount(to_device(data.y, device), minlength=data.num_classes)
    objective = build_objective(cfg.to_flower(), ObjectiveContext(counts, fixed_shapes=True))
    objective.load_client_state(state.of("method"))
    received.param_names = [name for name, p in model.named_parameters() if p.requires_grad]
    probe = LocalSGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    signature = round_optimizer(cfg, probe, received).graph_signature()
    return (*trainer_key(model, data, cfg, objective, signature, device, cache_teacher), capture), objective


def train_graphed(model: nn.Module, data: ClientData, cfg: RunConfig, *, device: torch.device,
                  generator: torch.Generator, state: ClientState, received: Received, cache_teacher: bool = True,
                  capture: bool = True) -> TrainResult:
    """:func:`~fedvls_flwr.algorithms.training.train_local` with the step replayed as a CUDA
    graph (``capture=False``: the same static-buffer path, every step eager; what the CPU tests
    run). ``model`` holds the received weights and ends holding the trained ones."""
    prepare_model(model, device, use_channels_last(cfg, device))  # where the eager loop leaves it too
    key, objective = round_key(model, data, cfg, device=device, state=state, received=received,
                               cache_teacher=cache_teacher, capture=capture)
    with _LOCK:
        trainer = _TRAINERS.pop(key, None)  # taken out while in use: another thread builds its own
    if trainer is None:
        plan = teacher_plan(objective, model, data.mean is not None and cfg.augment, cache_teacher)
        previous = objective.teacher_output == "projections" and objective.previous_model is not None
        trainer = GraphedTrainer(model, data, cfg, device, objective, plan, previous, capture)
    try:
        return trainer.train(model, data, cfg, generator, state, objective, received)
    finally:
        with _LOCK:
            if key not in _TRAINERS:
                _TRAINERS[key] = trainer
            _TRAINERS.move_to_end(key)
            while len(_TRAINERS) > MAX_TRAINERS:
                _TRAINERS.popitem(last=False)
