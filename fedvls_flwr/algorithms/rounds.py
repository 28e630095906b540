"""Protocols: what the server keeps between rounds, what each message carries, how replies
combine, and what a client does with a message (run-config ``protocol``).

Most methods differ only in what a client does with the global model (the local objective
and optimizer). A protocol differs in the shape of the federation itself: FedConcat keeps K
cluster models, sends each client its cluster's, and later trains one new head over the K
frozen encoders. The strategy runs any protocol through the hooks below and names none:

* the server's **round state** is one flat dict of named arrays (``ArrayDict``): the global
  model for the standard protocol; for FedConcat the K cluster models and the assignment,
  later the encoders and the head. The checkpoint holds it, beside what the protocol fixed
  when the run started (:meth:`RoundProtocol.state`, as every server part's);
* :meth:`RoundProtocol.initial_state` builds it before round 1, from the fresh model and
  the per-site statistics the protocol declares in its spec (``Part.shares``),
  which the server asks the sites for once;
* :meth:`RoundProtocol.plan` says, per sampled node, what its message carries
  (:class:`Assignment`: arrays, extra config, the group its reply joins, the layout its
  reply must have);
* :meth:`RoundProtocol.aggregate` turns the round's checked replies, by group, into the
  next state;
* :meth:`RoundProtocol.evaluation_model` gives the model to test (None: nothing to test);
* :meth:`RoundProtocol.client_train` is the client's side of a training message
  (:class:`ClientRound` in, :class:`ClientOutcome` out): the standard protocol's is the
  ordinary local training, and FedConcat's stage 1 is the same. What the protocol keeps on a
  node between rounds (FedConcat's frozen encoders) is its client state
  (:meth:`RoundProtocol.load_client_state` / :meth:`RoundProtocol.client_state`).

Plain numpy and torch; no Flower import.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply, weighted_average
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.parts import ClientState, RunContext, ServerPart, StateDict, build_part, keeps_nothing
from fedvls_flwr.algorithms.run_model import build_loaded
from fedvls_flwr.algorithms.training import TrainResult, train_local

if TYPE_CHECKING:
    from fedvls_flwr.config.run_config import RunConfig
    from fedvls_flwr.data.node_data import ClientData

__all__ = ["Assignment", "ClientOutcome", "ClientRound", "RoundProtocol", "StandardRounds", "build_protocol",
           "read_tensor"]


@dataclass
class Assignment:
    """One node's message in a round.

    ``arrays`` None means the global state as it is (the standard protocol: no copy);
    ``reply_layout`` None means the reply must have the layout of ``arrays`` (or the state).
    """

    group: str
    arrays: ArrayDict | None = None
    config: dict[str, Any] = field(default_factory=dict)
    reply_layout: ArrayDict | None = None


@dataclass
class ClientRound:
    """One training message, as a client's protocol step sees it.

    ``arrays``: what the message carries (the weights; FedConcat's head and encoders);
    ``config``: the message's config (the run config, the round, the protocol's own keys);
    ``state``: what the local training's parts keep on the node across rounds (MOON's previous
    model, carried momentum), read and updated in place; ``received``: what the run's server
    companions sent; ``arrays_owned``: ``arrays`` are this step's own copy, which nothing reads
    after it, so the network it trains may hold them as its weights (no copy: ``build_loaded``'s
    ``take``).
    """

    arrays: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]
    cfg: RunConfig
    data: ClientData
    model_factory: Callable[[], nn.Module]
    device: torch.device
    generator: torch.Generator
    state: ClientState
    received: Received = field(default_factory=Received)
    arrays_owned: bool = False


@dataclass
class ClientOutcome:
    """The reply's weights, the training's numbers, and the trained model when it is the run's
    architecture (what ``local-eval`` evaluates; None for FedConcat's head)."""

    weights: dict[str, torch.Tensor]
    result: TrainResult
    model: nn.Module | None = None


def train_as_usual(step: ClientRound) -> ClientOutcome:
    """The ordinary local training: the received weights, trained with the run's objective and
    local optimizer on the client's data."""
    model = build_loaded(step.model_factory, step.arrays, step.device, take=step.arrays_owned)
    result = train_local(model, step.data, step.cfg, device=step.device, generator=step.generator,
                         state=step.state, received=step.received)
    return ClientOutcome(host_weights(model), result, model)


def read_tensor(values: np.ndarray) -> torch.Tensor:
    """``values`` as a tensor over the same memory, for a reader that only reads it (``load_state_dict``
    copies it into the network): a read-only array too - the server's round state is a view over
    its record's bytes - without torch's warning that it would not stop a write."""
    values = np.asarray(values)
    if values.flags.writeable:
        return torch.from_numpy(values)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(values)


def host_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state on the CPU, C-contiguous: a channels-last network (on CUDA) is laid out
    in the usual order on its device before the copy, where that costs little; a channels-last
    array reaching the reply's encoder cost ResNet-18 about 25 ms a client on a GPU host (a
    strided copy through ``np.save``)."""
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


class RoundProtocol(ServerPart):
    """Base class; see the module docstring for the hooks."""

    #: Whether the state is one model that every client trains (then the server optimizer,
    #: drift diversity and the server companions apply to it).
    single_model: bool = True

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        self.cfg: RunConfig = context.run

    # ---- server -------------------------------------------------------------------
    def initial_state(self, model_arrays: ArrayDict, site_stats: Mapping[int, Mapping[str, list[int]]]) -> ArrayDict:
        """The state before round 1, from the fresh model and each partition's declared statistics."""
        return model_arrays

    def wants_site_statistics(self) -> bool:
        """Whether :meth:`initial_state` needs the sites' declared statistics (asked once)."""
        return False

    def plan(self, server_round: int, state: ArrayDict, partitions: Mapping[int, int | None]) -> dict[int, Assignment]:
        """node id -> its message, for the sampled nodes (``partitions``: node -> its partition id,
        None if unknown). A node left out gets no message this round."""
        every = Assignment("global")
        return {node: every for node in partitions}

    def aggregate(self, server_round: int, state: ArrayDict, groups: Mapping[str, list[Reply]]) -> ArrayDict:
        """The next state from the accepted replies of each group (at least one reply in all)."""
        return weighted_average(groups["global"], state)

    def bind_model(self, model: nn.Module) -> None:
        """The run's architecture, on the server (a protocol that builds new layers reads it)."""

    def forget_node(self, node: int) -> None:
        """``node`` failed this round (a protocol that sends something once sends it again)."""

    def evaluation_model(self, state: ArrayDict, model: nn.Module, server_round: int = 0) -> nn.Module | None:
        """The model whose accuracy round ``server_round`` reports, ``model`` (the run's
        architecture) loaded from ``state``; None when there is none to test yet."""
        model.load_state_dict({k: read_tensor(v) for k, v in state.items()})
        return model

    def round_info(self, server_round: int) -> dict[str, Any]:
        """Fields a round's record carries about the protocol (e.g. its stage)."""
        return {}

    def describe(self, state: ArrayDict) -> dict[str, Any] | None:
        """What the run folder keeps about the protocol (``protocol.json``); None: nothing."""
        return None

    # ---- client -------------------------------------------------------------------
    def client_train(self, step: ClientRound) -> ClientOutcome:
        """A client's side of a training message: the ordinary local training."""
        return train_as_usual(step)

    def load_client_state(self, state: StateDict) -> None:
        """What the protocol kept on this node in its last round (empty the first time); the
        default keeps nothing."""
        keeps_nothing(self, state)

    def client_state(self) -> StateDict:
        """What the protocol keeps on this node for its next round; the default nothing."""
        return {}


class StandardRounds(RoundProtocol):
    """One global model; every sampled client trains it (every method but FedConcat)."""


def build_protocol(values: Mapping[str, Any], context: RunContext) -> RoundProtocol:
    """The protocol a run config (``values``) selects: its server side, and on a client the step
    it takes with each training message."""
    return build_part("protocol", values, context, RoundProtocol)
