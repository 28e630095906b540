"""Local training and evaluation loops: plain PyTorch on in-memory tensors.

Batches are taken by index from tensors already on the training device (no DataLoader,
no per-sample Python), loss sums stay on the device and are read once at the end, so a
GPU is not synchronised every step.

GPU path: the client's data are copied to the GPU once per round (from pinned memory,
non-blocking), augmentation runs there on whole batches with its random draws taken on the
GPU from a generator seeded from the client's (:mod:`fedvls_flwr.data.augment`), the
teacher's forward pass runs under ``torch.no_grad``, and with ``amp`` on the forward passes
run under ``torch.autocast`` with bfloat16 (bfloat16 has float32's exponent range, so no
GradScaler is needed; the objective turns autocast off and computes in float32 from upcast
logits and features); ``channels-last`` keeps a conv net's tensors in that memory format. With
``cuda-graphs`` (the default) the step is captured once per process and replayed
(:mod:`fedvls_flwr.algorithms.graphed`): the same computation without launching every kernel
from Python. On a CPU device ``amp`` is ignored (logged once per process when asked for),
and the loop is plain float32, its random draws on the CPU generator.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from fedvls_flwr.algorithms.batchnorm import batch_bounds, has_batchnorm
from fedvls_flwr.algorithms.device import use_amp, use_channels_last
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.local_optim import LocalOptimizer, build_local_optimizer
from fedvls_flwr.algorithms.objectives.base import Objective, build_objective
from fedvls_flwr.algorithms.parts import ClientState, LocalOptimizerContext, ObjectiveContext
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.augment import BatchTransform, make_batch_transform
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import FeatureTap, ProjectionModel

logger = logging.getLogger(__name__)

_AMP_CPU_LOGGED = False


class NonFiniteLossError(RuntimeError):
    """Local training produced a NaN/inf loss; the update must not be sent."""


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError(
                "device = 'cuda' was requested but torch sees no CUDA device here; "
                "use device = 'auto' or 'cpu'"
            )
        return torch.device("cuda")
    return torch.device("cpu")


def autocast_context(device: torch.device, amp: bool, cache: bool = True) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on CUDA when ``amp``; a no-op otherwise (CPU: logged once).
    ``cache=False``: no cache of cast weights (what a CUDA graph's capture needs)."""
    global _AMP_CPU_LOGGED
    if amp and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16, cache_enabled=cache)
    if amp and not _AMP_CPU_LOGGED:
        _AMP_CPU_LOGGED = True
        logger.warning("amp = true is ignored on device %s: mixed precision is used on CUDA only", device)
    return contextlib.nullcontext()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move ``t`` to ``device``; to a GPU via a pinned staging copy and a non-blocking transfer."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class TrainResult:
    num_examples: int
    loss: float
    terms: dict[str, float] = field(default_factory=dict)
    num_vacant: int = 0
    class_counts: list[int] = field(default_factory=list)
    steps: int = 0


def make_teacher(model: nn.Module, mode: str) -> nn.Module:
    """A frozen copy of ``model`` (the received global model, or the previous local one)."""
    teacher = copy.deepcopy(model)
    teacher.train(mode == "train")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _teacher_output(objective: Objective, global_model: nn.Module, previous: nn.Module | None) -> Callable:
    """The function of a batch whose output objective.prepare_teacher takes."""
    if objective.teacher_output == "logits":
        return global_model
    projected = cast(ProjectionModel, global_model)
    if previous is None:
        return lambda xb: projected.project(xb)[1]
    before = cast(ProjectionModel, previous)
    return lambda xb: torch.cat([projected.project(xb)[1], before.project(xb)[1]], dim=1)


