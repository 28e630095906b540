"""The reference loop's local objectives, each written out from its paper or its authors' code.

Each loss is computed in float64 from the model's float32 outputs (the gradient flows back into
float32): the reference states the formula as plainly as it can, at more precision than the app,
so the two differ by float32 rounding and by nothing else. Plain cross-entropy (FedAvg, and the
head of FedConcat's stage 2) is the exception: every PyTorch federated codebase computes it as
``F.cross_entropy`` on the model's own float32 logits, and so does the reference.

Notation (docs/methods.md): f the local model's logits, g the received global model's, y the
labels, B the batch size, n_c the client's samples of class c, p(c) = n_c / n its label prior,
vacant classes those with n_c = 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def lse(z: Tensor, keep: Tensor) -> Tensor:
    """log sum_{keep} exp(z) along dim 1; a row with nothing kept gives 0 (no gradient)."""
    any_kept = keep.any(dim=1, keepdim=True)
    z = z.masked_fill(~keep, -math.inf).masked_fill(~any_kept, 0.0)
    return torch.logsumexp(z, dim=1) * any_kept.squeeze(1)


def kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) of each row, from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=1)


def not_true(x: Tensor, y: Tensor) -> Tensor:
    """The C - 1 columns of each row other than its label's (the FedNTD authors' refine_as_not_true)."""
    keep = torch.ones_like(x, dtype=torch.bool).scatter_(1, y[:, None], False)
    return x[keep].view(x.shape[0], x.shape[1] - 1)


@dataclass
class Batch:
    """What a loss may read of one step: the logits, labels, the teacher's output on the same
    batch (g's logits, or MOON's (z_g, z_prev)), the features the method names, and the
    trained parameters with the received global model's values (FedProx)."""

    logits: Tensor
    y: Tensor
    teacher: Any = None
    features: Tensor | None = None
    params: list[Tensor] | None = None
    anchor: list[Tensor] | None = None


@dataclass
class Objective:
    """A method's loss for one client: ``loss(batch)``; ``teacher``: what the loop must run of the
    received global model ("logits", "projections" or None); ``features``: what of the model
    ("penultimate", "projection" or None); ``keeps_previous``: MOON's previous local model."""

    loss: Callable[[Batch], Tensor]
    teacher: str | None = None
    features: str | None = None
    keeps_previous: bool = False
    weight_space: bool = False  # FedProx: the loss reads the weights (Batch.params / anchor)


