"""Server optimizers: how the checked, sample-weighted average of the clients' models
becomes the next global model (run-config ``server-optimizer``).

Every optimizer sees the same inputs the strategy has already checked: the global model
of the round, the sample-weighted average of the accepted replies (float64 accumulation,
each array's dtype kept) and the accepted replies themselves. It changes only floating
point arrays; integer buffers (BatchNorm's ``num_batches_tracked``) always take the
average. Every optimizer's state (momentum, moments, the previous global model) can be
saved with the checkpoint, so a resumed run continues exactly.

* ``fedavg``: the average itself.
* ``fedexp``: FedExP's extrapolated step (Jhunjhunwala, Wang, Joshi, ICLR 2023).
* ``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``: the server optimizers of Flower's
  ``flwr.serverapp.strategy`` written out in numpy with Flower 1.41's exact arithmetic
  (a test runs them side by side with Flower's), applied to the project's checked average
  instead of Flower's own aggregation, so no Flower object or logger is reached into.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply
from fedvls_flwr.algorithms.parts import RunContext, ServerPart, build_part

__all__ = ["ServerOptimizer", "Average", "FedExP", "FedAvgM", "FedAdam", "FedYogi", "FedAdagrad", "build_server_optimizer"]


def float_keys(arrays: ArrayDict) -> list[str]:
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def squared_norm(x: np.ndarray) -> float:
    """sum(x^2) with elementwise numpy ops: no BLAS call (a threaded BLAS on a busy
    machine made ``np.vdot`` 10-50x slower here, and a BLAS pool once hung a run)."""
    return float(np.square(x).sum())


class ServerOptimizer(ServerPart):
    """Base: the next global model from the round's global model and the checked average."""

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        raise NotImplementedError

    def evaluation_arrays(self, new_global: ArrayDict) -> ArrayDict:
        """The model whose accuracy the round reports (the global model, unless the method
        evaluates something else)."""
        return new_global


def build_server_optimizer(values: Mapping[str, Any], context: RunContext) -> ServerOptimizer:
    """The server optimizer a run config (``values``) selects."""
    return build_part("server-optimizer", values, context, ServerOptimizer)


class Average(ServerOptimizer):
    """FedAvg: the next global model is the average."""

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        return average


class FedExP(ServerOptimizer):
    """w <- w + eta_g * d_bar, eta_g = max(1, sum_i p_i ||d_i||^2 / (2 (||d_bar||^2 + eps))).

    d_i = w_i - w are the accepted clients' updates, p_i = n_i / sum_j n_j their sample
    weights and d_bar = sum_i p_i d_i the average; the norms run over every floating-point
    array of the model (BatchNorm statistics included, integer buffers not). With equal
    client sizes this is the paper's sum_i ||d_i||^2 / (2 M (||d_bar||^2 + eps)); the
    FedExP authors' code weights by data size as here (it also multiplies eps by M and
    decays it every round, which the paper does not; not done here).
    ``fedexp-eval = average-last-two`` reports the accuracy of (w_t + w_{t-1}) / 2, as the
    paper evaluates.
    """

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        self.eps = float(settings["fedexp-eps"])
        self.average_last_two = settings["fedexp-eval"] == "average-last-two"
        self.previous: ArrayDict = {}  # w_{t-1}, for the evaluation average
        self.last_step_size = float("nan")

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        keys = float_keys(global_arrays)
        d_bar = {k: average[k].astype(np.float64) - global_arrays[k] for k in keys}
        total = float(sum(r.num_examples for r in replies))
        mean_sq = 0.0
        for r in replies:
            for k in keys:
                d = r.arrays[k].astype(np.float64) - global_arrays[k]
                mean_sq += r.num_examples / total * squared_norm(d)
        bar_sq = sum(squared_norm(d) for d in d_bar.values())
        self.last_step_size = max(1.0, mean_sq / (2 * (bar_sq + self.eps)))
        new = dict(average)
        for k in keys:
            new[k] = (global_arrays[k] + self.last_step_size * d_bar[k]).astype(global_arrays[k].dtype)
        self.previous = {k: global_arrays[k] for k in keys}
        return new

    def evaluation_arrays(self, new_global: ArrayDict) -> ArrayDict:
        if not (self.average_last_two and self.previous):
            return new_global
        out = dict(new_global)
        for k, prev in self.previous.items():
            out[k] = ((new_global[k].astype(np.float64) + prev) / 2).astype(new_global[k].dtype)
        return out

    def report(self) -> dict[str, float]:
        """The round's step size eta_g (absent before the first step)."""
        return {} if math.isnan(self.last_step_size) else {"server_step_size": self.last_step_size}

    def state(self) -> ArrayDict:
        return {f"previous/{k}": v for k, v in self.previous.items()}

    def load_state(self, state: ArrayDict) -> None:
        self.previous = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("previous/")}


