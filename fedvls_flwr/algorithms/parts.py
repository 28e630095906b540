"""The contract every part of a run keeps: what it is built beside, what it keeps between rounds.

A run combines four parts, one of each kind: the local objective (``method``), the local
optimizer, the server optimizer and the protocol; each declares itself in its spec
(:class:`fedvls_flwr.config.spec.Part`) and is built one way, :func:`build_part`: the
registered implementation, checked to be of its kind's base class, called with its own
settings (:meth:`~fedvls_flwr.config.spec.Part.own_settings`: coerced, checked, defaults filled
in - the only way a part reads a setting) and the context of its kind. Each kind's builder sits
beside its base class and says what it returns: ``build_objective``
(:mod:`~fedvls_flwr.algorithms.objectives.base`), ``build_local_optimizer``
(:mod:`~fedvls_flwr.algorithms.local_optim`), ``build_server_optimizer``
(:mod:`~fedvls_flwr.algorithms.server_optim`), ``build_protocol``
(:mod:`~fedvls_flwr.algorithms.rounds`) and :func:`build_companions`. The contexts:

* :class:`ObjectiveContext` - an objective is built on a client, for its label counts;
* :class:`LocalOptimizerContext` - a local optimizer drives the client's SGD update, with what
  the server sent it besides the weights and whether its momentum carries across rounds;
* :class:`RunContext` - a part built for the whole run (the server optimizer, the protocol -
  on the server, and on a client for its step - and a client part's server companion): the
  run's validated general settings.

State is kept one way on each side:

* **on the server**, every part is a :class:`ServerPart` with ``state`` / ``load_state`` /
  ``report``: the checkpoint keeps every part's state under its kind (``server-optimizer/...``,
  ``protocol/...``, ``local-optimizer/...``, :func:`state_by_kind`), and a round's record carries
  every part's report. A client part that needs state on the server and sent with the weights
  declares a :class:`ServerCompanion` (FedGF's perturbed global point);
* **on a client**, a part that keeps something between rounds says so with
  ``load_client_state`` (state dict in, before the round) and ``client_state`` (state dict out,
  after it): MOON's objective its previous local model, a local optimizer its momentum when
  ``optimizer-state = carry``, FedConcat's protocol its frozen encoders. :class:`ClientState`
  holds them by kind; the ClientApp keeps it in the node's ``Context.state``
  (:mod:`fedvls_flwr.app.client`), the same in a simulation, a deployment and the in-process engine.

Plain Python, numpy and torch; no Flower import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply
from fedvls_flwr.algorithms.downlink import Downlink, Received
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.config.registry import run_parts
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.config.spec import Part

__all__ = [
    "ClientState", "LocalOptimizerContext", "ObjectiveContext", "ServerCompanion", "RunContext", "ServerPart",
    "StateDict", "build_companions", "build_part", "implementation", "split_state", "state_by_kind",
]

#: What a client part keeps between rounds: named tensors (a state dict).
StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ObjectiveContext:
    """What a local objective is built beside: the client's label counts (C,), and whether its
    step runs as a CUDA graph (``fixed_shapes``, :mod:`fedvls_flwr.algorithms.graphed`): then it
    keeps whatever it derives from the counts in tensors whose shapes depend on the number of
    classes only, and its step reads nothing back to the host."""

    class_counts: torch.Tensor
    fixed_shapes: bool = False


@dataclass(frozen=True)
class LocalOptimizerContext:
    """What a local optimizer is built beside: the SGD update it drives, what the server sent
    for the run's parts besides the weights (FedGF's perturbed global point and c), and whether
    the update's momentum carries across rounds (``optimizer-state = carry``)."""

    sgd: LocalSGD
    received: Received = field(default_factory=Received)
    carry_momentum: bool = False


@dataclass(frozen=True)
class RunContext:
    """What a part built for the whole run is built beside (a server part; the protocol on a
    client too): the run's validated settings (general ones such as the seed or the rounds; a
    part's own settings come as its first argument)."""

    run: RunConfig


class ServerPart:
    """The server side of a part: what it keeps across rounds and says about each round.

    The default keeps nothing and says nothing.
    """

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        self.settings = dict(settings)
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