def ce64(f: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(f.double(), y)


def fedavg(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """McMahan et al. 2017: cross-entropy."""
    return Objective(lambda b: F.cross_entropy(b.logits, b.y))


def fedprox(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Li et al., MLSys 2020: CE + (mu / 2) ||w - w_global||^2 over the trained parameters."""
    mu = float(p["fedprox-mu"])

    def loss(b: Batch) -> Tensor:
        assert b.params is not None and b.anchor is not None
        distance = sum(((w.double() - a.double()) ** 2).sum() for w, a in zip(b.params, b.anchor))
        return ce64(b.logits, b.y) + mu / 2 * distance

    return Objective(loss, weight_space=True)


def fedlc(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Zhang et al., ICML 2022: z_c = f_c - tau n_c^(-1/4); a class the client lacks has an infinite
    margin (it leaves the softmax). "standard" keeps the label in the softmax (the public
    implementations), "paper": -z_y + log sum_{c != y} exp(z_c)."""
    tau, form = float(p["fedlc-tau"]), p["fedlc-form"]
    present = counts > 0
    margin = tau * counts.clamp(min=1) ** -0.25

    def loss(b: Batch) -> Tensor:
        z = b.logits.double() - margin.to(b.logits.device)
        keep = present.to(b.logits.device).expand_as(z)
        z_y = z.gather(1, b.y[:, None]).squeeze(1)
        if form == "paper":
            keep = keep & ~F.one_hot(b.y, z.shape[1]).bool()
        return (lse(z, keep) - z_y).mean()

    return Objective(loss)


def fedntd(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Lee et al., NeurIPS 2022 (the authors' NTD_Loss): CE + beta tau^2 KL(softmax(g_{!=y} / tau) ||
    softmax(f_{!=y} / tau)) over the not-true classes, batch mean."""
    beta, tau = float(p["fedntd-beta"]), float(p["fedntd-tau"])

    def loss(b: Batch) -> Tensor:
        ce = ce64(b.logits, b.y)
        if beta == 0:
            return ce
        log_g = F.log_softmax(not_true(b.teacher.double(), b.y) / tau, dim=1)
        log_f = F.log_softmax(not_true(b.logits.double(), b.y) / tau, dim=1)
        return ce + beta * tau**2 * kl(log_g, log_f).mean()

    return Objective(loss, teacher="logits" if beta != 0 else None)


def fedrs(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Li & Zhan, KDD 2021: CE on the logits scaled per class; "binary": the classes the client
    lacks by alpha; "proportional" (the authors' code): alpha + (1 - alpha) n_c / max_k n_k."""
    alpha = float(p["fedrs-alpha"])
    if p["fedrs-form"] == "binary":
        scale = torch.where(counts > 0, 1.0, alpha).double()
    else:
        scale = alpha + (1 - alpha) * counts / counts.max()
    return Objective(lambda b: ce64(b.logits.double() * scale.to(b.logits.device), b.y))


def moon(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Li, He, Song, CVPR 2021 (the authors' code): CE + mu l_con, l_con the cross-entropy of
    [sim(z, z_g), sim(z, z_prev)] / tau with the positive as the label (nn.CosineSimilarity);
    no previous model (a client's first round): no term, the authors' pool of previous models
    being empty then."""
    mu, tau = float(p["moon-mu"]), float(p["moon-tau"])

    def loss(b: Batch) -> Tensor:
        ce = ce64(b.logits, b.y)
        if mu == 0 or b.teacher is None or b.teacher[1] is None:
            return ce
        z, z_g, z_prev = b.features.double(), b.teacher[0].double(), b.teacher[1].double()
        sims = torch.stack([F.cosine_similarity(z, z_g, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
        return ce + mu * F.cross_entropy(sims, torch.zeros_like(b.y))

    return Objective(loss, teacher="projections" if mu != 0 else None, features="projection", keeps_previous=True)


def fedlmd(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Lu et al., ACM MM 2023 (the authors' LMD_Loss): CE + beta T^2 KL(softmax(g/T - 1000 [major]
    - 1000 [y]) || softmax(f/T - 1000 [y])), "major" the classes with n_c above the client's
    mean count over all C classes, batch mean."""
    beta, T = float(p["fedlmd-beta"]), float(p["fedlmd-tau"])
    major = (counts > counts.mean()).double() * 1000.0

    def loss(b: Batch) -> Tensor:
        ce = ce64(b.logits, b.y)
        if beta == 0:
            return ce
        label = 1000.0 * F.one_hot(b.y, b.logits.shape[1]).double()
        log_t = F.log_softmax(b.teacher.double() / T - major.to(b.logits.device) - label, dim=1)
        log_s = F.log_softmax(b.logits.double() / T - label, dim=1)
        return ce + beta * T**2 * kl(log_t, log_s).mean()

    return Objective(loss, teacher="logits" if beta != 0 else None)


def feddecorr(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Shi et al., ICLR 2023 (the authors' FedDecorrLoss): the representation h standardised per
    dimension over the batch (unbiased variance + 1e-8), K = h^T h; the mean of K's squared
    off-diagonal entries, over B; nothing for a batch of one."""
    beta = float(p["feddecorr-beta"])

    def loss(b: Batch) -> Tensor:
        ce = ce64(b.logits, b.y)
        h = b.features.double()
        n, d = h.shape
        if n <= 1 or d <= 1:
            return ce
        h = (h - h.mean(dim=0)) / torch.sqrt(h.var(dim=0) + 1e-8)
        k = h.T @ h
        off = k.masked_fill(torch.eye(d, dtype=torch.bool, device=k.device), 0.0)
        return ce + beta * (off**2).sum() / (d * (d - 1)) / n

    return Objective(loss, features="penultimate")


def fedmr(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Fan et al., TMLR 2023, the intra-class term both released codebases run (MR_loss): for each
    class with >= 2 samples in the batch, Z = (H - mean) / sqrt(unbiased var + 1e-8) per
    dimension and G = Z^T Z; the means of G's squared off-diagonal entries, summed over those
    classes and divided by their number of samples."""
    deco = float(p["fedmr-deco"])

    def loss(b: Batch) -> Tensor:
        ce = ce64(b.logits, b.y)
        if deco == 0:
            return ce
        h = b.features.double().flatten(1)
        d = h.shape[1]
        total, counted = h.new_zeros(()), 0
        for c in torch.unique(b.y).tolist():
            rows = h[b.y == c]
            if rows.shape[0] < 2 or d <= 1:
                continue
            z = (rows - rows.mean(dim=0)) / torch.sqrt(rows.var(dim=0) + 1e-8)
            g = (z.T @ z).masked_fill(torch.eye(d, dtype=torch.bool, device=h.device), 0.0)
            total = total + (g**2).sum() / (d * (d - 1))
            counted += rows.shape[0]
        return ce + deco * total / max(counted, 1)

    return Objective(loss, features="penultimate")


def _fedvls(paper: bool, counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """Guo et al., AAAI 2025. L = L_cal + lambda L_dis + L_logit:

    * L_cal: CE on f + log(p(c) + 1e-9) (the authors' code; the paper, eq. 2: f + log p(c), the
      vacant classes out of the softmax);
    * L_dis (eq. 3): KL(softmax(g_O) || softmax(f_O)) over the vacant classes O, batch mean, when
      |O| >= 2 (a one-class softmax is constant);
    * L_logit, the authors' bounded form: w sum_{c present} p(c) log((sum_{i: y_i != c} exp(z_ic)
      + #{i: y_i = c}) / B), z_c = f_c - log(p(c) + 1e-9) + log(1/C) (w = 0.005); the paper's
      (eqs. 4-5): w sum_{c present} p(c) (log sum_{i: y_i != c} exp(f_ic) - log B), a class
      with no such sample skipped (w = 1).
    """
    C = counts.numel()
    present = counts > 0
    prior = counts / counts.sum()
    vacant = torch.nonzero(~present).flatten()
    lam = float(p["lambda-dis"])
    weight = float(p["paper-logit-weight" if paper else "logit-weight"])
    use_dis = bool(p["use-dis"]) and vacant.numel() >= 2 and lam != 0
    use_logit = bool(p["use-logit"]) and weight != 0
    log_prior = torch.log(prior + 1e-9)

    def loss(b: Batch) -> Tensor:
        f = b.logits.double()
        B = f.shape[0]
        dev = f.device
        if paper:
            with_prior = f + torch.log(prior.clamp(min=1e-300)).to(dev)
            keep = present.to(dev).expand_as(f)
            cal = (lse(with_prior, keep) - with_prior.gather(1, b.y[:, None]).squeeze(1)).mean()
        else:
            cal = F.cross_entropy(f + log_prior.to(dev), b.y)
        total = cal
        if use_dis:
            v = vacant.to(dev)
            log_g = F.log_softmax(b.teacher.double()[:, v], dim=1)
            log_f = F.log_softmax(f[:, v], dim=1)
            total = total + lam * kl(log_g, log_f).mean()
        if use_logit:
            logit = f.new_zeros(())
            for c in torch.nonzero(present).flatten().tolist():
                others = b.y != c
                if paper:
                    if others.any():
                        logit = logit + prior[c] * (torch.logsumexp(f[others, c], dim=0) - math.log(B))
                else:
                    z = f[others, c] - log_prior[c] + math.log(1.0 / C)
                    inside = torch.exp(z).sum() + (~others).sum()
                    logit = logit + prior[c] * torch.log(inside / B)
            total = total + weight * logit
        return total

    return Objective(loss, teacher="logits" if use_dis else None)


def fedvls(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    return _fedvls(False, counts, p)


def fedvls_paper(counts: Tensor, p: Mapping[str, Any]) -> Objective:
    return _fedvls(True, counts, p)


#: Every objective the reference writes out, by method name.
OBJECTIVES: dict[str, Callable[[Tensor, Mapping[str, Any]], Objective]] = {
    "fedavg": fedavg, "fedprox": fedprox, "moon": moon, "fedrs": fedrs, "fedlmd": fedlmd, "feddecorr": feddecorr,
    "fedmr": fedmr, "fedlc": fedlc, "fedntd": fedntd, "fedvls": fedvls, "fedvls-paper": fedvls_paper,
}


def build(method: str, counts: Tensor, p: Mapping[str, Any]) -> Objective:
    """The objective of ``method`` for a client holding ``counts`` (C,) samples per class."""
    if method not in OBJECTIVES:
        raise ValueError(f"the reference loop has no objective {method!r}")
    return OBJECTIVES[method](counts.double().cpu(), p)
