"""FedVLS: prior-calibrated cross-entropy, vacant-class distillation and logit suppression,
in the bounded form the authors ran (``fedvls``) and the paper's literal form (``fedvls-paper``).
Value and gradient come from one fused autograd function (see the base module's notes)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedvls_flwr.algorithms.objectives.base import MASK_VALUE, PRIOR_EPS, Objective, as_float
from fedvls_flwr.algorithms.parts import ObjectiveContext


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

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.lambda_dis = float(settings["lambda-dis"])
        self.logit_weight = float(settings[self.logit_weight_key])
        self.use_dis = bool(settings["use-dis"]) and self.num_vacant >= 2 and self.lambda_dis != 0.0
        self.use_logit = bool(settings["use-logit"]) and self.logit_weight != 0.0
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
        if self.fixed_shapes:
            # the same quantities over all C classes, zero weight on the vacant ones (a CUDA graph's step)
            self.weighted_prior_all = self.logit_weight * self.prior
            self.logit_shift_all = -log_prior_eps + math.log(1.0 / C)
            self.prior_mass_all = self.logit_prior.sum()
            self.class_row = torch.arange(C, device=self.device)[None, :]

    @property
    def client_tensors(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cal_bias", "vacant", "weighted_prior_all", "logit_shift_all", "prior_mass_all") \
            if self.fixed_shapes else ()

    def graph_signature(self) -> tuple[Any, ...]:
        return (*super().graph_signature(), self.use_dis, self.use_logit)

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """Per sample: the teacher's softmax over the vacant classes, q_g (V columns), and
        sum_v q_g log q_g (one column), the part of the KL that the student cannot change."""
        if not self.use_dis:
            return None
        if self.fixed_shapes:  # C columns, zero outside the vacant classes, then the constant
            g = torch.where(self.vacant, as_float(teacher_logits.detach()), MASK_VALUE)
            log_q = F.log_softmax(g, dim=1)
            q = log_q.exp()
            return torch.cat([q, torch.where(self.vacant, q * log_q, 0.0).sum(dim=1, keepdim=True)], dim=1)
        g = as_float(teacher_logits.detach()).index_select(1, self.vacant_idx)
        log_q = F.log_softmax(g, dim=1)
        q = log_q.exp()
        return torch.cat([q, (q * log_q).sum(dim=1, keepdim=True)], dim=1)

    def loss_terms(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None = None, features: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        return _FusedFedVLS.apply(as_float(logits), targets, teacher, self)

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
        scale = self.lambda_dis / B
        if self.fixed_shapes:  # over all C columns; the others hold q = 0 and softmax 0
            C = self.num_classes
            q = teacher[:, :C].to(f.dtype)
            log_s = F.log_softmax(torch.where(self.vacant, f, MASK_VALUE), dim=1)
            value = (teacher[:, C].to(f.dtype).sum() - torch.where(self.vacant, q * log_s, 0.0).sum()).mul_(scale)
            grad.add_(log_s.exp_().sub_(q).mul_(scale))
            return value
        q = teacher[:, :V].to(f.dtype)
        log_s = F.log_softmax(f.index_select(1, self.vacant_idx), dim=1)
        value = (teacher[:, V].to(f.dtype).sum() - (q * log_s).sum()).mul_(scale)
        grad.index_add_(1, self.vacant_idx, log_s.exp_().sub_(q).mul_(scale))
        return value

    def _logit(self, f: Tensor, targets: Tensor, grad: Tensor) -> Tensor:
        """Bounded L_logit: samples of class c stay in class c's sum as exp(0) = 1."""
        B = f.shape[0]
        if self.fixed_shapes:  # every class, the vacant ones with weight 0
            is_c = targets[:, None] == self._cols(f)
            z = (f + self._buf("logit_shift_all", f.dtype)).masked_fill_(is_c, 0.0)
            lse, soft = _logsumexp_softmax_dim0(z)
            w_prior = self._buf("weighted_prior_all", f.dtype)
            mass = self._buf("prior_mass_all", f.dtype)
            value = (w_prior * lse).sum() - mass * (self.logit_weight * math.log(B))
            grad.add_(soft.mul_(w_prior).masked_fill_(is_c, 0.0))
            return value
        f_p = f if self.all_present else f.index_select(1, self.present_idx)  # (B, P)
        is_c = targets[:, None] == self.present_idx[None, :]  # (B, P): y_i == c
        z = (f_p + self._buf("logit_shift", f.dtype)).masked_fill_(is_c, 0.0)
        lse, soft = _logsumexp_softmax_dim0(z)
        w_prior = self._buf("weighted_prior", f.dtype)
        value = (w_prior * lse).sum() - self.logit_weight * self.prior_mass * math.log(B)
        # d lse_c / d z_ic = softmax over the samples; entries with y_i == c are constants
        self._add_present(grad, soft.mul_(w_prior).masked_fill_(is_c, 0.0))
        return value

    def _cols(self, f: Tensor) -> Tensor:
        """0..C-1 as a (1, C) row (made with the objective, on its device)."""
        return self.class_row

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
        if self.fixed_shapes:  # every class, the vacant ones with weight 0
            f_p, is_c, w_all = f, targets[:, None] == self._cols(f), self._buf("weighted_prior_all", f.dtype)
        else:
            f_p = f if self.all_present else f.index_select(1, self.present_idx)  # (B, P)
            is_c = targets[:, None] == self.present_idx[None, :]  # (B, P)
            w_all = self._buf("weighted_prior", f.dtype)
        lse, soft = _logsumexp_softmax_dim0(f_p.masked_fill(is_c, MASK_VALUE))
        # a class with no sample y != c in the batch is skipped (its column is all masked)
        w_prior = w_all * (~is_c.all(dim=0))
        if self.fixed_shapes:
            value = (w_prior * (lse - math.log(B))).sum()
            grad.add_(soft.mul_(w_prior))
            return value
        value = (w_prior * (lse - math.log(B))).sum()
        self._add_present(grad, soft.mul_(w_prior))  # masked entries: exp(MASK - max) = 0
        return value


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
    def forward(ctx: Any, f: Tensor, targets: Tensor, teacher: Tensor | None, obj: FedVLSObjective) -> tuple[Tensor, Tensor]:
        cal, grad = obj._cal(f, targets)
        zero = f.new_zeros(())
        if obj.use_dis and teacher is None:
            raise ValueError("FedVLS's vacant-class distillation needs the teacher's rows")
        dis = obj._dis(f, teacher, grad) if obj.use_dis and teacher is not None else zero
        logit = obj._logit(f, targets, grad) if obj.use_logit else zero
        terms = torch.stack([cal, dis, logit])
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(terms)
        return terms.sum(), terms

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_terms: Tensor | None) -> tuple[Tensor, None, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None, None
