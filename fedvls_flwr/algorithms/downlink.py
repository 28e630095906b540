"""State a part keeps on the server and sends with the weights: the server-side companion.

Most parts need nothing on the server but the global model. A part that does (FedGF: a
perturbed global point and a coefficient c, recomputed after every round) declares a
companion class in its registry entry (``Part.server``). The strategy then, without naming
the part:

* asks it, before every round, what to send besides the weights (:meth:`ServerCompanion.downlink`:
  arrays keyed like the model's state dict, and scalar values); the message carries them in
  the ArrayRecord / ConfigRecord ``downlink`` and the client hands them to the part as a
  :class:`Received`;
* shows it, after every round, the weights it sent, the new global model and the accepted
  replies (:meth:`ServerCompanion.observe`);
* checkpoints its state with the global model (:meth:`ServerCompanion.state` /
  :meth:`ServerCompanion.load_state`, as every :class:`fedvls_flwr.algorithms.parts.ServerPart`),
  so a resumed run continues with the same values.

Plain numpy on the server and torch on the client; no Flower import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply
from fedvls_flwr.algorithms.parts import ServerPart

__all__ = ["Downlink", "Received", "ServerCompanion", "merge_downlinks"]


@dataclass
class Downlink:
    """What a companion sends with the weights in one round (server side, numpy)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.arrays or self.values)


@dataclass
class Received:
    """The downlink as a client sees it: tensors on its training device, scalar values.
    Empty when the server sent nothing this round (e.g. FedGF's first round).
    ``param_names``: the state-dict names of the local optimizer's parameters
    (``LocalSGD.params``), in the same order, so a part can match arrays to parameters."""

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    #: the state-dict names of the local optimizer's parameters, in its order (set by the
    #: training loop), so a part can line ``arrays`` up with them
    param_names: list[str] = field(default_factory=list)


class ServerCompanion(ServerPart):
    """The server side of a client part; the default sends nothing and observes nothing."""

    def downlink(self, server_round: int, global_arrays: ArrayDict) -> Downlink:
        """What to send with ``global_arrays`` in ``server_round``."""
        return Downlink()

    def observe(self, server_round: int, sent: ArrayDict, new_global: ArrayDict, replies: list[Reply]) -> None:
        """The round is over: ``sent`` was broadcast, ``new_global`` is the next global model."""


def merge_downlinks(downlinks: Mapping[str, Downlink]) -> Downlink:
    """One message's downlink from every companion's (a key sent by two parts is a bug)."""
    merged = Downlink()
    for name, downlink in downlinks.items():
        clash = sorted((set(merged.arrays) & set(downlink.arrays)) | (set(merged.values) & set(downlink.values)))
        if clash:
            raise ValueError(f"part {name!r} sends {clash[:3]}, which another part sends too")
        merged.arrays.update(downlink.arrays)
        merged.values.update(downlink.values)
    return merged
