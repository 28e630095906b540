"""The reference loop's server side, local steps and FedConcat's pieces, written out from their sources.

Each follows the paper, the authors' code or Flower as named beside it, and docs/methods.md
where the app documents its choice between them; none of it is the app's code (the reference
imports nothing of the app: ``tests/test_differential.py`` checks it). Server arithmetic runs
in float64 and is cast to each array's dtype where a model is formed.

The run's randomness - which clients a round trains, FedConcat's new head - is the app's
documented convention (docs/running.md, "What a seed fixes"), drawn here the same way so that
both sides compute the same trajectory.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import nn

Arrays = dict[str, np.ndarray]


# --------------------------------------------------------------------------- sampling


def clients_per_round(num_clients: int, fraction: float) -> int:
    """Flower's FedAvg trains int(nodes * fraction_train) nodes (``configure_train``); the
    setting's documented floor is one (docs/configuration.md), and the fraction is read as the
    decimal it is written as (0.29 of 100 nodes is 29, not the 28 of its binary product)."""
    return max(1, math.floor(Fraction(repr(float(fraction))) * num_clients))


def sampled_partitions(num_clients: int, fraction: float, seed: int, server_round: int) -> list[int]:
    """The round's clients: all of them, or ``random.Random(seed * 1_000_003 + round).sample`` of
    the partition ids in order (docs/running.md, "What a seed fixes"), sorted."""
    k = clients_per_round(num_clients, fraction)
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(random.Random(seed * 1_000_003 + server_round).sample(list(range(num_clients)), k))


# --------------------------------------------------------------------------- aggregation


def float_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def weighted_average(states: Sequence[Arrays], weights: Sequence[float]) -> Arrays:
    """FedAvg's average (McMahan et al. 2017), sum_i (n_i / sum_j n_j) w_i over the clients that
    replied, of the whole state; every term and the sum in float64, cast back to each array's dtype,
    integer buffers rounded (docs/methods.md, "Server update")."""
    total = float(sum(weights))
    out: Arrays = {}
    for key, ref in states[0].items():
        acc = np.zeros(ref.shape, np.float64)
        for state, w in zip(states, weights):
            acc += (w / total) * state[key].astype(np.float64)
        out[key] = (np.rint(acc) if ref.dtype.kind in "iub" else acc).astype(ref.dtype)
    return out


def norm(arrays: Sequence[np.ndarray]) -> float:
    return math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays))


# --------------------------------------------------------------------------- server optimizers


class ServerStep:
    """FedAvg: the next global model is the sample-weighted average."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.p = params

    def step(self, t: int, w: Arrays, avg: Arrays, replies: Sequence[tuple[float, Arrays]]) -> Arrays:
        return avg

    def evaluated(self, new: Arrays) -> Arrays:
        return new


class FedExP(ServerStep):
    """Jhunjhunwala, Wang, Joshi, ICLR 2023: w + eta_g (w_avg - w), eta_g = max(1, sum_i p_i ||d_i||^2
    / (2 (||d_bar||^2 + eps))), d_i = w_i - w, p_i = n_i / n (the authors' code weights the
    clients by data size; with equal sizes the paper's sum_i ||d_i||^2 / (2 M (...))); eps as the
    setting says (0.01 in the FedVLS paper's Table 10), neither scaled by M nor decayed (the
    paper; docs/methods.md). Norms over every floating-point array. ``fedexp-eval =
    average-last-two``: the paper's evaluation of (w_t + w_{t-1}) / 2."""

    previous: Arrays | None = None
    step_size: float | None = None

    def step(self, t, w, avg, replies):
        keys = float_names(w)
        total = float(sum(n for n, _ in replies))
        spread = sum(n / total * norm([r[k].astype(np.float64) - w[k] for k in keys]) ** 2 for n, r in replies)
        d_bar = {k: avg[k].astype(np.float64) - w[k].astype(np.float64) for k in keys}
        eta = max(1.0, spread / (2 * (norm(list(d_bar.values())) ** 2 + float(self.p["fedexp-eps"]))))
        self.step_size = eta
        new = dict(avg)
        for k in keys:
            new[k] = (w[k].astype(np.float64) + eta * d_bar[k]).astype(w[k].dtype)
        self.previous = w
        return new

    def evaluated(self, new):
        if self.p["fedexp-eval"] != "average-last-two" or self.previous is None:
            return new
        out = dict(new)
        for k in float_names(new):
            out[k] = ((new[k].astype(np.float64) + self.previous[k].astype(np.float64)) / 2).astype(new[k].dtype)
        return out


