"""Local training objectives: FedAvg, FedLC, FedNTD, FedVLS (bounded and paper forms).

Plain PyTorch; no Flower import. See SPEC.md (sections FedAvg, FedLC, FedNTD, FedVLS and
"The paper's L_logit is ill-posed as written").

Conventions
-----------
* ``logits``: (B, C) float tensor of the local model; ``targets``: (B,) int64 labels;
  ``teacher_logits``: (B, C) logits of the frozen global model (detached here).
* Every objective returns ``(loss, terms)``: ``loss`` is a scalar with grad, ``terms`` maps
  each name of ``term_names`` to a detached scalar tensor holding that term's *weighted
  contribution* to ``loss`` (so ``sum(terms.values()) == loss`` up to rounding). Disabled
  terms are reported as 0 so that every client returns the same keys.
* Everything derived from the client's class counts is computed once, in the constructor,
  on the device of ``class_counts``. The per-step code is vectorised and free of host syncs
  (no ``.item()``, no boolean indexing, no Python loops over classes or samples).
* Half / bfloat16 logits are upcast to float32; float32 / float64 are kept.
* Removed classes are masked with a finite constant (``MASK_VALUE``) rather than ``-inf``,
  so that values and gradients stay finite in every degenerate case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "METHODS",
    "MASK_VALUE",
    "PRIOR_EPS",
    "ObjectiveParams",
    "Objective",
    "FedAvgObjective",
    "FedLCObjective",
    "FedNTDObjective",
    "FedVLSObjective",
    "FedVLSPaperObjective",
    "build_objective",
]

METHODS = ("fedavg", "fedlc", "fedntd", "fedvls", "fedvls-paper")

#: Finite stand-in for -inf: a masked logit contributes exp(MASK_VALUE - max) == 0 exactly.
MASK_VALUE = -1e9
#: Epsilon added to the prior inside logs (SPEC, FedVLS point 2).
PRIOR_EPS = 1e-9

_DEFAULT_LOGIT_WEIGHT = {"fedvls": 0.005, "fedvls-paper": 1.0}
_FEDLC_FORMS = ("standard", "paper")


@dataclass(frozen=True)
class ObjectiveParams:
    lambda_dis: float = 0.1  # FedVLS vacant-class distillation weight
    logit_weight: float | None = None  # None -> 0.005 for "fedvls", 1.0 for "fedvls-paper"
    use_dis: bool = True  # ablation switch for L_dis (paper Table 5)
    use_logit: bool = True  # ablation switch for L_logit
    fedlc_tau: float = 0.5
    fedlc_form: str = "standard"  # "standard" | "paper" (denominator over c != y)
    fedntd_beta: float = 1.0
    fedntd_tau: float = 1.0


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

    def __init__(self, class_counts: Tensor, params: ObjectiveParams) -> None:
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
    def __call__(
        self, logits: Tensor, targets: Tensor, teacher_logits: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits must have shape (B, {self.num_classes}), got {tuple(logits.shape)}"
            )
        if targets.shape != logits.shape[:1]:
            raise ValueError(
                f"targets must have shape ({logits.shape[0]},), got {tuple(targets.shape)}"
            )
        logits = _as_float(logits)
        if self.needs_teacher:
            if teacher_logits is None:
                raise ValueError(f"objective {self.name!r} needs teacher_logits")
            if teacher_logits.shape != logits.shape:
                raise ValueError(
                    f"teacher_logits must have shape {tuple(logits.shape)}, got {tuple(teacher_logits.shape)}"
                )
            teacher_logits = _as_float(teacher_logits.detach()).to(logits.dtype)
        else:
            teacher_logits = None
        terms = self._compute(logits, targets, teacher_logits)
        loss = None
        for t in terms.values():
            loss = t if loss is None else loss + t
        return loss, {k: v.detach() for k, v in terms.items()}

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

    def _compute(self, logits, targets, teacher):
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

    def __init__(self, class_counts, params):
        super().__init__(class_counts, params)
        if params.fedlc_form not in _FEDLC_FORMS:
            raise ValueError(f"fedlc_form must be one of {_FEDLC_FORMS}, got {params.fedlc_form!r}")
        self.form = params.fedlc_form
        n = self.class_counts.double().clamp(min=1.0)  # clamp: never 0^(-1/4)
        self.margin = torch.where(
            self.present, params.fedlc_tau * n.pow(-0.25), torch.zeros_like(n)
        )  # (C,) float64

    def _compute(self, logits, targets, teacher):
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

    def __init__(self, class_counts, params):
        super().__init__(class_counts, params)
        if self.num_classes < 2:
            raise ValueError("FedNTD needs at least 2 classes")
        self.beta = float(params.fedntd_beta)
        self.tau = float(params.fedntd_tau)
        if self.tau <= 0:
            raise ValueError("fedntd_tau must be positive")
        # the teacher can change the loss only through the beta-weighted term
        self.needs_teacher = self.beta != 0.0
        self._cols = torch.arange(self.num_classes - 1, device=self.device)  # (C-1,)

    def _not_true(self, x: Tensor, targets: Tensor) -> Tensor:
        # column j of row i -> class j if j < y_i else j + 1 (drops the true class y_i)
        idx = self._cols[None, :] + (self._cols[None, :] >= targets[:, None]).long()
        return x.gather(1, idx)

    def _compute(self, logits, targets, teacher):
        ce = F.cross_entropy(logits, targets)
        if teacher is None:  # beta == 0
            return {"ce": ce, "ntd": logits.new_zeros(())}
        f_nt = self._not_true(logits, targets) / self.tau
        g_nt = self._not_true(teacher, targets) / self.tau
        kl = _kl_log(F.log_softmax(g_nt, dim=1), F.log_softmax(f_nt, dim=1))
        return {"ce": ce, "ntd": (self.beta * self.tau**2) * kl}


class FedVLSObjective(Objective):
    """FedVLS, the authors' bounded form (default).

    L = CE(f + log(p + 1e-9), y)
        + lambda_dis * KL(q_g || q)            (softmaxes over the vacant classes, batch mean)
        + logit_weight * sum_c p(c) L^c,
    L^c = log((sum_{i: y_i != c} exp(z_ic) + #{i: y_i = c}) / B),
    z_c = f_c - log(p(c) + 1e-9) + log(1/C).  Vacant classes have p(c) = 0 and are skipped.
    """

    name = "fedvls"
    term_names = ("cal", "dis", "logit")
    paper = False

    def __init__(self, class_counts, params):
        super().__init__(class_counts, params)
        self.lambda_dis = float(params.lambda_dis)
        lw = params.logit_weight
        self.logit_weight = float(_DEFAULT_LOGIT_WEIGHT[self.name] if lw is None else lw)
        self.use_dis = bool(params.use_dis) and self.num_vacant >= 2 and self.lambda_dis != 0.0
        self.use_logit = bool(params.use_logit) and self.logit_weight != 0.0
        self.needs_teacher = self.use_dis
        C = self.num_classes
        log_prior_eps = torch.log(self.prior + PRIOR_EPS)  # (C,) float64
        if self.paper:
            # literal eq. 2: log p(c) for present classes; vacant classes leave the softmax
            self.cal_bias = torch.where(self.present, torch.log(self.prior.clamp(min=1e-300)), 0.0)
        else:
            self.cal_bias = log_prior_eps
        # L_logit restricted to the present classes (p(c) = 0 elsewhere)
        self.logit_prior = self.prior[self.present_idx]  # (P,)
        self.logit_shift = (-log_prior_eps + math.log(1.0 / C))[self.present_idx]  # (P,)

    # -- terms ---------------------------------------------------------------------------
    def _cal(self, logits, targets):
        z = logits + self._buf("cal_bias", logits.dtype)
        if self.paper:
            z = torch.where(self.present, z, MASK_VALUE)
        return F.cross_entropy(z, targets)

    def _dis(self, logits, teacher):
        if not self.use_dis:
            return logits.new_zeros(())
        f_o = logits.index_select(1, self.vacant_idx)
        g_o = teacher.index_select(1, self.vacant_idx)
        return self.lambda_dis * _kl_log(F.log_softmax(g_o, dim=1), F.log_softmax(f_o, dim=1))

    def _logit(self, logits, targets):
        if not self.use_logit:
            return logits.new_zeros(())
        B = logits.shape[0]
        f_p = logits.index_select(1, self.present_idx)  # (B, P)
        is_c = targets[:, None] == self.present_idx[None, :]  # (B, P): y_i == c
        z = f_p + self._buf("logit_shift", logits.dtype)
        # samples of class c stay in the sum with exp(0) = 1
        per_class = torch.logsumexp(torch.where(is_c, 0.0, z), dim=0) - math.log(B)  # (P,)
        return self.logit_weight * (self._buf("logit_prior", logits.dtype) * per_class).sum()

    def _compute(self, logits, targets, teacher):
        return {
            "cal": self._cal(logits, targets),
            "dis": self._dis(logits, teacher),
            "logit": self._logit(logits, targets),
        }


class FedVLSPaperObjective(FedVLSObjective):
    """FedVLS exactly as eqs. 2-5 of the paper (unbounded L_logit; default weight 1).

    L_cal: CE on f + log p(c) with vacant classes masked out of the softmax.
    L_logit^c = logsumexp_{i: y_i != c} f_ic - log B, classes without such a sample skipped,
    L_logit = logit_weight * sum_c p(c) L_logit^c.
    """

    name = "fedvls-paper"
    paper = True

    def _logit(self, logits, targets):
        if not self.use_logit:
            return logits.new_zeros(())
        B = logits.shape[0]
        f_p = logits.index_select(1, self.present_idx)  # (B, P)
        is_c = targets[:, None] == self.present_idx[None, :]  # (B, P)
        lse = torch.logsumexp(torch.where(is_c, MASK_VALUE, f_p), dim=0) - math.log(B)
        has_other = is_c.sum(dim=0) < B  # (P,) some sample with y != c
        per_class = torch.where(has_other, lse, 0.0)
        return self.logit_weight * (self._buf("logit_prior", logits.dtype) * per_class).sum()


_REGISTRY: dict[str, type[Objective]] = {
    "fedavg": FedAvgObjective,
    "fedlc": FedLCObjective,
    "fedntd": FedNTDObjective,
    "fedvls": FedVLSObjective,
    "fedvls-paper": FedVLSPaperObjective,
}


def build_objective(
    method: str, class_counts: Tensor, params: ObjectiveParams = ObjectiveParams()
) -> Objective:
    """Build the local objective of ``method`` for a client with ``class_counts`` (C,)."""
    cls = _REGISTRY.get(method)
    if cls is None:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    return cls(class_counts, params)
