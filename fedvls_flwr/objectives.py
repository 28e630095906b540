"""Local training objectives: FedAvg, FedLC, FedNTD, FedVLS (bounded and paper forms).

Plain PyTorch; no Flower import. The formulas, their papers and where the authors' code
differs are in docs/methods.md. Each objective is registered, with its run-config keys, in
:mod:`fedvls_flwr.methods`; :func:`build_objective` hands it exactly those keys (kebab-case,
as users write them), already checked against their declared rules.

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
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "MASK_VALUE",
    "PRIOR_EPS",
    "Objective",
    "FedAvgObjective",
    "FedLCObjective",
    "FedNTDObjective",
    "FedVLSObjective",
    "FedVLSPaperObjective",
    "build_objective",
]

#: Finite stand-in for -inf: a masked logit contributes exp(MASK_VALUE - max) == 0 exactly.
MASK_VALUE = -1e9
#: Epsilon added to the prior inside logs (the FedVLS authors' code; docs/methods.md).
PRIOR_EPS = 1e-9

def _as_float(x: Tensor) -> Tensor:
    """Upcast half-precision logits; keep float32 / float64 as they are."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    if not x.is_floating_point():
        raise TypeError(f"logits must be a floating point tensor, got {x.dtype}")
    return x


def _kl_log(log_p_teacher: Tensor, log_p_student: Tensor) -> Tensor:
    """KL(p_teacher || p_student) from log-probabilities, summed over classes, batch mean."""
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)


class Objective:
    """Base class. Subclasses implement :meth:`_compute`."""

    name: str = ""
    needs_teacher: bool = False
    term_names: tuple[str, ...] = ()
    #: What the training loop computes with the frozen teacher for prepare_teacher:
    #: "logits" of the received global model, or "projections" (MOON: the projections of
    #: the global model and of this client's previous local model, side by side).
    teacher_output: str = "logits"
    #: What loss_terms needs of the model besides its logits: None, "penultimate" (the
    #: classifier's input) or "projection" (MOON's projection head output).
    features: str | None = None

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        counts = torch.as_tensor(class_counts)
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
        self.params = params
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
        return str(self.params.get("teacher-mode", "eval"))

    def bind_global(self, model: torch.nn.Module) -> None:
        """Called once per round before training, while ``model`` holds the received global
        weights (FedProx keeps a copy of them)."""

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
        No input validation (see :meth:`__call__`)."""
        if features is None:
            terms = self._compute(_as_float(logits), targets, teacher)
        else:
            terms = self._compute(_as_float(logits), targets, teacher, features=features)
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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_classes={self.num_classes}, vacant={self.num_vacant}, "
            f"needs_teacher={self.needs_teacher}, params={self.params})"
        )


class FedAvgObjective(Objective):
    """Plain cross-entropy."""

    name = "fedavg"
    term_names = ("ce",)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(logits, targets)}


class FedLCObjective(Objective):
    """Cross-entropy on f_c - tau * n_c^(-1/4); classes with n_c = 0 are masked out.

    ``standard``: the label stays in the softmax denominator (plain CE on shifted logits).
    ``paper``: -z_y + log sum_{c != y} exp(z_c) (FedLC paper; unbounded below). If no class
    other than y is left (a client holding one class) the empty sum is represented by the
    finite mask, giving a large negative but finite loss.
    """

    name = "fedlc"
    term_names = ("ce",)

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.form = params["fedlc-form"]
        n = self.class_counts.double().clamp(min=1.0)  # clamp: never 0^(-1/4)
        self.margin = torch.where(
            self.present, params["fedlc-tau"] * n.pow(-0.25), torch.zeros_like(n)
        )  # (C,) float64

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        z = torch.where(self.present, logits - self._buf("margin", logits.dtype), MASK_VALUE)
        if self.form == "standard":
            return {"ce": F.cross_entropy(z, targets)}
        z_y = z.gather(1, targets[:, None]).squeeze(1)
        is_y = F.one_hot(targets, self.num_classes).bool()
        lse_rest = torch.logsumexp(torch.where(is_y, MASK_VALUE, z), dim=1)
        return {"ce": (lse_rest - z_y).mean()}


class FedNTDObjective(Objective):
    """CE + beta * tau^2 * KL(softmax(g_{!=y}/tau) || softmax(f_{!=y}/tau)), batch mean."""

    name = "fedntd"
    term_names = ("ce", "ntd")

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        if self.num_classes < 2:
            raise ValueError("FedNTD needs at least 2 classes")
        self.beta = float(params["fedntd-beta"])
        self.tau = float(params["fedntd-tau"])
        # the teacher can change the loss only through the beta-weighted term
        self.needs_teacher = self.beta != 0.0
        self._cols = torch.arange(self.num_classes - 1, device=self.device)  # (C-1,)

    def _not_true(self, x: Tensor, targets: Tensor) -> Tensor:
        # column j of row i -> class j if j < y_i else j + 1 (drops the true class y_i)
        idx = self._cols[None, :] + (self._cols[None, :] >= targets[:, None]).long()
        return x.gather(1, idx)

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """log softmax(g_{!=y} / tau): the teacher's not-true distribution of each sample."""
        if not self.needs_teacher:
            return None
        g = _as_float(teacher_logits.detach())
        return F.log_softmax(self._not_true(g, targets) / self.tau, dim=1)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None:  # beta == 0
            return {"ce": ce, "ntd": logits.new_zeros(())}
        log_f_nt = F.log_softmax(self._not_true(logits, targets) / self.tau, dim=1)
        kl = _kl_log(teacher.to(logits.dtype), log_f_nt)
        return {"ce": ce, "ntd": (self.beta * self.tau**2) * kl}


