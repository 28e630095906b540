"""FedMR (Fan et al., "Federated Learning under Partially Class-Disjoint Data via Manifold
Reshaping", TMLR 2023), as both released codebases run it: only the intra-class
decorrelation term ("deco"); the paper's inter-class prototype term does not run in either.

L = CE(logits, y) + deco * R(h, y), h the penultimate features (the classifier's input,
nothing detached). For every class c with at least 2 samples in the batch:
Z_c = (H_c - mean_c) / sqrt(var_c + 1e-8) per feature (unbiased variance) and
G_c = Z_c^T Z_c (not divided by N_c); R = sum_c mean_{i != j} G_c[i, j]^2 / sum_c N_c over the
counted classes, and R = 0 when no class counts (authors' ``MR_loss``).

The per-class means and variances come from one-hot matrix products; rows of classes seen
once are zeroed (no NaN, no gradient). G_c is formed per counted class (one D x D product
each, the batch's rows sorted by class) and its diagonal masked out before the squares are
summed, as the authors' code sums them: the same sum written as ||G_c||_F^2 minus the squared
diagonal cancels two large numbers, and in float32 came out negative (-1.4e-12), its
gradients about 1e-4 off, relative.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedvls_flwr.algorithms.objectives.base import Objective, as_float
from fedvls_flwr.algorithms.parts import ObjectiveContext

#: The authors' epsilon inside the square root of the per-class variance.
MR_EPS = 1e-8


def _standardised(h: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Z: each row of h standardised within its class (rows of classes seen once zeroed), the
    one-hot labels, and the number of samples of the counted classes."""
    onehot = F.one_hot(y, num_classes).to(h.dtype)  # (B, C)
    counts = onehot.sum(dim=0)  # (C,)
    counted = (counts >= 2).to(h.dtype)
    mean = (onehot.T @ h) / counts.clamp(min=1).unsqueeze(1)
    centered = h - mean[y]
    var = (onehot.T @ centered.square()) / (counts - 1).clamp(min=1).unsqueeze(1)
    z = centered / torch.sqrt(var[y] + MR_EPS) * counted[y].unsqueeze(1)
    return z, onehot, (counts * counted).sum()


def _mean_square(off_sum: Tensor, d: int, total: Tensor) -> Tensor:
    """The off-diagonal sum of squares as the authors average it."""
    return off_sum / (d * (d - 1)) / total.clamp(min=1)


def manifold_reshaping_term(h: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """The authors' R(h, y) (see the module docstring); h (B, D), y (B,)."""
    n, d = h.shape
    if d <= 1:
        return h.new_zeros(())
    z, _, total = _standardised(h, y, num_classes)
    by_class = torch.split(z[torch.argsort(y, stable=True)], torch.bincount(y, minlength=num_classes).tolist())
    off_diagonal = 1.0 - torch.eye(d, dtype=h.dtype, device=h.device)
    off_sum = sum((((rows.T @ rows).square() * off_diagonal).sum() for rows in by_class if rows.shape[0] >= 2),
                  h.new_zeros(()))
    return _mean_square(off_sum, d, total)


def manifold_reshaping_term_fixed(h: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """:func:`manifold_reshaping_term` in fixed shapes, without reading the class counts back
    to the host (a CUDA graph's step): the off-diagonal sum of squares of every G_c as the sum
    over same-class pairs of samples of (z_a . z_b)^2 (||Z_c^T Z_c||_F = ||Z_c Z_c^T||_F) minus
    the squared diagonals, both in float64, where the difference of the two large sums that
    cancels badly in float32 (module docstring) keeps about nine more digits."""
    n, d = h.shape
    if d <= 1:
        return h.new_zeros(())
    z, onehot, total = _standardised(h, y, num_classes)
    z = z.double()
    same_class = (y[:, None] == y[None, :]).double()
    whole = ((z @ z.T).square() * same_class).sum()
    diagonal = (onehot.double().T @ z.square()).square().sum()
    return _mean_square((whole - diagonal).to(h.dtype), d, total)


class FedMRObjective(Objective):
    """CE + deco * R (intra-class decorrelation of the penultimate features)."""

    name = "fedmr"
    term_names = ("ce", "deco")
    features = "penultimate"

    def __init__(self, settings: Mapping[str, Any], context: ObjectiveContext) -> None:
        super().__init__(settings, context)
        self.deco = float(settings["fedmr-deco"])

    def _compute_with_features(
        self, logits: Tensor, targets: Tensor, teacher: Tensor | None, features: Tensor
    ) -> dict[str, Tensor]:
        ce = F.cross_entropy(logits, targets)
        if self.deco == 0.0:
            return {"ce": ce, "deco": logits.new_zeros(())}  # FedAvg exactly: no extra op in the graph
        term = manifold_reshaping_term_fixed if self.fixed_shapes else manifold_reshaping_term
        r = term(as_float(features).flatten(1), targets, self.num_classes)
        return {"ce": ce, "deco": self.deco * r}