@dataclass
class TeacherRows:
    """What the loss needs of the frozen teacher (the received global model; for MOON also
    this client's previous model), per sample.

    It enters the loss only through ``objective.prepare_teacher``, row by row. When the
    teacher's output for a sample is the same every epoch (no augmentation, and eval mode or
    a model without train-mode behaviour) it is computed once per round for the whole local
    data (``rows``); otherwise per batch (``forward``).
    """

    objective: Objective
    rows: torch.Tensor | None = None
    forward: Callable | None = None

    @classmethod
    def build(cls, objective: Objective, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              transform: BatchTransform, autocast: contextlib.AbstractContextManager, cfg: RunConfig,
              device: torch.device, cache: bool) -> TeacherRows:
        if not objective.needs_teacher:
            return cls(objective)
        previous = None
        if objective.teacher_output == "projections" and objective.previous_model is not None:
            previous = make_teacher(model, "eval")
            previous.load_state_dict(objective.previous_model)
            previous.to(device)
        train_mode = objective.teacher_mode == "train"
        deterministic = not transform.augments and not (train_mode and mode_dependent(model))
        if cache and deterministic:
            # the model still holds the received global weights: it is the teacher here
            model.train(train_mode)
            with autocast:
                out_all = _predict(_teacher_output(objective, model, previous), x, transform, cfg.eval_batch_size)
            return cls(objective, rows=objective.prepare_teacher(out_all, y))
        return cls(objective, forward=_teacher_output(objective, make_teacher(model, objective.teacher_mode), previous))

    def batch(self, idx: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
              autocast: contextlib.AbstractContextManager) -> torch.Tensor | None:
        if self.rows is not None:
            return self.rows[idx]
        return self.forward_batch(xb, yb, autocast)

    def forward_batch(self, xb: torch.Tensor, yb: torch.Tensor,
                      autocast: contextlib.AbstractContextManager) -> torch.Tensor | None:
        """The rows of the batch ``xb`` (already transformed) from the teacher's forward pass;
        None when the rows are cached (:attr:`rows`) or the loss reads no teacher."""
        if self.forward is None:
            return None
        with torch.no_grad(), autocast:
            return self.objective.prepare_teacher(self.forward(xb), yb)


def augmentation_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The generator the augmentation draws from: the client's CPU generator on a CPU (as
    always), and on a GPU a generator there seeded with the client's seed, so the draws need no
    transfer and can be captured in a CUDA graph (the same images for the same seed)."""
    if device.type == "cpu" or generator is None:
        return generator
    return torch.Generator(device=device).manual_seed(generator.initial_seed())


def prepare_model(model: nn.Module, device: torch.device, channels_last: bool) -> nn.Module:
    """``model`` on ``device``; a conv net in the channels-last memory format when asked."""
    model.to(device)
    if channels_last and _has_conv(model):
        # torch < 2.14's stubs lack Module.to's memory_format overload (it works at run time)
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload, unused-ignore]
    return model


def _has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


@dataclass
class StepParts:
    """What one local step reads besides the batch: the network, the objective and its
    teacher, the local optimizer driving the SGD update, the autocast context, the feature tap.
    The eager loop and the CUDA graph's capture run the same :func:`local_step` on them."""

    model: nn.Module
    objective: Objective
    teacher: TeacherRows
    sgd: LocalSGD
    optimizer: LocalOptimizer
    autocast: contextlib.AbstractContextManager
    tap: FeatureTap | None = None
    transform: BatchTransform | None = None
    channels_last: bool = False


def local_step(parts: StepParts, xb: torch.Tensor, yb: torch.Tensor, teacher_rows: torch.Tensor | None) -> torch.Tensor:
    """One optimizer step on a batch (raw ``xb`` as stored, labels ``yb``, the teacher's
    prepared rows when they are cached per round); its loss terms (detached, on the device)."""
    if parts.transform is not None:
        xb = parts.transform(xb)
    if parts.channels_last and xb.dim() == 4:
        xb = xb.contiguous(memory_format=torch.channels_last)
    teacher_b = teacher_rows if teacher_rows is not None else parts.teacher.forward_batch(xb, yb, parts.autocast)
    objective, model, sgd, tap, autocast = parts.objective, parts.model, parts.sgd, parts.tap, parts.autocast

    def closure() -> torch.Tensor:
        sgd.zero_grad()
        with autocast:
            features: torch.Tensor | None
            if objective.features == "projection":
                logits, features = cast(ProjectionModel, model).project(xb)
            else:
                logits = model(xb)
                features = tap.take() if tap is not None else None
            loss, terms = objective.loss_terms(logits, yb, teacher_b, features)
        loss.backward()
        extra = objective.after_backward(sgd.params)
        return terms if extra is None else terms + extra.to(terms.dtype)

    return parts.optimizer.step(closure)