class FedVLSObjective(Objective):
    """FedVLS, the authors' bounded form (default).

    L = CE(f + log(p + 1e-9), y)
        + lambda_dis * KL(q_g || q)            (softmaxes over the vacant classes, batch mean)
        + logit_weight * sum_c p(c) L^c,
    L^c = log((sum_{i: y_i != c} exp(z_ic) + #{i: y_i = c}) / B),
    z_c = f_c - log(p(c) + 1e-9) + log(1/C).  Vacant classes have p(c) = 0 and are skipped.

    Value and gradient come from :class:`_FusedFedVLS` (one autograd node per step).
    """

    name = "fedvls"
    term_names = ("cal", "dis", "logit")
    paper = False
    logit_weight_key = "logit-weight"

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.lambda_dis = float(params["lambda-dis"])
        self.logit_weight = float(params[self.logit_weight_key])
        self.use_dis = bool(params["use-dis"]) and self.num_vacant >= 2 and self.lambda_dis != 0.0
        self.use_logit = bool(params["use-logit"]) and self.logit_weight != 0.0
        self.needs_teacher = self.use_dis
        C = self.num_classes
        log_prior_eps = torch.log(self.prior + PRIOR_EPS)  # (C,) float64
        if self.paper:
            # literal eq. 2: log p(c) for present classes; vacant classes leave the softmax
            self.cal_bias = torch.where(self.present, torch.log(self.prior.clamp(min=1e-300)), MASK_VALUE)
        else:
            self.cal_bias = log_prior_eps
        # L_logit restricted to the present classes (p(c) = 0 elsewhere)
        self.all_present = self.num_vacant == 0
        self.logit_prior = self.prior[self.present_idx]  # (P,)
        self.weighted_prior = self.logit_weight * self.logit_prior  # (P,)
        self.logit_shift = (-log_prior_eps + math.log(1.0 / C))[self.present_idx]  # (P,)
        # sum_c p(c) over the present classes: 1 up to rounding, kept exact for the log(B) term
        self.prior_mass = float(self.logit_prior.sum())

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """Per sample: the teacher's softmax over the vacant classes, q_g (V columns), and
        sum_v q_g log q_g (one column), the part of the KL that the student cannot change."""
        if not self.use_dis:
            return None
        g = _as_float(teacher_logits.detach()).index_select(1, self.vacant_idx)
        log_q = F.log_softmax(g, dim=1)
        q = log_q.exp()
        return torch.cat([q, (q * log_q).sum(dim=1, keepdim=True)], dim=1)

    def loss_terms(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None = None, features: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        return _FusedFedVLS.apply(_as_float(logits), targets, teacher, self)

    # -- the three terms: value and gradient w.r.t. the logits, no autograd -------------
    def _cal(self, f: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        B = f.shape[0]
        log_p = F.log_softmax(f + self._buf("cal_bias", f.dtype), dim=1)
        rows = targets[:, None]
        value = log_p.gather(1, rows).sum().neg_().div_(B)
        grad = log_p.exp_()  # softmax
        grad.scatter_add_(1, rows, rows.new_full(rows.shape, -1, dtype=f.dtype))
        return value, grad.div_(B)

    def _dis(self, f: Tensor, teacher: Tensor, grad: Tensor) -> Tensor:
        """lambda * KL(q_g || softmax(f_O)), batch mean; adds its gradient into ``grad``."""
        B, V = f.shape[0], self.num_vacant
        q = teacher[:, :V].to(f.dtype)
        log_s = F.log_softmax(f.index_select(1, self.vacant_idx), dim=1)
        scale = self.lambda_dis / B
        value = (teacher[:, V].to(f.dtype).sum() - (q * log_s).sum()).mul_(scale)
        grad.index_add_(1, self.vacant_idx, log_s.exp_().sub_(q).mul_(scale))
        return value

    def _logit(self, f: Tensor, targets: Tensor, grad: Tensor) -> Tensor:
        """Bounded L_logit: samples of class c stay in class c's sum as exp(0) = 1."""
        B = f.shape[0]
        f_p = f if self.all_present else f.index_select(1, self.present_idx)  # (B, P)
        is_c = targets[:, None] == self.present_idx[None, :]  # (B, P): y_i == c
        z = (f_p + self._buf("logit_shift", f.dtype)).masked_fill_(is_c, 0.0)
        lse, soft = _logsumexp_softmax_dim0(z)
        w_prior = self._buf("weighted_prior", f.dtype)
        value = (w_prior * lse).sum() - self.logit_weight * self.prior_mass * math.log(B)
        # d lse_c / d z_ic = softmax over the samples; entries with y_i == c are constants
        self._add_present(grad, soft.mul_(w_prior).masked_fill_(is_c, 0.0))
        return value

    def _add_present(self, grad: Tensor, g_p: Tensor) -> None:
        if self.all_present:
            grad.add_(g_p)
        else:
            grad.index_add_(1, self.present_idx, g_p)


class FedVLSPaperObjective(FedVLSObjective):
    """FedVLS exactly as eqs. 2-5 of the paper (unbounded L_logit; default weight 1).

    L_cal: CE on f + log p(c) with vacant classes masked out of the softmax.
    L_logit^c = logsumexp_{i: y_i != c} f_ic - log B, classes without such a sample skipped,
    L_logit = logit_weight * sum_c p(c) L_logit^c.
    """

    name = "fedvls-paper"
    paper = True
    logit_weight_key = "paper-logit-weight"

    def _logit(self, f: Tensor, targets: Tensor, grad: Tensor) -> Tensor:
        B = f.shape[0]
        f_p = f if self.all_present else f.index_select(1, self.present_idx)  # (B, P)
        is_c = targets[:, None] == self.present_idx[None, :]  # (B, P)
        lse, soft = _logsumexp_softmax_dim0(f_p.masked_fill(is_c, MASK_VALUE))
        # a class with no sample y != c in the batch is skipped (its column is all masked)
        w_prior = self._buf("weighted_prior", f.dtype) * (~is_c.all(dim=0))
        value = (w_prior * (lse - math.log(B))).sum()
        self._add_present(grad, soft.mul_(w_prior))  # masked entries: exp(MASK - max) = 0
        return value


class FedProxObjective(Objective):
    """CE + (mu/2) ||w - w_global||^2 over the trainable parameters (Li et al., MLSys 2020).

    The proximal term acts on the weights, not the logits: its gradient mu (w - w_global)
    is added to the parameters' gradients after every backward pass (the same gradient as
    adding the term to the loss, as the PyTorch implementations do), and its value is
    reported as the term ``prox``.
    """

    name = "fedprox"
    term_names = ("ce", "prox")

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.mu = float(params["fedprox-mu"])
        self.anchor: list[Tensor] = []

    def bind_global(self, model: torch.nn.Module) -> None:
        self.anchor = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def after_backward(self, params: list[torch.nn.Parameter]) -> Tensor | None:
        if not self.anchor:
            raise RuntimeError("FedProxObjective.bind_global(model) must be called before training")
        with torch.no_grad():
            diff = torch._foreach_sub([p.detach() for p in params], self.anchor)
            value = 0.5 * self.mu * torch.stack(torch._foreach_norm(diff)).square().sum()
            if self.mu != 0.0:
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                torch._foreach_add_(grads, diff, alpha=self.mu)
                for p, g in zip(params, grads):
                    p.grad = g
        return torch.stack([value.new_zeros(()), value])

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(logits, targets), "prox": logits.new_zeros(())}


class FedRSObjective(Objective):
    """Restricted softmax (Li & Zhan, KDD 2021): CE on the logits with those of the classes
    the client does not hold scaled by alpha in (0, 1] (``fedrs-form = "binary"``, the form
    of the FedVLS and FedDecorr baselines), or every class c scaled by
    alpha + (1 - alpha) n_c / max_k n_k (``"proportional"``, the FedRS authors' code)."""

    name = "fedrs"
    term_names = ("ce",)

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        alpha = float(params["fedrs-alpha"])
        counts = self.class_counts.double()
        if params["fedrs-form"] == "binary":
            self.scale = torch.where(self.present, counts.new_ones(()), counts.new_full((), alpha))
        else:
            self.scale = alpha + (1 - alpha) * counts / counts.max()

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(logits * self._buf("scale", logits.dtype), targets)}


