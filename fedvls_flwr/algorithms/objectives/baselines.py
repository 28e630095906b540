"""The baselines' local objectives: FedLC, FedNTD, FedProx, FedRS, MOON, FedLMD, FedDecorr.
Formulas, papers and where the authors' code differs: docs/methods.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedvls_flwr.algorithms.objectives.base import MASK_VALUE, Objective, as_float, kl_log
from fedvls_flwr.algorithms.parts import ObjectiveContext, StateDict
from fedvls_flwr.models import ProjectionModel


class FedLCObjective(Objective):
    """Cross-entropy on f_c - tau * n_c^(-1/4); classes with n_c = 0 are masked out.

    ``standard``: the label stays in the softmax denominator (plain CE on shifted logits).
    ``paper``: -z_y + log sum_{c != y} exp(z_c) (FedLC paper; unbounded below). If no class
    other than y is left (a client holding one class) the empty sum is represented by the
    finite mask, giving a large negative but finite loss.
    """

    name = "fedlc"
    term_names = ("ce",)
    client_tensors = ("present", "margin")

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.form = settings["fedlc-form"]
        n = self.class_counts.double().clamp(min=1.0)  # clamp: never 0^(-1/4)
        self.margin = torch.where(
            self.present, settings["fedlc-tau"] * n.pow(-0.25), torch.zeros_like(n)
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

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        if self.num_classes < 2:
            raise ValueError("FedNTD needs at least 2 classes")
        self.beta = float(settings["fedntd-beta"])
        self.tau = float(settings["fedntd-tau"])
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
        g = as_float(teacher_logits.detach())
        return F.log_softmax(self._not_true(g, targets) / self.tau, dim=1)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None:  # beta == 0
            return {"ce": ce, "ntd": logits.new_zeros(())}
        log_f_nt = F.log_softmax(self._not_true(logits, targets) / self.tau, dim=1)
        kl = kl_log(teacher.to(logits.dtype), log_f_nt)
        return {"ce": ce, "ntd": (self.beta * self.tau**2) * kl}


class FedProxObjective(Objective):
    """CE + (mu/2) ||w - w_global||^2 over the trainable parameters (Li et al., MLSys 2020).

    The proximal term acts on the weights, not the logits: its gradient mu (w - w_global)
    is added to the parameters' gradients after every backward pass (the same gradient as
    adding the term to the loss, as the PyTorch implementations do), and its value is
    reported as the term ``prox``.
    """

    name = "fedprox"
    term_names = ("ce", "prox")

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.mu = float(settings["fedprox-mu"])
        self.anchor: list[Tensor] = []

    def bind_global(self, model: torch.nn.Module) -> None:
        params = [p.detach() for p in model.parameters() if p.requires_grad]
        if [a.shape for a in self.anchor] == [p.shape for p in params] and self.anchor:
            with torch.no_grad():
                torch._foreach_copy_(self.anchor, params)
        else:
            self.anchor = [p.clone() for p in params]

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
    client_tensors = ("scale",)

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        alpha = float(settings["fedrs-alpha"])
        counts = self.class_counts.double()
        if settings["fedrs-form"] == "binary":
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
    models is empty in the first round). The previous model is MOON's client state: the
    trained model's weights, kept for the node's next round.
    """

    name = "moon"
    term_names = ("ce", "con")
    teacher_output = "projections"
    features = "projection"

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.mu = float(settings["moon-mu"])
        self.tau = float(settings["moon-tau"])
        self.needs_teacher = self.mu != 0.0

    @property
    def teacher_mode(self) -> str:
        return "eval"

    def load_client_state(self, state: StateDict) -> None:
        """This client's model after its previous round (none the first time)."""
        self.previous_model = dict(state) or None

    def client_state(self, trained: torch.nn.Module) -> StateDict:
        """The model this round trained: the next round's negative."""
        return {k: v.detach().cpu().clone() for k, v in trained.state_dict().items()}

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """Unit-length z_g (and z_prev when there is a previous model), side by side."""
        if not self.needs_teacher:
            return None
        z = as_float(teacher_logits.detach())
        halves = z.chunk(2, dim=1) if self.has_previous(z) else (z,)
        return torch.cat([F.normalize(h, dim=1) for h in halves], dim=1)

    def has_previous(self, teacher: Tensor) -> bool:
        return teacher.shape[1] == 2 * int(self.settings["moon-projection-dim"])

    def _compute_with_features(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None, features: Tensor
    ) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None or not self.has_previous(teacher):
            return {"ce": ce, "con": logits.new_zeros(())}
        z = F.normalize(as_float(features), dim=1)
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
    client_tensors = ("major",)
    MASK = 1000.0

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.beta = float(settings["fedlmd-beta"])
        self.tau = float(settings["fedlmd-tau"])
        counts = self.class_counts.double()
        self.major = (counts > counts.mean()).double() * self.MASK  # (C,)
        self.needs_teacher = self.beta != 0.0

    def prepare_teacher(self, teacher_logits: Tensor, targets: Tensor) -> Tensor | None:
        """log softmax(g/T - 1000 [major] - 1000 [y]) per sample."""
        if not self.needs_teacher:
            return None
        g = as_float(teacher_logits.detach())
        masked = g / self.tau - self._buf("major", g.dtype) - self.MASK * F.one_hot(targets, self.num_classes).to(g.dtype)
        return F.log_softmax(masked, dim=1)

    def _compute(self, logits: Tensor, targets: Tensor, teacher: Tensor | None) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if teacher is None:
            return {"ce": ce, "lmd": logits.new_zeros(())}
        gt = self.MASK * F.one_hot(targets, self.num_classes).to(logits.dtype)
        log_s = F.log_softmax(logits / self.tau - gt, dim=1)
        kl = kl_log(teacher.to(logits.dtype), log_s)
        return {"ce": ce, "lmd": (self.beta * self.tau**2) * kl}


class FedDecorrObjective(Objective):
    """CE + beta * L_decorr on the penultimate representation h (B, d) (Shi et al., ICLR
    2023; the authors' ``FedDecorrLoss``): h standardised per dimension over the batch
    (unbiased variance + 1e-8), K = h^T h, L_decorr = mean of K_ij^2 over i != j, divided
    by B. Zero for a batch of one sample."""

    name = "feddecorr"
    term_names = ("ce", "decorr")
    features = "penultimate"

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.beta = float(settings["feddecorr-beta"])

    def _compute_with_features(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None, features: Tensor
    ) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        h = as_float(features)
        n, d = h.shape
        if n <= 1 or d <= 1:
            return {"ce": ce, "decorr": logits.new_zeros(())}
        h = (h - h.mean(dim=0)) / torch.sqrt(h.var(dim=0) + 1e-8)
        k = h.T @ h
        off = k.square().sum() - k.diagonal().square().sum()
        return {"ce": ce, "decorr": self.beta * off / (d * (d - 1)) / n}


def with_projection_head(model: torch.nn.Module, settings: Mapping[str, Any], num_classes: int) -> torch.nn.Module:
    """MOON's network: the model zoo's, with a projection head of ``moon-projection-dim`` outputs
    between its features and a new classifier (the spec's ``wraps_model``)."""
    return ProjectionModel(model, int(settings["moon-projection-dim"]), num_classes)
