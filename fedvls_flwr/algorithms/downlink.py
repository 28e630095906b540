"""What the server sends with the weights for the run's parts, and what a client receives.

Most parts need nothing on the server but the global model. A part that does (FedGF: a
perturbed global point and a coefficient c, recomputed after every round) declares a server
companion in its spec (``Part.server``; the class:
:class:`fedvls_flwr.algorithms.parts.ServerCompanion`). Before every round the strategy asks
each companion for its :class:`Downlink` and merges them (:func:`merge_downlinks`); the
message carries them in the ArrayRecord / ConfigRecord ``downlink``, and the client hands them
to the run's local optimizer as a :class:`Received`.

Plain numpy on the server and torch on the client; no Flower import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["Downlink", "Received", "merge_downlinks"]


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
