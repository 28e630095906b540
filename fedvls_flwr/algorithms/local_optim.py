"""Local optimizers: how a client turns its objective's gradients into steps
(run-config ``local-optimizer``). Every local objective works with every one of them.

Each is a :class:`LocalOptimizer`, built as every part is (:mod:`fedvls_flwr.algorithms.build`):
from its settings and a :class:`~fedvls_flwr.algorithms.parts.LocalOptimizerContext` holding the
SGD update it drives and what the server sent it besides the weights
(:class:`fedvls_flwr.algorithms.downlink.Received`; unused by these two; FedGF's step,
:mod:`fedvls_flwr.algorithms.fedgf`, reads it). Each takes a ``closure`` that clears the
gradients, runs the forward pass and the objective, back-propagates and returns the detached
loss terms; the optimizer decides where (at which weights) and how often the closure runs. The
update itself is :class:`fedvls_flwr.algorithms.sgd.LocalSGD` (``torch.optim.SGD``'s
arithmetic): learning rate, momentum and weight decay as configured, its momentum buffers
fresh every round or carried across rounds (``optimizer-state = carry``: the local optimizer's
client state, :meth:`LocalOptimizer.client_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from fedvls_flwr.algorithms.parts import LocalOptimizerContext, StateDict, build_part
from fedvls_flwr.algorithms.sgd import LocalSGD

__all__ = ["Closure", "LocalOptimizer", "SAMStep", "SGDStep", "build_local_optimizer", "sam_ascent"]

Closure = Callable[[], torch.Tensor]

#: The key of a kept momentum's number of buffers (a buffer never used is left out).
MOMENTUM_COUNT = "count"


class LocalOptimizer:
    """A local optimizer: how a client turns its objective's gradients into steps of the SGD
    update it drives (``self.sgd``). Its client state is that update's momentum, carried across
    rounds when the context says so (``optimizer-state = carry``), else fresh every round."""

    def __init__(self, settings: Mapping[str, Any], context: LocalOptimizerContext) -> None:
        self.settings = dict(settings)
        self.sgd: LocalSGD = context.sgd
        self.carry_momentum = context.carry_momentum

    def step(self, closure: Closure) -> torch.Tensor:
        """One step on a batch; returns the loss terms ``closure`` gave at the weights it started from."""
        raise NotImplementedError

    # -- a CUDA graph of the step (fedvls_flwr.algorithms.graphed) ---------------------------
    def graph_signature(self) -> tuple[Any, ...]:
        """What shapes a captured step besides the tensors :meth:`load_round` copies (see
        :mod:`fedvls_flwr.algorithms.graphed`): the step's kind and its constants."""
        return (type(self).__name__,)

    def own_round_tensors(self) -> None:
        """Hold copies of this round's tensors (a graphed step keeps this optimizer across rounds
        and refreshes them with :meth:`load_round`); nothing for a step without any."""

    def load_round(self, other: LocalOptimizer) -> None:
        """Take ``other``'s per-round tensors (built for this round, same signature) in place."""

    # -- client state ----------------------------------------------------------------------
    def load_client_state(self, state: StateDict) -> None:
        """Start the round from the momentum this node kept (fresh when it kept none, or when
        momentum does not carry)."""
        carried = None
        if self.carry_momentum and state:
            count = int(state[MOMENTUM_COUNT])
            carried = [state.get(str(i)) for i in range(count)]
        self.sgd.load_momentum(carried)

    def client_state(self) -> StateDict:
        """The momentum buffers after the round (copies), when momentum carries; else nothing."""
        if not self.carry_momentum:
            return {}
        kept: StateDict = {MOMENTUM_COUNT: torch.tensor(len(self.sgd.buffers))}
        kept.update({str(i): b.detach().to("cpu", copy=True) for i, b in enumerate(self.sgd.buffers) if b is not None})
        return kept


def build_local_optimizer(values: Mapping[str, Any], context: LocalOptimizerContext) -> LocalOptimizer:
    """The local optimizer a run config (``values``) selects, driving ``context.sgd``."""
    return build_part("local-optimizer", values, context, LocalOptimizer)


class SGDStep(LocalOptimizer):
    """Plain (momentum) SGD: one gradient, one step."""

    def step(self, closure: Closure) -> torch.Tensor:
        terms = closure()
        self.sgd.step()
        return terms


class SAMStep(LocalOptimizer):
    """FedSAM's local step (sharpness-aware minimisation, Foret et al. 2021; Qu et al. 2022):

        g = grad L(w);  e = rho * g / ||g||  (one norm over all parameters)
        g' = grad L(w + e) on the same batch;  w <- SGD step from w with g'.

    Weight decay and momentum enter only the SGD step (``LocalSGD``), as in the SAM
    implementations that wrap a base optimizer. The loss terms reported are those at w.
    Two forward/backward passes per step.
    """

    def __init__(self, settings: Mapping[str, Any], context: LocalOptimizerContext) -> None:
        super().__init__(settings, context)
        self.rho = float(settings["sam-rho"])

    def graph_signature(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.rho)

    def step(self, closure: Closure) -> torch.Tensor:
        terms = closure()
        params, eps = sam_ascent(self.sgd, self.rho)
        closure()  # gradients at w + e
        with torch.no_grad():
            torch._foreach_sub_(params, eps)
        self.sgd.step()
        return terms


@torch.no_grad()
def sam_ascent(sgd: LocalSGD, rho: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """SAM's ascent from the gradients just computed: w <- w + e, e = rho * g / (||g|| + 1e-12),
    one norm over every parameter that has a gradient. Returns those parameters and e."""
    params: list[torch.Tensor] = [p for p in sgd.params if p.grad is not None]
    grads: list[torch.Tensor] = [cast(torch.Tensor, p.grad) for p in params]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    scale = rho / (norm + 1e-12)
    eps = list(torch._foreach_mul(grads, scale))
    torch._foreach_add_(params, eps)
    return params, eps