class MOONObjective(Objective):
    """CE + mu * l_con (Li, He, Song, CVPR 2021), on the projection z of the local model:

        l_con = -log( e^{sim(z, z_g)/tau} / (e^{sim(z, z_g)/tau} + e^{sim(z, z_prev)/tau}) ),

    sim the cosine similarity, z_g the projection of the received global model (the
    positive), z_prev that of this client's model after its previous local training (the
    negative); both frozen, in eval mode. A client training for the first time has no
    previous model: the term is 0 then, as in the MOON authors' code (its pool of previous
    models is empty in the first round).
    """

    name = "moon"
    term_names = ("ce", "con")
    teacher_output = "projections"
    features = "projection"

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.mu = float(params["moon-mu"])
        self.tau = float(params["moon-tau"])
        self.needs_teacher = self.mu != 0.0

    @property
    def teacher_mode(self) -> str:
        return "eval"

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """Unit-length z_g (and z_prev when there is a previous model), side by side."""
        if not self.needs_teacher:
            return None
        z = _as_float(teacher_logits.detach())
        halves = z.chunk(2, dim=1) if self.has_previous(z) else (z,)
        return torch.cat([F.normalize(h, dim=1) for h in halves], dim=1)

    def has_previous(self, teacher: Tensor) -> bool:
        return teacher.shape[1] == 2 * int(self.params["moon-projection-dim"])

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None, *, features: Tensor) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None or not self.has_previous(teacher):
            return {"ce": ce, "con": logits.new_zeros(())}
        z = F.normalize(_as_float(features), dim=1)
        z_g, z_prev = teacher.to(z.dtype).chunk(2, dim=1)
        sims = torch.stack([(z * z_g).sum(dim=1), (z * z_prev).sum(dim=1)], dim=1) / self.tau
        con = F.cross_entropy(sims, torch.zeros_like(targets))
        return {"ce": ce, "con": self.mu * con}


