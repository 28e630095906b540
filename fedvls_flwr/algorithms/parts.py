"""Every part of a run is built one way, and every part that keeps state on the server keeps it one way.

A run combines four parts, one of each kind: the local objective (``method``), the local
optimizer, the server optimizer and the protocol (:mod:`fedvls_flwr.config.registry`).
:func:`build_part` builds the one a run selects: it loads the registered implementation and
calls it with

* its own settings - the part's registered keys, coerced, checked against their rules and
  with defaults filled in: the only way a part reads a setting, on the server and on a
  client alike;
* a :class:`PartContext` - what it runs beside: the run's general settings, and on a client
  its label counts, the SGD update it drives, what the server sent it.

On the server, :func:`server_parts` builds each part's server side: the server optimizer and
the protocol run there, and a client part may declare a companion (``Part.server``: FedGF's
perturbed global point). Each is a :class:`ServerPart`, with the same ``state`` /
``load_state`` / ``report``: the checkpoint keeps every part's state under its kind
(``server-optimizer/...``, ``protocol/...``, ``local-optimizer/...``), and a round's record
carries every part's report.

Plain Python and torch; no Flower import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedvls_flwr.config.registry import SERVER_KINDS, Part, run_parts

if TYPE_CHECKING:
    from torch import Tensor

    from fedvls_flwr.algorithms.downlink import Received
    from fedvls_flwr.algorithms.sgd import LocalSGD
    from fedvls_flwr.config.run_config import RunConfig

__all__ = ["PartContext", "ServerPart", "build_part", "part_settings", "server_parts", "state_by_kind", "split_state"]

#: A part's state: named numpy arrays (what a checkpoint holds).
ArrayDict = dict[str, np.ndarray]


@dataclass(frozen=True)
class PartContext:
    """What a part is built beside; each part reads what it needs and nothing else.

    ``run``: the run's validated settings (general ones such as the seed, the rounds or the
    learning rate; a part's own settings come as its first argument). On a client:
    ``class_counts`` (the client's label counts, for an objective), ``sgd`` (the SGD update a
    local optimizer drives) and ``received`` (what the server sent for the run's parts).
    ``fixed_shapes``: the client's step runs as a CUDA graph (:mod:`fedvls_flwr.algorithms.graphed`),
    so an objective keeps whatever it derives from the class counts in tensors whose shapes
    depend on the number of classes only, and its step reads nothing back to the host.
    """

    run: RunConfig | None = None
    class_counts: Tensor | None = None
    sgd: LocalSGD | None = None
    received: Received | None = None
    fixed_shapes: bool = False


class ServerPart:
    """The server side of a part: what it keeps across rounds and says about each round.

    The default keeps nothing and says nothing.
    """

    def __init__(self, params: Mapping[str, Any], context: PartContext) -> None:
        self.params = dict(params)
        self.context = context

    def state(self) -> ArrayDict:
        """Arrays to checkpoint (empty when the part keeps no state)."""
        return {}

    def load_state(self, state: ArrayDict) -> None:
        """A resumed run's saved state (what :meth:`state` returned)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)[:3]}")

    def report(self) -> dict[str, float]:
        """Numbers for the round's record (rounds.jsonl), read after the round is aggregated."""
        return {}


def part_settings(part: Part, values: Mapping[str, Any]) -> dict[str, Any]:
    """``part``'s own settings out of ``values`` (a whole run config, or only some of the
    part's keys): coerced, checked, defaults for the missing ones."""
    settings = part.defaults()
    for setting in part.settings:
        if setting.key in values:
            settings[setting.key] = setting.coerce(values[setting.key])
            setting.validate(settings[setting.key])
    return settings


def build_part(kind: str, values: Mapping[str, Any], context: PartContext | None = None) -> Any:
    """The part of ``kind`` that ``values`` selects (``values[kind]``, else the kind's default),
    built from its own settings in ``values`` and ``context``."""
    part = run_parts(values)[kind]
    return part.load()(part_settings(part, values), context or PartContext())


def server_parts(cfg: RunConfig) -> dict[str, ServerPart]:
    """kind -> the server side of the run's part of that kind: the server optimizer and the
    protocol, and the companion a client part declares (``Part.server``)."""
    values = cfg.to_flower()
    context = PartContext(run=cfg)
    out: dict[str, ServerPart] = {}
    for kind, part in run_parts(values).items():
        impl = part.load() if kind in SERVER_KINDS else part.load_server()
        if impl is not None:
            out[kind] = impl(part_settings(part, values), context)
    return out


def state_by_kind(parts: Mapping[str, ServerPart]) -> ArrayDict:
    """Every part's state, each array under ``<kind>/``."""
    return {f"{kind}/{key}": value for kind, part in parts.items() for key, value in part.state().items()}


def split_state(arrays: Mapping[str, np.ndarray], kinds: Any) -> tuple[ArrayDict, dict[str, ArrayDict]]:
    """A checkpoint's arrays -> (the protocol's round state, kind -> that part's saved state)."""
    prefixes = {kind: f"{kind}/" for kind in kinds}
    saved: dict[str, ArrayDict] = {kind: {} for kind in kinds}
    rest: ArrayDict = {}
    for key, value in arrays.items():
        kind = next((k for k, prefix in prefixes.items() if key.startswith(prefix)), None)
        if kind is None:
            rest[key] = value
        else:
            saved[kind][key[len(prefixes[kind]):]] = value
    return rest, saved

