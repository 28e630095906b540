"""FedGF (Lee and Yoon, "Rethinking the Flat Minima Searching in Federated Learning", ICML 2024):
SAM steps on the clients whose second gradient is taken at a point pulled towards a
perturbed global model that the server computes and sends with the weights.

Server, after round t (:class:`FedGFServer`; w^{t-1} was sent, the clients returned w_k,
w^t is the next global model):

    D   = (1/K) sum_k ||w^{t-1} - w_k||          (unweighted mean over the K replies)
    u   = w^{t-1} - w^t                           (old minus new)
    w_g = w^t + rho_g * u / ||u||                 (w_g = w^t when ||u|| = 0)
    c   = the fixed ``fedgf-c``, or (adaptive) the mean of the last W indicators [D > T_D]

and it sends w^t, w_g and c in round t + 1. Norms run over every floating-point array of
the model (BatchNorm statistics included; integer buffers are left out), in float64.

Client, every step on a batch B from the local iterate w (:class:`FedGFStep`):

    g = grad L_B(w);  e = rho * g / (||g|| + 1e-12)      (SAM's ascent, one norm)
    v = c * w_g + (1 - c) * (w + e)                       (a point between two points)
    h = grad L_B(v);  w <- SGD step from w with h         (weight decay, momentum at w)

Nothing is sent in round 1 (no w_g yet): the step is FedSAM's. With c = 0 the step is
FedSAM's bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply
from fedvls_flwr.algorithms.downlink import Downlink
from fedvls_flwr.algorithms.local_optim import Closure, LocalOptimizer, sam_ascent
from fedvls_flwr.algorithms.parts import LocalOptimizerContext, RunContext, ServerCompanion

__all__ = ["FedGFStep", "FedGFServer"]


class FedGFStep(LocalOptimizer):
    """FedGF's local step: FedSAM's, with the second gradient at c * w_g + (1 - c) * (w + e).

    ``received.arrays`` holds w_g by state-dict name (only the entries named in
    ``received.param_names``, the parameters the SGD update trains, are used) and
    ``received.values["c"]`` the coefficient. An empty ``received`` (round 1), or c = 0,
    runs FedSAM's step exactly. The weights are restored by copy after the second
    gradient, so no rounding of (w + e) - e enters the step.
    """

    def __init__(self, settings: Mapping[str, Any], context: LocalOptimizerContext) -> None:
        super().__init__(settings, context)
        sgd = self.sgd
        self.rho = float(settings["sam-rho"])
        received = context.received
        self.c = float(received.values.get("c", 0.0))
        self.target: list[torch.Tensor] | None = None
        if received.arrays and self.c != 0.0:
            if "c" not in received.values:
                raise ValueError("FedGF received a perturbed global model without its coefficient 'c'")
            if len(received.param_names) != len(sgd.params):
                raise ValueError(
                    f"FedGF: received.param_names names {len(received.param_names)} parameters, "
                    f"the local optimizer trains {len(sgd.params)}"
                )
            missing = [n for n in received.param_names if n not in received.arrays]
            if missing:
                raise ValueError(f"FedGF: the perturbed global model lacks {missing[:3]}")
            self.target = [received.arrays[n] for n in received.param_names]
            for name, p, t in zip(received.param_names, sgd.params, self.target):
                if t.shape != p.shape:
                    raise ValueError(f"FedGF: perturbed global '{name}' has shape {tuple(t.shape)}, "
                                     f"the parameter {tuple(p.shape)}")
            self.saved = [torch.empty_like(p) for p in sgd.params]

    def graph_signature(self) -> tuple[Any, ...]:
        """c is a constant of the captured step (an adaptive c takes at most W + 1 values), the
        perturbed global point a tensor that :meth:`load_round` refreshes."""
        return (type(self).__name__, self.rho, None if self.target is None else self.c)

    def own_round_tensors(self) -> None:
        """Hold a copy of this round's perturbed global point (a graphed step keeps this step
        across rounds and refreshes the copy with :meth:`load_round`)."""
        if self.target is not None:
            self.target = [t.detach().clone() for t in self.target]

    def load_round(self, other: LocalOptimizer) -> None:
        """Copy this round's perturbed global point into the tensors the captured step reads."""
        if not isinstance(other, FedGFStep) or other.graph_signature() != self.graph_signature():
            raise ValueError(f"cannot load a FedGF step of {other.graph_signature()} into {self.graph_signature()}")
        if self.target is not None and other.target is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.target, other.target)

    def step(self, closure: Closure) -> torch.Tensor:
        terms = closure()
        if self.target is None:  # FedSAM
            params, eps = sam_ascent(self.sgd, self.rho)
            closure()
            with torch.no_grad():
                torch._foreach_sub_(params, eps)
            self.sgd.step()
            return terms
        everything: list[torch.Tensor] = list(self.sgd.params)
        with torch.no_grad():
            for s, p in zip(self.saved, everything):
                s.copy_(p)
        sam_ascent(self.sgd, self.rho)  # w + e
        with torch.no_grad():  # v = c * w_g + (1 - c) * (w + e)
            torch._foreach_mul_(everything, 1.0 - self.c)
            torch._foreach_add_(everything, self.target, alpha=self.c)
        closure()  # gradients at v
        with torch.no_grad():
            for s, p in zip(self.saved, everything):
                p.copy_(s)
        self.sgd.step()
        return terms