def keep_client_state(state: ClientState, objective: Objective, optimizer: LocalOptimizer, trained: nn.Module) -> None:
    """What the local training's parts keep for the node's next round (MOON's model, carried momentum)."""
    state.keep("method", objective.client_state(trained))
    state.keep("local-optimizer", optimizer.client_state())


def round_optimizer(cfg: RunConfig, sgd: LocalSGD, received: Received) -> LocalOptimizer:
    """The run's local optimizer driving ``sgd`` this round, with what the server sent."""
    context = LocalOptimizerContext(sgd, received, carry_momentum=cfg.optimizer_state == "carry")
    return build_local_optimizer(cfg.to_flower(), context)


def train_local(
    model: nn.Module,
    data: ClientData,
    cfg: RunConfig,
    *,
    device: torch.device,
    generator: torch.Generator,
    state: ClientState | None = None,
    cache_teacher: bool = True,
    received: Received | None = None,
) -> TrainResult:
    """Train ``model`` (holding the global weights) in place on a client's ``data`` with the
    configured objective and local optimizer.

    ``generator`` (CPU) fixes the batch order and the augmentation draws, so a run is
    reproducible from its seed. Batches are consecutive slices of ``batch-size`` of each
    epoch's shuffled order; for a BatchNorm model a last batch of fewer than half a batch
    joins the one before, and fewer than 2 samples raise TooFewSamplesError (batchnorm.py).
    ``cfg.augment`` only has an effect on uint8 image data
    (``data.mean``/``data.std`` given); data stored normalised pass through unchanged.
    ``cfg.amp`` enables bfloat16 autocast when ``device`` is CUDA (see the module docstring).
    ``cache_teacher=False`` forces the teacher's forward pass on every batch (the reference
    the once-per-round cache is tested against). ``state``: what the objective and the local
    optimizer keep on the node between rounds (MOON's previous model, carried momentum), read
    and updated in place. ``received``: what the server sent besides the weights for the run's
    local optimizer (FedGF's perturbed global point and c).
    """
    state = state if state is not None else ClientState()
    received = received if received is not None else Received()
    if device.type == "cuda" and cfg.cuda_graphs:
        from fedvls_flwr.algorithms.graphed import train_graphed

        return train_graphed(model, data, cfg, device=device, generator=generator, state=state,
                             cache_teacher=cache_teacher, received=received)
    channels_last = use_channels_last(cfg, device)
    prepare_model(model, device, channels_last)
    x, y = to_device(data.x, device), to_device(data.y, device)
    # BatchNorm: no step on a tiny last batch (it joins the one before; see batchnorm.py)
    bounds = batch_bounds(x.shape[0], cfg.batch_size, batchnorm=has_batchnorm(model))
    counts = torch.bincount(y, minlength=data.num_classes)
    parts = _step_parts(model, data, cfg, state, received, x, y, counts, generator, device, cache_teacher,
                        channels_last)
    try:
        term_sums, steps = _epochs(parts, x, y, bounds, cfg, generator, device)
    finally:
        if parts.tap is not None:
            parts.tap.remove()
    keep_client_state(state, parts.objective, parts.optimizer, model)
    return round_result(term_sums, steps, x.shape[0], cfg, parts.objective, counts)


def _step_parts(model: nn.Module, data: ClientData, cfg: RunConfig, state: ClientState, received: Received,
                x: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, generator: torch.Generator,
                device: torch.device, cache_teacher: bool, channels_last: bool) -> StepParts:
    """The round's objective (with what it kept), its teacher, the SGD update and the local
    optimizer driving it (with the momentum it kept), the transform and the feature tap."""
    values = cfg.to_flower()
    objective = build_objective(values, ObjectiveContext(counts))
    objective.load_client_state(state.of("method"))
    transform = make_batch_transform(data.mean, data.std, train=True, augment=cfg.augment, generator=generator)
    transform.generator = augmentation_generator(transform.generator, device)
    autocast = autocast_context(device, use_amp(cfg, device))
    objective.bind_global(model)
    teacher = TeacherRows.build(objective, model, x, y, transform, autocast, cfg, device, cache_teacher)
    # torch.optim.SGD's update without torch.optim's import cost (see sgd.py)
    sgd = LocalSGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    received.param_names = [name for name, p in model.named_parameters() if p.requires_grad]
    optimizer = round_optimizer(cfg, sgd, received)
    optimizer.load_client_state(state.of("local-optimizer"))
    tap = FeatureTap(model) if objective.features == "penultimate" else None
    return StepParts(model, objective, teacher, sgd, optimizer, autocast, tap, transform, channels_last)


