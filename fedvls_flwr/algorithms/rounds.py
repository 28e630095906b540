"""Protocols: what the server keeps between rounds, what each message carries, how replies
combine (run-config ``protocol``).

Most methods differ only in what a client does with the global model (the local objective
and optimizer). A protocol differs in the shape of the federation itself: FedConcat keeps K
cluster models, sends each client its cluster's, and later trains one new head over the K
frozen encoders. The strategy runs any protocol through the hooks below and names none:

* the server's **state** is one flat dict of named arrays (``ArrayDict``): the global model
  for the standard protocol; for FedConcat the K cluster models, the assignment, later the
  encoders and the head. It is what the checkpoint holds, so resume needs nothing else;
* :meth:`RoundProtocol.initial_state` builds it before round 1, from the fresh model and
  the per-site statistics the protocol declares in its registry entry (``Part.shares``),
  which the server asks the sites for once;
* :meth:`RoundProtocol.plan` says, per sampled node, what its message carries
  (:class:`Assignment`: arrays, extra config, the group its reply joins, the layout its
  reply must have);
* :meth:`RoundProtocol.aggregate` turns the round's checked replies, by group, into the
  next state;
* :meth:`RoundProtocol.evaluation_model` gives the model to test (None: nothing to test);
* :meth:`RoundProtocol.client_train` is the client's side of a message the ordinary local
  training does not handle (None: train as usual).

Plain numpy and torch; no Flower import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply, weighted_average

if TYPE_CHECKING:
    import torch

    from fedvls_flwr.algorithms.training import TrainResult
    from fedvls_flwr.config.run_config import RunConfig
    from fedvls_flwr.data.node_data import ClientData

__all__ = ["Assignment", "RoundProtocol", "StandardRounds", "build_protocol"]


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


class RoundProtocol:
    """Base class; see the module docstring for the hooks."""

    #: Whether the state is one model that every client trains (then the server optimizer,
    #: drift diversity and the server companions apply to it).
    single_model: bool = True

    def __init__(self, params: Mapping[str, Any], cfg: RunConfig) -> None:
        self.params = dict(params)
        self.cfg = cfg

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

    def restore(self, state: ArrayDict) -> None:
        """A resumed run's saved state, before its first round: a protocol that fixed something
        when the run started (FedConcat's stage boundary) reads it back here."""

    def forget_node(self, node: int) -> None:
        """``node`` failed this round (a protocol that sends something once sends it again)."""

    def evaluation_model(self, state: ArrayDict, model: nn.Module, server_round: int = 0) -> nn.Module | None:
        """The model whose accuracy round ``server_round`` reports, ``model`` (the run's
        architecture) loaded from ``state``; None when there is none to test yet."""
        import torch

        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        return model

    def round_info(self, server_round: int) -> dict[str, Any]:
        """Fields a round's record carries about the protocol (e.g. its stage)."""
        return {}

    def describe(self, state: ArrayDict) -> dict[str, Any] | None:
        """What the run folder keeps about the protocol (``protocol.json``); None: nothing."""
        return None

    # ---- client -------------------------------------------------------------------
    @classmethod
    def client_train(
        cls, arrays: Mapping[str, torch.Tensor], config: Mapping[str, Any], cfg: RunConfig, data: ClientData,
        model_factory: Callable[[], nn.Module], kept: Any, device: torch.device, generator: torch.Generator,
    ) -> tuple[dict[str, torch.Tensor], TrainResult] | None:
        """A message the ordinary local training does not handle: the weights to send back and
        the training result; None to train as usual. ``kept``: the node's record that lives
        across rounds (Flower's ``Context.state``; None where there is none)."""
        return None


class StandardRounds(RoundProtocol):
    """One global model; every sampled client trains it (every method but FedConcat)."""


def build_protocol(cfg: RunConfig) -> RoundProtocol:
    """The run's protocol (run-config ``protocol``) with its settings."""
    from fedvls_flwr.config.registry import get_part, part_params

    return get_part("protocol", cfg.protocol).load()(part_params(cfg, "protocol"), cfg)

