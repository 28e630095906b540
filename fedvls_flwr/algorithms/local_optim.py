"""Local optimizers: how a client turns its objective's gradients into steps
(run-config ``local-optimizer``). Every local objective works with every one of them.

Each is built as every part is (:func:`fedvls_flwr.algorithms.parts.build_part`): from its
settings and a context holding the SGD update it drives and what the server sent it besides
the weights (:class:`fedvls_flwr.algorithms.downlink.Received`; unused by these two; FedGF's
step, :mod:`fedvls_flwr.algorithms.fedgf`, reads it). Each takes
a ``closure`` that clears the gradients, runs the forward pass and the
objective, back-propagates and returns the detached loss terms; the optimizer decides
where (at which weights) and how often the closure runs. The update itself is
:class:`fedvls_flwr.algorithms.sgd.LocalSGD` (``torch.optim.SGD``'s arithmetic): learning rate,
momentum and weight decay as configured, its momentum buffers fresh every round or
carried across rounds (``optimizer-state``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from fedvls_flwr.algorithms.parts import PartContext
from fedvls_flwr.algorithms.sgd import LocalSGD

Closure = Callable[[], torch.Tensor]


def driven_sgd(context: PartContext) -> LocalSGD:
    """The SGD update a local optimizer drives (built on a client, beside it)."""
    if context.sgd is None:
        raise ValueError("a local optimizer drives an SGD update: build it with PartContext(sgd=...)")
    return context.sgd


class SGDStep:
    """Plain (momentum) SGD: one gradient, one step."""

    def __init__(self, params: Mapping[str, Any], context: PartContext) -> None:
        self.sgd = driven_sgd(context)

    def graph_signature(self) -> tuple[Any, ...]:
        """What shapes a captured step besides the tensors :meth:`load_round` copies (see
        :mod:`fedvls_flwr.algorithms.graphed`): the step's kind and its constants."""
        return (type(self).__name__,)

    def load_round(self, other: Any) -> None:
        """Take ``other``'s per-round tensors (built for this round, same signature) in place."""

    def step(self, closure: Closure) -> torch.Tensor:
        terms = closure()
        self.sgd.step()
        return terms


class SAMStep:
    """FedSAM's local step (sharpness-aware minimisation, Foret et al. 2021; Qu et al. 2022):

        g = grad L(w);  e = rho * g / ||g||  (one norm over all parameters)
        g' = grad L(w + e) on the same batch;  w <- SGD step from w with g'.

    Weight decay and momentum enter only the SGD step (``LocalSGD``), as in the SAM
    implementations that wrap a base optimizer. The loss terms reported are those at w.
    Two forward/backward passes per step.
    """

    def __init__(self, params: Mapping[str, Any], context: PartContext) -> None:
        self.sgd = driven_sgd(context)
        self.rho = float(params["sam-rho"])

    def graph_signature(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.rho)

    def load_round(self, other: Any) -> None:
        """Nothing changes from round to round."""

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