class FedAvgM(ServerOptimizer):
    """Server SGD with momentum on the pseudo-gradient g = w - average (Hsu et al. 2019):
    v <- momentum * v + g (v = g in the first round), w <- w - lr * v.

    The arithmetic of Flower 1.41's ``FedAvgM`` (``flwr.serverapp.strategy``) operation by
    operation, in each array's dtype; ``tests/test_server_optim.py`` runs both side by side.
    """

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        self.lr = float(settings["fedavgm-lr"])
        self.momentum = float(settings["fedavgm-momentum"])
        self.velocity: list[np.ndarray] | None = None  # one per floating-point array, in key order

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        if self.lr == 1.0 and self.momentum == 0.0:
            return average  # Flower's defaults switch the server step off: w - 1 * (w - avg) would round
        keys = float_keys(global_arrays)
        gradient = [global_arrays[k] - average[k] for k in keys]
        if self.momentum > 0.0:
            self.velocity = gradient if self.velocity is None else [
                self.momentum * v + g for v, g in zip(self.velocity, gradient)
            ]
            gradient = self.velocity
        new = dict(average)
        for k, g in zip(keys, gradient):
            new[k] = np.asarray(global_arrays[k] - self.lr * g, dtype=global_arrays[k].dtype)
        return new

    def state(self) -> ArrayDict:
        return {f"momentum/{i}": np.asarray(v) for i, v in enumerate(self.velocity or [])}

    def load_state(self, state: ArrayDict) -> None:
        count = len([k for k in state if k.startswith("momentum/")])
        self.velocity = [state[f"momentum/{i}"] for i in range(count)] or None


class AdaptiveOptimizer(ServerOptimizer):
    """FedAdam / FedYogi / FedAdagrad (Reddi et al., ICLR 2021) on d = average - w:
    m <- beta1 m + (1 - beta1) d, v from d^2 as each method says, w <- w + eta_t m / (sqrt(v) + tau).

    The arithmetic of Flower 1.41's ``FedAdam``/``FedYogi``/``FedAdagrad`` operation by
    operation, including its Adam bias correction eta_t = eta sqrt(1 - beta2^(t+1)) /
    (1 - beta1^(t+1)) with t the server round (so round 1 is corrected as Adam's step 2);
    FedAdagrad has beta1 = 0 (m = d). Results are cast back to each array's dtype.
    """

    rule = ""  # "adam", "yogi" or "adagrad"

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        prefix = f"fed{self.rule}-"
        self.eta = float(settings[prefix + "eta"])
        self.tau = float(settings[prefix + "tau"])
        self.beta1 = float(settings.get(prefix + "beta1", 0.0))
        self.beta2 = float(settings.get(prefix + "beta2", 0.0))
        self.m_t: ArrayDict = {}
        self.v_t: ArrayDict = {}

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        keys = float_keys(global_arrays)
        delta = {k: average[k] - global_arrays[k] for k in keys}
        m_t = self.m_t or {k: np.zeros_like(average[k]) for k in keys}
        self.m_t = {k: self.beta1 * m + (1 - self.beta1) * delta[k] for k, m in m_t.items()}
        v_t = self.v_t or {k: np.zeros_like(average[k]) for k in keys}
        eta = self.eta
        if self.rule == "adam":
            self.v_t = {k: self.beta2 * v + (1 - self.beta2) * (delta[k] ** 2) for k, v in v_t.items()}
            eta = self.eta * np.sqrt(1 - np.power(self.beta2, server_round + 1.0)) / (
                1 - np.power(self.beta1, server_round + 1.0)
            )
        elif self.rule == "yogi":
            self.v_t = {k: v - (1.0 - self.beta2) * (delta[k] ** 2) * np.sign(v - delta[k] ** 2) for k, v in v_t.items()}
        else:
            self.v_t = {k: v + (delta[k] ** 2) for k, v in v_t.items()}
        new = dict(average)
        for k in keys:
            step = global_arrays[k] + eta * self.m_t[k] / (np.sqrt(self.v_t[k]) + self.tau)
            new[k] = np.asarray(step, dtype=global_arrays[k].dtype)
        return new

    def state(self) -> ArrayDict:
        return {f"{name}/{k}": np.asarray(v) for name in ("m_t", "v_t") for k, v in getattr(self, name).items()}

    def load_state(self, state: ArrayDict) -> None:
        for name in ("m_t", "v_t"):
            setattr(self, name, {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(f"{name}/")})


class FedAdam(AdaptiveOptimizer):
    rule = "adam"


class FedYogi(AdaptiveOptimizer):
    rule = "yogi"


class FedAdagrad(AdaptiveOptimizer):
    rule = "adagrad"