def _epochs(parts: StepParts, x: torch.Tensor, y: torch.Tensor, bounds: list[tuple[int, int]], cfg: RunConfig,
            generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, int]:
    """``local-epochs`` passes over the data in the generator's order: the sum over samples of
    each loss term (``term_names`` order; the loss is their sum) and the number of steps."""
    rows = parts.teacher.rows
    parts.model.train()
    term_sums = torch.zeros(len(parts.objective.term_names), device=device)
    steps = 0
    n = x.shape[0]
    for _ in range(cfg.local_epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for start, stop in bounds:
            idx = order[start:stop]
            terms = local_step(parts, x[idx], y[idx], None if rows is None else rows[idx])
            term_sums.add_(terms, alpha=idx.shape[0])
            steps += 1
        check_finite(term_sums, cfg)
    return term_sums, steps


def check_finite(term_sums: torch.Tensor, cfg: RunConfig) -> None:
    """Stop a round whose loss became NaN or infinite (read once per epoch)."""
    if not torch.isfinite(term_sums).all():
        raise NonFiniteLossError(
            f"local loss became non-finite with method '{cfg.method}' (lr={cfg.lr}); the update was not sent"
        )


def round_result(term_sums: torch.Tensor, steps: int, n: int, cfg: RunConfig, objective: Objective,
                 counts: torch.Tensor) -> TrainResult:
    """The round's numbers: the mean of each loss term per sample and epoch, the client's labels."""
    means = (term_sums / (n * cfg.local_epochs)).tolist()
    return TrainResult(
        num_examples=n,
        loss=float(sum(means)),
        terms=dict(zip(objective.term_names, means)),
        num_vacant=int((counts == 0).sum()),
        class_counts=[int(c) for c in counts.tolist()],
        steps=steps,
    )


def mode_dependent(model: nn.Module) -> bool:
    """Whether the model computes differently in train mode (BatchNorm, dropout)."""
    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return any(isinstance(m, kinds) for m in model.modules())


@torch.no_grad()
def _predict(forward: Callable, x: torch.Tensor, transform: BatchTransform, batch_size: int) -> torch.Tensor:
    return torch.cat([forward(transform(x[i : i + batch_size])) for i in range(0, x.shape[0], batch_size)])


@dataclass
class EvalResult:
    accuracy: float
    loss: float
    per_class_accuracy: list[float]
    num_examples: int


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    device: torch.device,
    batch_size: int = 1024,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    amp: bool = False,
) -> EvalResult:
    """Top-1 accuracy, mean cross-entropy and per-class accuracy (NaN for absent classes);
    ``amp``: the forward passes under bfloat16 autocast on CUDA (the loss in float32). A model
    with a ``forward_rows`` method (FedConcat's, which keeps its frozen encoders' features of
    each test batch) is given each batch's rows and the way to make the batch instead."""
    model.to(device).eval()
    transform = make_batch_transform(mean, std, train=False, augment=False)
    correct = torch.zeros(num_classes, device=device)
    total = torch.zeros(num_classes, device=device)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    autocast = autocast_context(device, amp)
    by_rows = getattr(model, "forward_rows", None)
    for start in range(0, x.shape[0], batch_size):
        stop = start + batch_size

        def batch(start: int = start, stop: int = stop) -> torch.Tensor:
            return transform(x[start:stop].to(device, non_blocking=True))

        yb = y[start:stop].to(device, non_blocking=True)
        with autocast:
            if by_rows is not None:
                logits = by_rows(x, start, min(stop, x.shape[0]), batch, (mean, std, str(device), amp))
            else:
                logits = model(batch())
        logits = logits.float()
        loss_sum += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
        hit = (logits.argmax(dim=1) == yb).float()
        correct.index_add_(0, yb, hit)
        total.index_add_(0, yb, torch.ones_like(hit))
    n = int(total.sum())
    per_class = (correct / total).tolist()  # 0/0 -> nan for classes absent from the test set
    return EvalResult(
        accuracy=float(correct.sum()) / max(n, 1),
        loss=float(loss_sum) / max(n, 1),
        per_class_accuracy=[float(v) for v in per_class],
        num_examples=n,
    )
