"""Local SGD with momentum and weight decay: torch.optim.SGD's update, without its start-up cost.

The first use of any ``torch.optim`` optimizer imports ``torch._dynamo`` (about 1 s of
CPU here). A simulation actor pays that once, but in deployment every message starts a
fresh ClientApp process and pays it every round. The clients only ever need plain SGD
(no nesterov, no dampening, a fresh optimizer every round), which is three foreach
operations per step:

    d   = g + weight_decay * w
    buf = d                        (first step)
    buf = momentum * buf + d       (later steps)
    w   = w - lr * buf             (buf = d when momentum = 0)

the same arithmetic, in the same order, as ``torch.optim.SGD``
(``tests/test_sgd.py`` checks the weights are bitwise equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch


class LocalSGD:
    """SGD with momentum and weight decay for one round of local training."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        #: the buffers are allocated once and overwritten in place (a CUDA graph's step reads them
        #: at fixed addresses): :meth:`hold_buffers`
        self.static = False

    def hold_buffers(self) -> None:
        """Allocate the momentum buffers now, as zeros, to be overwritten in place from here on
        (SGD's first step from a zero buffer, ``0 * m + g``, is a fresh optimizer's ``buf = g``)."""
        self.buffers = [torch.zeros_like(p) for p in self.params]
        self.static = True

    def load_momentum(self, carried: list[torch.Tensor | None] | None) -> None:
        """Start from ``carried`` momentum buffers (a buffer None: its parameter never had a
        gradient), or fresh ones (None). Held buffers (:meth:`hold_buffers`) are overwritten in
        place, a fresh one with zeros; otherwise the carried ones move to the parameters' device."""
        if carried is not None and len(carried) != len(self.params):
            raise ValueError(f"carried momentum has {len(carried)} buffers, the model {len(self.params)}")
        if self.static:
            with torch.no_grad():
                for i, buf in enumerate(self.buffers):
                    assert buf is not None
                    saved = None if carried is None else carried[i]
                    if saved is None:
                        buf.zero_()
                    else:
                        buf.copy_(saved)
        elif carried is not None:
            self.buffers = [None if b is None else b.to(p.device) for b, p in zip(carried, self.params)]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of the parameters that have a gradient (others are left alone, as torch does)."""
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        params: list[torch.Tensor] = [self.params[i] for i in live]
        grads: list[torch.Tensor] = [cast(torch.Tensor, p.grad) for p in params]
        if self.weight_decay != 0.0:
            grads = list(torch._foreach_add(grads, params, alpha=self.weight_decay))
        if self.momentum != 0.0:
            old: list[torch.Tensor] = []
            old_grads: list[torch.Tensor] = []
            for i, g in zip(live, grads):
                buf = self.buffers[i]
                if buf is None:
                    self.buffers[i] = g.clone()
                else:
                    old.append(buf)
                    old_grads.append(g)
            if old:
                torch._foreach_mul_(old, self.momentum)
                torch._foreach_add_(old, old_grads)
            grads = [cast(torch.Tensor, self.buffers[i]) for i in live]
        torch._foreach_add_(params, grads, alpha=-self.lr)