class FedLMDObjective(Objective):
    """Label-masking distillation (Lu et al., ACM MM 2023; the authors' ``LMD_Loss``):

        L = CE(f, y) + beta * T^2 * KL( softmax(g/T - 1000 [major] - 1000 [y]) || softmax(f/T - 1000 [y]) ),

    batch mean, g the frozen global model's logits. The "major" classes are those the
    client holds more samples of than its mean count over all C classes (zeros included),
    so the teacher distils only the client's minority and absent classes; the label is
    masked on both sides. The mask is the authors' additive -1000.
    """

    name = "fedlmd"
    term_names = ("ce", "lmd")
    MASK = 1000.0

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.beta = float(params["fedlmd-beta"])
        self.tau = float(params["fedlmd-tau"])
        counts = self.class_counts.double()
        self.major = (counts > counts.mean()).double() * self.MASK  # (C,)
        self.needs_teacher = self.beta != 0.0

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """log softmax(g/T - 1000 [major] - 1000 [y]) per sample."""
        if not self.needs_teacher:
            return None
        g = _as_float(teacher_logits.detach())
        masked = g / self.tau - self._buf("major", g.dtype) - self.MASK * F.one_hot(targets, self.num_classes).to(g.dtype)
        return F.log_softmax(masked, dim=1)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None:
            return {"ce": ce, "lmd": logits.new_zeros(())}
        gt = self.MASK * F.one_hot(targets, self.num_classes).to(logits.dtype)
        log_s = F.log_softmax(logits / self.tau - gt, dim=1)
        kl = _kl_log(teacher.to(logits.dtype), log_s)
        return {"ce": ce, "lmd": (self.beta * self.tau**2) * kl}