def _float_keys(arrays: ArrayDict) -> list[str]:
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def _norm(arrays: list[np.ndarray]) -> float:
    """sqrt(sum of squares) over several arrays, float64, elementwise ops only (no BLAS)."""
    return math.sqrt(sum(float(np.square(a).sum()) for a in arrays))


class FedGFServer(ServerCompanion):
    """FedGF's server side: the perturbed global model w_g and the coefficient c.

    Settings: ``fedgf-rho-g`` (rho_g), ``fedgf-c`` (the fixed c), ``fedgf-c-mode``
    (``fixed`` or ``adaptive``), ``fedgf-threshold`` (T_D) and ``fedgf-window`` (W).
    ``last_divergence`` is the latest D; each round reports it with the c its clients used.
    """

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        self.rho_g = float(settings["fedgf-rho-g"])
        self.fixed_c = float(settings["fedgf-c"])
        self.adaptive = settings["fedgf-c-mode"] == "adaptive"
        self.threshold = float(settings["fedgf-threshold"])
        self.window_size = int(settings["fedgf-window"])
        self.perturbed: ArrayDict = {}  # w_g, in the model's dtypes (what is sent)
        self.window: list[int] = []  # the last W indicators [D > T_D]
        self.c = 0.0
        self.sent_c = 0.0  # the c sent with this round's weights (0: the clients ran FedSAM)
        self.last_divergence = float("nan")

    def downlink(self, server_round: int, global_arrays: ArrayDict) -> Downlink:
        if not self.perturbed or self.c == 0.0:
            self.sent_c = 0.0
            return Downlink()  # round 1, or nothing to mix: the clients run FedSAM
        self.sent_c = self.c
        return Downlink(arrays=dict(self.perturbed), values={"c": self.c})

    def observe(self, server_round: int, sent: ArrayDict, new_global: ArrayDict, replies: list[Reply]) -> None:
        keys = _float_keys(sent)
        old = {k: sent[k].astype(np.float64) for k in keys}
        self.last_divergence = sum(
            _norm([old[k] - r.arrays[k].astype(np.float64) for k in keys]) for r in replies
        ) / len(replies) if replies else float("nan")
        new = {k: new_global[k].astype(np.float64) for k in keys}
        u = {k: old[k] - new[k] for k in keys}
        norm = _norm(list(u.values()))
        scale = self.rho_g / norm if norm > 0.0 else 0.0
        self.perturbed = {k: (new[k] + scale * u[k]).astype(new_global[k].dtype) for k in keys}
        if self.adaptive:
            self.window.append(int(self.last_divergence > self.threshold))
            del self.window[: -self.window_size]
            self.c = sum(self.window) / len(self.window)
        else:
            self.c = self.fixed_c

    def report(self) -> dict[str, float]:
        return {"fedgf_c": self.sent_c, "fedgf_divergence": self.last_divergence}

    def state(self) -> ArrayDict:
        if not self.perturbed:
            return {}
        out = {f"perturbed/{k}": v for k, v in self.perturbed.items()}
        out["c"] = np.asarray(self.c, dtype=np.float64)
        out["window"] = np.asarray(self.window, dtype=np.int64)
        out["divergence"] = np.asarray(self.last_divergence, dtype=np.float64)
        return out

    def load_state(self, state: ArrayDict) -> None:
        self.perturbed = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("perturbed/")}
        self.c = float(state["c"]) if "c" in state else 0.0
        self.window = [int(v) for v in state.get("window", np.zeros(0, dtype=np.int64))]
        self.last_divergence = float(state["divergence"]) if "divergence" in state else float("nan")
