"""The local objective's interface, shared helpers and FedAvg's plain cross-entropy.

Plain PyTorch; no Flower import. The formulas, their papers and where the authors' code
differs are in docs/methods.md. Each objective declares itself, with its run-config keys, in
its spec beside its module (``<module>_spec.py``); :mod:`fedvls_flwr.algorithms.build` hands it
exactly those keys (kebab-case, as users write them), already checked against their declared
rules, and an :class:`~fedvls_flwr.algorithms.parts.ObjectiveContext`.

Conventions
-----------
* ``logits``: (B, C) float tensor of the local model; ``targets``: (B,) int64 labels;
  ``teacher_logits``: (B, C) logits of the frozen global model (detached here).
* Every objective returns ``(loss, terms)``: ``loss`` is a scalar with grad, ``terms`` maps
  each name of ``term_names`` to a detached scalar tensor holding that term's *weighted
  contribution* to ``loss`` (so ``sum(terms.values()) == loss`` up to rounding). Disabled
  terms are reported as 0 so that every client returns the same keys.
* The training loop's hot path is split in two: :meth:`Objective.prepare_teacher` turns
  the teacher's logits into what the loss needs of them, row by row (so it can run once
  per round on the client's whole data and be sliced per batch), and
  :meth:`Objective.loss_terms` returns the loss and all terms as one detached (K,)
  tensor, without validation or a dict per step.
* FedVLS computes its value and its gradient in one fused autograd function
  (:class:`_FusedFedVLS`): a few dozen tiny ops of autograd bookkeeping per step would
  otherwise cost more than the MLP's matrix products. The loop references in
  ``tests/test_objectives.py`` check values and gradients of both forms.
* Everything derived from the client's class counts is computed once, in the constructor,
  on the device of ``class_counts``. The per-step code is vectorised and free of host syncs
  (no ``.item()``, no boolean indexing, no Python loops over classes or samples).
* Half / bfloat16 logits are upcast to float32; float32 / float64 are kept.
* Removed classes are masked with a finite constant (``MASK_VALUE``) rather than ``-inf``,
  so that values and gradients stay finite in every degenerate case.
* A CUDA graph of the step (:mod:`fedvls_flwr.algorithms.graphed`) keeps one objective for
  every client of the same :meth:`Objective.graph_signature` and copies each client's values
  into it (:meth:`Objective.load_client`): everything the step reads that depends on the
  client is one of the tensors named in ``client_tensors``, of a shape fixed by the number of
  classes. Objectives whose eager step selects classes by index (FedVLS) or splits the batch
  by class (FedMR) compute the same values with masks when built with
  ``ObjectiveContext(fixed_shapes=True)``.
* State kept between rounds (MOON's previous local model) is the objective's client state:
  :meth:`Objective.load_client_state` before the round, :meth:`Objective.client_state` after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedvls_flwr.algorithms.parts import ObjectiveContext, StateDict, build_part, keeps_nothing
from fedvls_flwr.config.registry import method_settings

__all__ = [
    "MASK_VALUE", "PRIOR_EPS", "Objective", "FedAvgObjective", "as_float", "build_objective", "kl_log", "objective_for",
]

#: Finite stand-in for -inf: a masked logit contributes exp(MASK_VALUE - max) == 0 exactly.
MASK_VALUE = -1e9
#: Epsilon added to the prior inside logs (the FedVLS authors' code; docs/methods.md).
PRIOR_EPS = 1e-9

def as_float(x: Tensor) -> Tensor:
    """Upcast half-precision logits; keep float32 / float64 as they are."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    if not x.is_floating_point():
        raise TypeError(f"logits must be a floating point tensor, got {x.dtype}")
    return x


def kl_log(log_p_teacher: Tensor, log_p_student: Tensor) -> Tensor:
    """KL(p_teacher || p_student) from log-probabilities, summed over classes, batch mean."""
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)


#: What the training loop computes with the frozen teacher for ``prepare_teacher``: the
#: "logits" of the received global model, or "projections" (MOON: the projections of the
#: global model and of this client's previous local model, side by side).
TeacherOutput = Literal["logits", "projections"]
#: What ``loss_terms`` needs of the model besides its logits: "penultimate" (the classifier's
#: input) or "projection" (the output of MOON's projection head).
Features = Literal["penultimate", "projection"]


