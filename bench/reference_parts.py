"""The reference loop's own server side and local steps, written out from the formulas.

Everything here follows docs/methods.md and the module docstrings of the app's parts
(``algorithms/local_optim.py``, ``fedgf.py``, ``server_optim.py``, ``fedconcat.py``,
``sampling.py``), never their code: a differential test (``tests/test_differential.py``)
runs the app and :mod:`bench.reference_loop` side by side, so a shared implementation would
hide the very bugs it looks for. Server arithmetic is float64 (cast to each array's dtype
where a model is formed); the app's own order of float32 operations is not copied, which is
why the comparison allows float rounding.

``COVERED`` names every part written out here or in the loop: a part registered without a
reference fails the differential test by name.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

Arrays = dict[str, np.ndarray]

#: The parts the reference loop knows, by kind (the run-config key that selects them).
COVERED: dict[str, tuple[str, ...]] = {
    # objectives come from objective_for; the loop provides each one's hooks: a teacher's
    # logits, MOON's projections and previous model, penultimate features, FedProx's gradient
    "method": ("fedavg", "fedprox", "moon", "fedrs", "fedlmd", "feddecorr", "fedmr", "fedlc", "fedntd",
               "fedvls", "fedvls-paper"),
    "local-optimizer": ("sgd", "sam", "fedgf"),
    "server-optimizer": ("fedavg", "fedexp", "fedavgm", "fedadam", "fedyogi", "fedadagrad"),
    "protocol": ("standard", "fedconcat"),
}

#: Methods whose loss reads this client's model of its previous round (MOON's negative).
KEEPS_PREVIOUS_MODEL = ("moon",)


class NotCovered(ValueError):
    """A run selects a part the reference loop has no reference for."""


def check_covered(values: Mapping[str, Any]) -> None:
    for kind, names in COVERED.items():
        name = str(values[kind])
        if name not in names:
            raise NotCovered(
                f"the reference loop has no reference for {kind} '{name}': write it out from its formula in "
                f"bench/reference_parts.py (or the loop) and add it to COVERED[{kind!r}]")


# --------------------------------------------------------------------------- sampling


def sampled_partitions(num_clients: int, fraction: float, seed: int, server_round: int) -> list[int]:
    """fraction-train of the partitions (at least one), drawn with Random(seed * 1_000_003 + round)
    from the partitions in id order."""
    k = max(1, int(num_clients * fraction + 1e-9))
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(random.Random(seed * 1_000_003 + server_round).sample(list(range(num_clients)), k))


# --------------------------------------------------------------------------- aggregation


def float_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def weighted_average(states: Sequence[Arrays], weights: Sequence[float]) -> Arrays:
    """sum_i (n_i / sum_j n_j) w_i, every term and the sum in float64, cast back to each array's
    dtype (integers rounded)."""
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
    """w + eta_g (w_avg - w), eta_g = max(1, sum_i p_i ||d_i||^2 / (2 (||d_bar||^2 + eps)))."""

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
    """v <- momentum v + (w - w_avg) (v = w - w_avg the first time), w <- w - lr v."""

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
    """Reddi et al.'s FedAdam / FedYogi / FedAdagrad with Flower's bias correction for Adam:
    d = w_avg - w, m <- b1 m + (1 - b1) d, v by the rule, w <- w + eta_t m / (sqrt(v) + tau)."""

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


def server_optimizer(name: str, params: Mapping[str, Any]) -> ServerStep:
    if name in ("fedadam", "fedyogi", "fedadagrad"):
        return Adaptive(params, name[3:])
    return {"fedavg": ServerStep, "fedexp": FedExP, "fedavgm": FedAvgM}[name](params)


# --------------------------------------------------------------------------- FedGF's server side


@dataclass
class FedGFPoint:
    """What a FedGF client receives from round 2: the perturbed global model w_g and c."""

    arrays: dict[str, torch.Tensor]
    c: float


@dataclass
class FedGFServer:
    """After round t: D = mean_k ||w^{t-1} - w_k||, u = w^{t-1} - w^t, w_g = w^t + rho_g u / ||u||
    (w^t when u = 0), c fixed or the mean of the last W indicators [D > T_D]."""

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
    """e = rho g / (||g|| + 1e-12), one norm over every parameter's gradient."""
    grads = [p.grad for p in params]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return [g * (rho / (total + 1e-12)) for g in grads]


def local_step(kind: str, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, gradient: GradientAt,
               rho: float, point: FedGFPoint | None, names: list[str]) -> None:
    """One local step of ``kind`` (sgd, sam, fedgf) on the batch ``gradient`` closes over."""
    gradient()
    if kind == "sgd":
        optimizer.step()
        return
    live = [p for p in params if p.grad is not None]
    e = _ascent(live, rho)
    if kind == "sam" or point is None:  # FedSAM: gradient at w + e, step from w
        with torch.no_grad():
            for p, ei in zip(live, e):
                p.add_(ei)
        gradient()
        with torch.no_grad():
            for p, ei in zip(live, e):
                p.sub_(ei)
        optimizer.step()
        return
    # FedGF: the second gradient at v = c w_g + (1 - c)(w + e), then the step from w
    saved = [p.detach().clone() for p in params]
    step_of = {id(p): ei for p, ei in zip(live, e)}
    with torch.no_grad():
        for p, name in zip(params, names):
            ascended = p + step_of[id(p)] if id(p) in step_of else p
            p.copy_(point.c * point.arrays[name] + (1 - point.c) * ascended)
    gradient()
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    optimizer.step()


# --------------------------------------------------------------------------- FedConcat


def encoder_rounds(num_rounds: int, setting: int) -> int:
    """Stage 1's length: the setting, or the 1 : 20 split with at least a round in each stage."""
    return setting if setting > 0 else min(num_rounds - 1, max(1, round(num_rounds / 21)))


def cluster_assignment(setting: str, class_counts: np.ndarray, clusters: int, seed: int) -> list[int]:
    """The cluster of each partition: as written in fedconcat-assignment, else K-means
    (k-means++, 10 restarts, seeded) over the label distributions counts / n_i."""
    if setting:
        return [int(v) for v in setting.replace(" ", "").split(",")]
    from sklearn.cluster import KMeans

    distributions = class_counts / class_counts.sum(axis=1, keepdims=True)
    return [int(v) for v in KMeans(n_clusters=clusters, n_init=10, random_state=seed).fit(distributions).labels_]


def last_linear(model: nn.Module) -> nn.Linear:
    """The model's classifier: its last nn.Linear (an encoder's features are its input)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


@torch.no_grad()
def concatenated_features(encoders: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Each frozen encoder's classifier input (eval mode), side by side in cluster order."""
    seen: list[torch.Tensor] = []
    for encoder in encoders:
        handle = last_linear(encoder).register_forward_pre_hook(lambda _m, inputs: seen.append(inputs[0].flatten(1)))
        try:
            encoder.eval()
            encoder(x)
        finally:
            handle.remove()
    return torch.cat(seen, dim=1)


def new_head(width: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A new nn.Linear(width, classes) as PyTorch initialises one (weight and bias uniform in
    +-1/sqrt(width)), drawn from a generator seeded seed * 1_000_003 + 21."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 21)
    bound = 1 / math.sqrt(width)
    weight = torch.empty(classes, width).uniform_(-bound, bound, generator=generator)
    bias = torch.empty(classes).uniform_(-bound, bound, generator=generator)
    return weight, bias