class FedDecorrObjective(Objective):
    """CE + beta * L_decorr on the penultimate representation h (B, d) (Shi et al., ICLR
    2023; the authors' ``FedDecorrLoss``): h standardised per dimension over the batch
    (unbiased variance + 1e-8), K = h^T h, L_decorr = mean of K_ij^2 over i != j, divided
    by B. Zero for a batch of one sample."""

    name = "feddecorr"
    term_names = ("ce", "decorr")
    features = "penultimate"

    def __init__(self, class_counts: Tensor, params: Mapping[str, Any]) -> None:
        super().__init__(class_counts, params)
        self.beta = float(params["feddecorr-beta"])

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None, *, features: Tensor) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        h = _as_float(features)
        n, d = h.shape
        if n <= 1 or d <= 1:
            return {"ce": ce, "decorr": logits.new_zeros(())}
        h = (h - h.mean(dim=0)) / torch.sqrt(h.var(dim=0) + 1e-8)
        k = h.T @ h
        off = k.square().sum() - k.diagonal().square().sum()
        return {"ce": ce, "decorr": self.beta * off / (d * (d - 1)) / n}


def _logsumexp_softmax_dim0(z: Tensor) -> tuple[Tensor, Tensor]:
    """(logsumexp over dim 0, softmax over dim 0) of ``z`` (B, P), sharing the work."""
    top = z.amax(dim=0)
    e = (z - top).exp_()
    total = e.sum(dim=0)
    return top + total.log(), e.div_(total)


class _FusedFedVLS(torch.autograd.Function):
    """FedVLS's loss and its gradient w.r.t. the logits in one pass.

    Returns ``(loss, terms)``; ``terms`` (cal, dis, logit) is not differentiable. The
    gradient is saved in the forward pass and scaled by the incoming gradient.
    """

    @staticmethod
    def forward(ctx, f: Tensor, targets: Tensor, teacher: Tensor | None, obj: FedVLSObjective):
        cal, grad = obj._cal(f, targets)
        zero = f.new_zeros(())
        dis = obj._dis(f, teacher, grad) if obj.use_dis else zero
        logit = obj._logit(f, targets, grad) if obj.use_logit else zero
        terms = torch.stack([cal, dis, logit])
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(terms)
        return terms.sum(), terms

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_terms: Tensor | None):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None, None


def build_objective(method: str, class_counts: Tensor, params: Mapping[str, Any] | None = None) -> Objective:
    """The local objective of ``method`` for a client with ``class_counts`` (C,).

    ``params``: method settings (kebab-case run-config keys, e.g. from
    :func:`fedvls_flwr.methods.method_params`); the method's own keys are taken from it
    (defaults for the missing ones) and checked against their declared rules; other
    methods' keys are ignored, so one dict can serve every method.
    """
    from .methods import get_method, method_settings

    spec = get_method(method)
    known = {s.key for s in method_settings()}
    unknown = sorted(set(params or {}) - known)
    if unknown:
        raise ValueError(f"unknown objective parameter(s) {unknown}; known: {sorted(known)}")
    values = spec.defaults()
    for setting in spec.settings:
        if params is not None and setting.key in params:
            values[setting.key] = setting.coerce(params[setting.key])
            setting.validate(values[setting.key])
    module, _, name = spec.impl.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(class_counts, values)