class FedAvgM(ServerStep):
    """Hsu et al. 2019 as Flower's FedAvgM computes it: the pseudo-gradient g = w - w_avg, v <-
    momentum v + g (v = g the first time, only with momentum > 0), w <- w - lr v."""

    velocity: dict[str, np.ndarray] | None = None

    def step(self, t, w, avg, replies):
        lr, momentum = float(self.p["fedavgm-lr"]), float(self.p["fedavgm-momentum"])
        g = {k: w[k].astype(np.float64) - avg[k].astype(np.float64) for k in float_names(w)}
        if momentum > 0:
            self.velocity = g if self.velocity is None else {k: momentum * self.velocity[k] + g[k] for k in g}
            g = self.velocity
        new = dict(avg)
        for k, v in g.items():
            new[k] = (w[k].astype(np.float64) - lr * v).astype(w[k].dtype)
        return new


class Adaptive(ServerStep):
    """Reddi et al., ICLR 2021 (Adaptive Federated Optimization) as Flower's FedAdam / FedYogi /
    FedAdagrad compute it: d = w_avg - w, m <- b1 m + (1 - b1) d (b1 = 0 for Adagrad), v <- b2 v +
    (1 - b2) d^2 (Adam), v - (1 - b2) d^2 sign(v - d^2) (Yogi), v + d^2 (Adagrad), then w <- w +
    eta_t m / (sqrt(v) + tau). eta_t: Flower's FedAdam corrects Adam's bias with
    eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)), t the server round (Kingma & Ba's alpha_t, one step
    ahead); FedYogi and FedAdagrad take eta as it is."""

    def __init__(self, params: Mapping[str, Any], rule: str) -> None:
        super().__init__(params)
        self.rule = rule
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def step(self, t, w, avg, replies):
        p, prefix = self.p, f"fed{self.rule}-"
        b1 = 0.0 if self.rule == "adagrad" else float(p[prefix + "beta1"])
        eta, tau = float(p[prefix + "eta"]), float(p[prefix + "tau"])
        new = dict(avg)
        for k in float_names(w):
            d = avg[k].astype(np.float64) - w[k].astype(np.float64)
            m = self.m.get(k, np.zeros_like(d))
            v = self.v.get(k, np.zeros_like(d))
            m = b1 * m + (1 - b1) * d
            if self.rule == "adam":
                b2 = float(p[prefix + "beta2"])
                v = b2 * v + (1 - b2) * d * d
                step = eta * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            elif self.rule == "yogi":
                b2 = float(p[prefix + "beta2"])
                v = v - (1 - b2) * d * d * np.sign(v - d * d)
                step = eta
            else:
                v = v + d * d
                step = eta
            self.m[k], self.v[k] = m, v
            new[k] = (w[k].astype(np.float64) + step * m / (np.sqrt(v) + tau)).astype(w[k].dtype)
        return new


#: The server optimizers the reference writes out.
SERVER_STEPS: dict[str, Callable[[Mapping[str, Any]], ServerStep]] = {
    "fedavg": ServerStep, "fedexp": FedExP, "fedavgm": FedAvgM,
    "fedadam": lambda p: Adaptive(p, "adam"), "fedyogi": lambda p: Adaptive(p, "yogi"),
    "fedadagrad": lambda p: Adaptive(p, "adagrad"),
}