class Objective:
    """Base class. Subclasses implement :meth:`_compute`.

    The class attributes below are the hooks the training loop reads; everything else about a
    method (its label, its settings, a wrapper of its network) is its spec
    (:class:`fedvls_flwr.config.spec.Part`, beside its module).
    """

    name: ClassVar[str] = ""
    term_names: ClassVar[tuple[str, ...]] = ()
    teacher_output: ClassVar[TeacherOutput] = "logits"
    features: ClassVar[Features | None] = None
    #: Whether this client's loss reads the teacher (set per instance: FedVLS needs it only
    #: with at least two vacant classes).
    needs_teacher: bool = False
    #: The attributes holding what the step reads of the client (tensors derived from its class
    #: counts, shaped by the number of classes only): what :meth:`load_client` copies.
    client_tensors: ClassVar[tuple[str, ...]] = ()
    #: This client's model after its previous round, when the teacher reads it
    #: (``teacher_output = "projections"``, MOON): restored from the client state, None the first time.
    previous_model: StateDict | None = None

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        counts = torch.as_tensor(context.class_counts)
        if counts.dim() != 1 or counts.numel() == 0:
            raise ValueError(f"class_counts must be a non-empty 1-D tensor, got shape {tuple(counts.shape)}")
        if counts.is_floating_point():
            if not torch.all(counts == counts.round()):
                raise ValueError("class_counts must hold integer counts")
            counts = counts.long()
        else:
            counts = counts.long()
        if bool((counts < 0).any()):
            raise ValueError("class_counts must be non-negative")
        total = int(counts.sum())
        if total <= 0:
            raise ValueError("class_counts must sum to a positive number (the client holds no sample)")
        self.settings = settings
        self.fixed_shapes = context.fixed_shapes
        self.device = counts.device
        self.class_counts = counts
        self.num_classes = int(counts.numel())
        self.num_samples = total
        self.present = counts > 0  # (C,) bool
        self.vacant = ~self.present
        self.present_idx = torch.nonzero(self.present).flatten()
        self.vacant_idx = torch.nonzero(self.vacant).flatten()
        self.num_vacant = int(self.vacant_idx.numel())
        # prior p(c) in float64; cast per dtype lazily (cached)
        self.prior = counts.double() / float(total)
        self._cache: dict[tuple[str, torch.dtype], Tensor] = {}

    # -- helpers -------------------------------------------------------------------------
    def _buf(self, key: str, dtype: torch.dtype) -> Tensor:
        """Return the float64 buffer ``self.<key>`` cast to ``dtype`` (cached)."""
        ck = (key, dtype)
        t = self._cache.get(ck)
        if t is None:
            t = getattr(self, key).to(dtype)
            self._cache[ck] = t
        return t

    # -- CUDA graphs -----------------------------------------------------------------------
    def graph_signature(self) -> tuple[Any, ...]:
        """Everything about this objective that shapes a captured step, besides the values of
        its ``client_tensors``: two clients with the same signature can share one CUDA graph."""
        return (type(self).__name__, tuple(sorted(self.settings.items())), self.num_classes, self.needs_teacher)

    def load_client(self, other: Objective) -> None:
        """Make this objective compute ``other``'s loss (built for another client, same
        :meth:`graph_signature`) by copying its per-client tensors into this one's, in place,
        together with their cached casts (:meth:`_buf`)."""
        if other.graph_signature() != self.graph_signature():
            raise ValueError(f"cannot load a client of {other.graph_signature()} into {self.graph_signature()}")
        with torch.no_grad():
            for name in self.client_tensors:
                getattr(self, name).copy_(getattr(other, name))
            for (name, dtype), cast in self._cache.items():
                cast.copy_(getattr(other, name).to(dtype))
        self.class_counts, self.num_samples = other.class_counts, other.num_samples

    # -- public API ----------------------------------------------------------------------
    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """What this loss needs of the frozen teacher, per sample (None if nothing).

        Row ``i`` depends only on sample ``i`` (its teacher logits and its label), so the
        result for a client's whole data can be computed once and indexed per batch.
        """
        return None

    @property
    def teacher_mode(self) -> str:
        """Mode the frozen teacher runs in ("eval" or "train")."""
        return str(self.settings.get("teacher-mode", "eval"))

    def bind_global(self, model: torch.nn.Module) -> None:
        """Called once per round before training, while ``model`` holds the received global
        weights (FedProx keeps a copy of them, in place when it already has one: a graphed step
        reads it from the same tensors every round)."""

    # -- client state ------------------------------------------------------------------------
    def load_client_state(self, state: StateDict) -> None:
        """What this objective kept in the node's last round (empty the first time); the default
        keeps nothing."""
        keeps_nothing(self, state)

    def client_state(self, trained: torch.nn.Module) -> StateDict:
        """What to keep for the node's next round, given the model this round trained; the
        default keeps nothing."""
        return {}

    def after_backward(self, params: list[torch.nn.Parameter]) -> Tensor | None:
        """Called after every backward pass: a term that acts on the weights rather than the
        logits adds its gradient to ``params``' gradients here and returns its value as a
        detached (K,) tensor (zeros elsewhere) to add to the step's terms; None otherwise."""
        return None

    def loss_terms(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None = None, features: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The hot path: ``(loss, terms)``, ``terms`` a detached (K,) tensor in
        ``term_names`` order. ``teacher``: rows of :meth:`prepare_teacher` for this batch;
        ``features``: what :attr:`features` names, for this batch.
        No input validation (see :meth:`__call__`).

        Under mixed precision (``amp``) only the model runs in bfloat16: the loss is computed
        in float32 with autocast off, so the feature terms' matrix products (FedMR's Gram
        matrices, FedDecorr's correlations) keep the precision their authors computed in."""
        device_type = logits.device.type
        if torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type, enabled=False):
                return self.loss_terms(as_float(logits), targets, teacher,
                                       None if features is None else as_float(features))
        if features is None:
            terms = self._compute(as_float(logits), targets, teacher)
        else:
            terms = self._compute_with_features(as_float(logits), targets, teacher, features)
        values = list(terms.values())
        loss = values[0]
        for t in values[1:]:
            loss = loss + t
        if len(values) == 1:
            return loss, loss.detach().reshape(1)
        return loss, torch.stack([t.detach() for t in values])

    def __call__(
        self, logits: Tensor, targets: Tensor, teacher_logits: Tensor | None = None, features: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Checked entry point: the loss and a dict of its terms, from the raw teacher output
        (logits, or MOON's projections)."""
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits must have shape (B, {self.num_classes}), got {tuple(logits.shape)}"
            )
        if targets.shape != logits.shape[:1]:
            raise ValueError(
                f"targets must have shape ({logits.shape[0]},), got {tuple(targets.shape)}"
            )
        teacher = None
        if self.needs_teacher:
            if teacher_logits is None:
                raise ValueError(f"objective {self.name!r} needs teacher_logits")
            if self.teacher_output == "logits" and teacher_logits.shape != logits.shape:
                raise ValueError(
                    f"teacher_logits must have shape {tuple(logits.shape)}, got {tuple(teacher_logits.shape)}"
                )
            teacher = self.prepare_teacher(teacher_logits, targets)
        if self.features is not None and features is None:
            raise ValueError(f"objective {self.name!r} needs the model's {self.features} features")
        loss, terms = self.loss_terms(logits, targets, teacher, features)
        return loss, dict(zip(self.term_names, terms.unbind()))

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        raise NotImplementedError

    def _compute_with_features(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None, features: Tensor
    ) -> dict[str, Tensor]:
        """The loss terms of an objective that reads the model's :attr:`features` too."""
        return self._compute(logits, targets, teacher)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_classes={self.num_classes}, vacant={self.num_vacant}, "
            f"needs_teacher={self.needs_teacher}, settings={self.settings})"
        )


class FedAvgObjective(Objective):
    """Plain cross-entropy."""

    name = "fedavg"
    term_names = ("ce",)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(logits, targets)}


def build_objective(values: Mapping[str, Any], context: ObjectiveContext) -> Objective:
    """The objective a run config (``values``) selects, built for a client (``context``)."""
    return build_part("method", values, context, Objective)


def objective_for(method: str, class_counts: Tensor, settings: Mapping[str, Any] | None = None) -> Objective:
    """The objective of ``method`` for a client with ``class_counts`` (C,), with ``settings``
    (some or all of the method's keys; defaults for the others): for the tests, which name the
    method and its keys directly. A key no objective declares is an error, so a typo in a test
    cannot pass for a default."""
    known = {s.key for s in method_settings()}
    unknown = sorted(set(settings or {}) - known)
    if unknown:
        raise ValueError(f"unknown objective setting(s) {unknown}; known: {sorted(known)}")
    return build_objective({**(settings or {}), "method": method}, ObjectiveContext(class_counts))
