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
* ``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``: Flower's own implementations
  (``flwr.serverapp.strategy``), fed the project's checked average: their
  ``aggregate_train`` receives one reply that carries the average (whose weighted average
  is the average itself, weight 1 exactly) and applies its update from the round's global
  model. Numpy numbers they create are cast back to each array's dtype.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .aggregation import ArrayDict, Reply
from .methods import get_part

__all__ = ["ServerOptimizer", "Average", "FedExP", "FlowerOptimizer", "build_server_optimizer"]


def float_keys(arrays: ArrayDict) -> list[str]:
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def squared_norm(x: np.ndarray) -> float:
    """sum(x^2) with elementwise numpy ops: no BLAS call (a threaded BLAS on a busy
    machine made ``np.vdot`` 10-50x slower here, and a BLAS pool once hung a run)."""
    return float(np.square(x).sum())


class ServerOptimizer:
    """Base: the next global model from the round's global model and the checked average."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        raise NotImplementedError

    def evaluation_arrays(self, new_global: ArrayDict) -> ArrayDict:
        """The model whose accuracy the round reports (the global model, unless the method
        evaluates something else)."""
        return new_global

    def state(self) -> ArrayDict:
        """Arrays to checkpoint (empty when the optimizer keeps no state)."""
        return {}

    def load_state(self, state: ArrayDict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)[:3]}")


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

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__(params)
        self.eps = float(params["fedexp-eps"])
        self.average_last_two = params["fedexp-eval"] == "average-last-two"
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

    def state(self) -> ArrayDict:
        return {f"previous/{k}": v for k, v in self.previous.items()}

    def load_state(self, state: ArrayDict) -> None:
        self.previous = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("previous/")}


#: Our keys -> the keyword arguments of Flower's strategies.
_FLOWER_KWARGS = {
    "fedavgm": {"fedavgm-lr": "server_learning_rate", "fedavgm-momentum": "server_momentum"},
    "fedadam": {"fedadam-eta": "eta", "fedadam-beta1": "beta_1", "fedadam-beta2": "beta_2", "fedadam-tau": "tau"},
    "fedyogi": {"fedyogi-eta": "eta", "fedyogi-beta1": "beta_1", "fedyogi-beta2": "beta_2", "fedyogi-tau": "tau"},
    "fedadagrad": {"fedadagrad-eta": "eta", "fedadagrad-tau": "tau"},
}


class FlowerOptimizer(ServerOptimizer):
    """One of Flower's server-optimizer strategies applied to the checked average."""

    def __init__(self, name: str, params: Mapping[str, Any]) -> None:
        super().__init__(params)
        module, _, attr = get_part("server-optimizer", name).impl.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        kwargs = {flwr_key: params[key] for key, flwr_key in _FLOWER_KWARGS[name].items()}
        self.name = name
        self.strategy = cls(**kwargs)

    def step(self, server_round: int, global_arrays: ArrayDict, average: ArrayDict, replies: list[Reply]) -> ArrayDict:
        from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
        from flwr.app.metadata import Metadata

        keys = float_keys(global_arrays)
        current = {k: global_arrays[k] for k in keys}
        # what each strategy's configure_train would have stored for this round
        if self.name == "fedavgm":
            self.strategy.current_arrays = ArrayRecord({k: Array(v) for k, v in current.items()})
        else:
            self.strategy.current_arrays = current
        content = RecordDict({
            "arrays": ArrayRecord({k: Array(np.require(average[k], requirements="C")) for k in keys}),
            "metrics": MetricRecord({"num-examples": 1}),
        })
        metadata = Metadata(
            run_id=0, message_id="average", src_node_id=0, dst_node_id=0, reply_to_message_id="",
            group_id=str(server_round), created_at=time.time(), ttl=1.0, message_type="train",
        )
        flwr_logger = logging.getLogger("flwr")
        level = flwr_logger.level
        flwr_logger.setLevel(logging.WARNING)  # not its "Received 1 results" line for our one reply
        try:
            record, _ = self.strategy.aggregate_train(server_round, [Message(content, metadata=metadata)])
        finally:
            flwr_logger.setLevel(level)
        new = dict(average)
        for k in keys:
            new[k] = np.asarray(record[k].numpy(), dtype=global_arrays[k].dtype)
        return new

    def state(self) -> ArrayDict:
        out: ArrayDict = {}
        if self.name == "fedavgm":
            for i, v in enumerate(self.strategy.momentum_vector or []):
                out[f"momentum/{i}"] = np.asarray(v)
            return out
        for attr in ("m_t", "v_t"):
            for k, v in (getattr(self.strategy, attr) or {}).items():
                out[f"{attr}/{k}"] = np.asarray(v)
        return out

    def load_state(self, state: ArrayDict) -> None:
        if self.name == "fedavgm":
            count = len([k for k in state if k.startswith("momentum/")])
            self.strategy.momentum_vector = [state[f"momentum/{i}"] for i in range(count)] or None
            return
        for attr in ("m_t", "v_t"):
            values = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(f"{attr}/")}
            setattr(self.strategy, attr, values or None)


def build_server_optimizer(name: str, params: Mapping[str, Any]) -> ServerOptimizer:
    """The server optimizer ``name`` with its settings (kebab-case run-config keys)."""
    if name in _FLOWER_KWARGS:
        return FlowerOptimizer(name, params)
    module, _, attr = get_part("server-optimizer", name).impl.partition(":")
    return getattr(importlib.import_module(module), attr)(params)