def server_optimizer(name: str, params: Mapping[str, Any]) -> ServerStep:
    return SERVER_STEPS[name](params)


# --------------------------------------------------------------------------- FedGF's server side


@dataclass
class FedGFPoint:
    """What a FedGF client receives from round 2: the perturbed global model w_g and c."""

    arrays: dict[str, torch.Tensor]
    c: float


@dataclass
class FedGFServer:
    """FedGF's server (Lee and Yoon, ICML 2024; the authors' fedlab/contrib/algorithm/fedgf.py), after
    round t: D = the unweighted mean over the replies of ||w^{t-1} - w_k||, u = w^{t-1} - w^t,
    w_g = w^t + rho_g u / ||u|| (w^t when u = 0, where their division gives NaN), c the fixed
    setting (the FedVLS paper's 0.3) or the authors' adaptive rule: the mean of the last W
    indicators [D > T_D]. Norms over every floating-point array; nothing is sent in round 1 nor
    when c = 0 (docs/methods.md)."""

    params: Mapping[str, Any]
    perturbed: Arrays = field(default_factory=dict)
    c: float = 0.0
    window: list[int] = field(default_factory=list)
    divergence: float = float("nan")

    def point(self) -> FedGFPoint | None:
        if not self.perturbed or self.c == 0.0:
            return None
        return FedGFPoint({k: torch.from_numpy(v.copy()) for k, v in self.perturbed.items()}, self.c)

    def observe(self, sent: Arrays, new: Arrays, replies: Sequence[tuple[float, Arrays]]) -> None:
        keys = float_names(sent)
        self.divergence = divergence = sum(
            norm([sent[k].astype(np.float64) - r[k].astype(np.float64) for k in keys]) for _, r in replies
        ) / len(replies)
        u = {k: sent[k].astype(np.float64) - new[k].astype(np.float64) for k in keys}
        size = norm(list(u.values()))
        self.perturbed = {
            k: (new[k].astype(np.float64) + (self.params["fedgf-rho-g"] / size * u[k] if size > 0 else 0.0))
            .astype(new[k].dtype) for k in keys
        }
        if self.params["fedgf-c-mode"] == "adaptive":
            self.window = (self.window + [int(divergence > self.params["fedgf-threshold"])])[-int(self.params["fedgf-window"]):]
            self.c = sum(self.window) / len(self.window)
        else:
            self.c = float(self.params["fedgf-c"])


# --------------------------------------------------------------------------- local steps


GradientAt = Callable[[], None]  # clears the gradients, then forward, loss, backward at the current weights


def _ascent(params: list[torch.Tensor], rho: float) -> list[torch.Tensor]:
    """SAM's ascent (Foret et al., ICLR 2021, as davda54/sam's ``first_step``, which the FedSAM
    code wraps): e = rho g / (||g|| + 1e-12), one norm over every parameter's gradient. (The FedGF
    authors add 1e-16; docs/methods.md keeps SAM's 1e-12 for FedGF too.)"""
    grads = [p.grad for p in params]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return [g * (rho / (total + 1e-12)) for g in grads]


@dataclass
class LocalStep:
    """What a local step needs besides the batch: the trained parameters (and their state-dict
    names), the SGD update, ``rho`` and what FedGF's server sent (None: round 1, or c = 0)."""

    params: list[torch.nn.Parameter]
    names: list[str]
    optimizer: torch.optim.Optimizer
    rho: float = 0.0
    point: FedGFPoint | None = None


def sgd_step(s: LocalStep, gradient: GradientAt) -> None:
    """Plain (momentum, weight-decayed) SGD: torch.optim.SGD's step on the batch's gradient."""
    gradient()
    s.optimizer.step()