class ServerCompanion(ServerPart):
    """The server side of a client part (``Part.server``), for state kept on the server and sent
    with the weights: the strategy asks it, before every round, what to send besides the
    weights (:meth:`downlink`: arrays keyed like the model's state dict, and scalar values; the
    client hands them to the part as a :class:`~fedvls_flwr.algorithms.downlink.Received`), shows
    it, after every round, the weights it sent, the new global model and the accepted replies
    (:meth:`observe`), and checkpoints its state as every server part's. The default sends
    nothing and observes nothing."""

    def downlink(self, server_round: int, global_arrays: ArrayDict) -> Downlink:
        """What to send with ``global_arrays`` in ``server_round``."""
        return Downlink()

    def observe(self, server_round: int, sent: ArrayDict, new_global: ArrayDict, replies: list[Reply]) -> None:
        """The round is over: ``sent`` was broadcast, ``new_global`` is the next global model."""


@dataclass
class ClientState:
    """What a node keeps between rounds, by the kind of part that keeps it (``"method"``,
    ``"local-optimizer"``, ``"protocol"``): each part's state dict. Empty for a node's first
    round (and in a resumed run, which is a new Flower run whose nodes start empty)."""

    kept: dict[str, StateDict] = field(default_factory=dict)
    #: what the node's state held when the round began, each tensor with its version then (a part
    #: that keeps its values as they came - not changed in place, not replaced - is not encoded again)
    loaded: dict[str, dict[str, tuple[torch.Tensor, int]]] = field(default_factory=dict, repr=False)

    def of(self, kind: str) -> StateDict:
        """What the part of ``kind`` kept in this node's last round (empty: nothing)."""
        return self.kept.get(kind, {})

    def keep(self, kind: str, state: StateDict) -> None:
        """The part of ``kind`` keeps ``state`` for the node's next round (empty: nothing)."""
        if state:
            self.kept[kind] = state
        else:
            self.kept.pop(kind, None)


class Buildable(Protocol):
    """What every part's implementation is: built from its own settings and its kind's context."""

    def __init__(self, settings: Mapping[str, Any], context: Any) -> None: ...


P = TypeVar("P", bound=Buildable)


def implementation(part: Part, base: type[P], companion: bool = False) -> type[P]:
    """The class ``part``'s spec names (its ``impl``, or with ``companion`` its ``server``),
    checked to be a ``base``."""
    path = part.server if companion else part.impl
    impl = part.load_server() if companion else part.load()
    if not (isinstance(impl, type) and issubclass(impl, base)):
        raise TypeError(f"part {part.name!r}: {path} is {impl!r}, not a {base.__name__} (its spec names the wrong class)")
    return impl


def build_part(kind: str, values: Mapping[str, Any], context: Any, base: type[P]) -> P:
    """The part of ``kind`` that ``values`` selects (``values[kind]``, else the kind's default),
    a ``base``, built from its own settings in ``values`` and ``context`` (its kind's)."""
    part = run_parts(values)[kind]
    return implementation(part, base)(part.own_settings(values), context)


def build_companions(values: Mapping[str, Any], context: RunContext) -> dict[str, ServerCompanion]:
    """kind -> the server companion the run's client part of that kind declares (``Part.server``;
    FedGF's), in the order of the kinds."""
    out: dict[str, ServerCompanion] = {}
    for kind, part in run_parts(values).items():
        if part.server is not None:
            out[kind] = implementation(part, ServerCompanion, companion=True)(part.own_settings(values), context)
    return out


def keeps_nothing(part: object, state: StateDict) -> None:
    """``load_client_state`` of a part that keeps nothing: state handed to it is a bug."""
    if state:
        raise ValueError(f"{type(part).__name__} keeps no client state, got {sorted(state)[:3]}")


def state_by_kind(parts: Mapping[str, ServerPart]) -> ArrayDict:
    """Every part's state, each array under ``<kind>/``."""
    return {f"{kind}/{key}": value for kind, part in parts.items() for key, value in part.state().items()}


def split_state(arrays: Mapping[str, np.ndarray], kinds: Iterable[str]) -> tuple[ArrayDict, dict[str, ArrayDict]]:
    """A checkpoint's arrays -> (the protocol's round state, kind -> that part's saved state)."""
    prefixes = {kind: f"{kind}/" for kind in kinds}
    saved: dict[str, ArrayDict] = {kind: {} for kind in prefixes}
    rest: ArrayDict = {}
    for key, value in arrays.items():
        kind = next((k for k, prefix in prefixes.items() if key.startswith(prefix)), None)
        if kind is None:
            rest[key] = value
        else:
            saved[kind][key[len(prefixes[kind]):]] = value
    return rest, saved