def sam_step(s: LocalStep, gradient: GradientAt) -> None:
    """FedSAM (Qu et al., ICML 2022): the gradient at w + e, then the SGD step from w, w restored
    by subtracting e (as the FedGF authors' SAM round does); weight decay and momentum act in
    the SGD step only, as a SAM that wraps a base optimizer."""
    gradient()
    live = [p for p in s.params if p.grad is not None]
    e = _ascent(live, s.rho)
    with torch.no_grad():
        for p, ei in zip(live, e):
            p.add_(ei)
    gradient()
    with torch.no_grad():
        for p, ei in zip(live, e):
            p.sub_(ei)
    s.optimizer.step()


def fedgf_step(s: LocalStep, gradient: GradientAt) -> None:
    """FedGF (Lee and Yoon, ICML 2024; the authors' fedgf.py): the second gradient at
    v = c w_g + (1 - c)(w + e) - a mix of points - w restored by copy, then the SGD step from w;
    without w_g (round 1, or c = 0) FedSAM's step."""
    if s.point is None:
        sam_step(s, gradient)
        return
    gradient()
    live = [p for p in s.params if p.grad is not None]
    step_of = {id(p): ei for p, ei in zip(live, _ascent(live, s.rho))}
    saved = [p.detach().clone() for p in s.params]
    with torch.no_grad():
        for p, name in zip(s.params, s.names):
            ascended = p + step_of[id(p)] if id(p) in step_of else p
            p.copy_(s.point.c * s.point.arrays[name].to(p.device) + (1 - s.point.c) * ascended)
    gradient()
    with torch.no_grad():
        for p, w in zip(s.params, saved):
            p.copy_(w)
    s.optimizer.step()


#: The local optimizers the reference writes out.
LOCAL_STEPS: dict[str, Callable[[LocalStep, GradientAt], None]] = {"sgd": sgd_step, "sam": sam_step, "fedgf": fedgf_step}


# --------------------------------------------------------------------------- FedConcat


def encoder_rounds(num_rounds: int, setting: int) -> int:
    """Stage 1's length: the setting, or the authors' split (run.sh: 50 encoder rounds, then 1000
    classifier rounds, 1 : 20) of the run's rounds, rounded, with at least a round in each stage."""
    return setting if setting > 0 else min(num_rounds - 1, max(1, round(num_rounds / 21)))


def cluster_assignment(setting: str, class_counts: np.ndarray, clusters: int, seed: int) -> list[int]:
    """The cluster of each partition: as written in fedconcat-assignment, else the FedConcat
    authors' clustering (sjtudyq/FedConcat experiments.py): scikit-learn's KMeans over the label
    distributions counts / n_i, with k-means++ and the 10 restarts of its default in their day,
    seeded by the run's seed."""
    if setting:
        return [int(v) for v in setting.replace(" ", "").split(",")]
    from sklearn.cluster import KMeans

    distributions = class_counts / class_counts.sum(axis=1, keepdims=True)
    return [int(v) for v in KMeans(n_clusters=clusters, n_init=10, random_state=seed).fit(distributions).labels_]


@torch.no_grad()
def concatenated_features(encoders: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Each frozen encoder's representation (its classifier's input, in eval mode), side by side in
    cluster order: the input of FedConcat's stage-2 head."""
    return torch.cat([encoder.eval().features(x).flatten(1) for encoder in encoders], dim=1)  # type: ignore[operator]


def new_head(width: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FedConcat's new head (the authors' stage 2 builds a new nn.Linear): weight and bias uniform
    in +-1/sqrt(width), PyTorch's initialisation of a Linear layer, drawn from a generator seeded
    seed * 1_000_003 + 21 (docs/running.md, "What a seed fixes")."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 21)
    bound = 1 / math.sqrt(width)
    weight = torch.empty(classes, width).uniform_(-bound, bound, generator=generator)
    bias = torch.empty(classes).uniform_(-bound, bound, generator=generator)
    return weight, bias
