"""The run strategy: seeded sampling, the run's parts composed, checked sample-weighted aggregation.

A Flower ``Strategy`` (the Message API's four hooks: ``configure_train``, ``aggregate_train``,
``configure_evaluate``, ``aggregate_evaluate``) that composes the run's parts and names none:
the protocol plans each round's messages and combines the replies, the server optimizer turns
the average into the next global model, and a client part's server companion (FedGF) adds to
what is sent. It is exact about what a research comparison needs: which clients are sampled
(seeded, by partition id), what every client is told (the whole validated run config plus the
round), which replies are trusted (layout and finiteness checked) and how they are averaged
(float64, integer buffers kept integer). The nodes as the server knows them are a
:class:`~fedvls_flwr.app.nodes.NodeDirectory`; :meth:`RunStrategy.run` is the round loop with
the failure policy (retries, ``min-fit-fraction``).

The strategy owns the round and its parts: the server run (:mod:`fedvls_flwr.app.server`) asks
it what to evaluate, what a round's record says of the protocol and what to checkpoint, never
the parts themselves. Flower's inherited ``Strategy.start`` would run rounds without the server
optimizer, the downlink and the failure policy, so it refuses and says what to call instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply, average_metrics, check_reply, drift_diversity
from fedvls_flwr.algorithms.downlink import Downlink, merge_downlinks
from fedvls_flwr.algorithms.parts import RunContext, ServerPart, build_companions, split_state, state_by_kind
from fedvls_flwr.algorithms.rounds import Assignment, build_protocol
from fedvls_flwr.algorithms.sampling import sample_nodes
from fedvls_flwr.algorithms.server_optim import build_server_optimizer
from fedvls_flwr.app import keys
from fedvls_flwr.app.events import ROUND_START, emit
from fedvls_flwr.app.federation import pool_evaluations, same_partition
from fedvls_flwr.app.messages import (
    arrays_in,
    config_in,
    config_with,
    exchange,
    has_record,
    integer,
    metrics_in,
    number,
    numbers,
    read_only_dict,
    short_reason,
    to_array_record,
)
from fedvls_flwr.app.nodes import NodeDirectory, RoundFailedError
from fedvls_flwr.config.run_config import RunConfig

__all__ = ["RoundFailedError", "RoundReport", "RunStrategy"]


@dataclass
class RoundReport:
    """What happened to the clients of one round (written to rounds.jsonl)."""

    server_round: int
    sampled: int = 0
    sampled_nodes: list[int] = field(default_factory=list)
    accepted: int = 0
    failed: list[dict] = field(default_factory=list)    # client raised / no reply
    rejected: list[dict] = field(default_factory=list)  # reply failed the checks
    train_metrics: dict[str, float] = field(default_factory=dict)
    clients: list[dict] = field(default_factory=list)   # per accepted client: partition, class counts
    num_examples: float = 0.0
    drift_diversity: float = float("nan")
    server_parts: dict[str, float] = field(default_factory=dict)  # every server part's report() (FedExP, FedGF)
    attempts: int = 0
    seconds: float = 0.0
    reply_metrics: set[str] = field(default_factory=set)  # every metric name a reply carried (accepted or not)


class RunStrategy(Strategy):
    """The run's parts composed into one Flower strategy (see the module docstring)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.nodes = NodeDirectory(cfg)
        values, context = cfg.to_flower(), RunContext(cfg)
        self.companions = build_companions(values, context)  # a client part's server side (FedGF's)
        self.server_optimizer = build_server_optimizer(values, context)
        self.protocol = build_protocol(values, context)
        #: kind -> the server side of the run's part of that kind, in the order of the kinds
        self.parts: dict[str, ServerPart] = {**self.companions, "server-optimizer": self.server_optimizer,
                                             "protocol": self.protocol}
        self.model: nn.Module | None = None  # the run's architecture, for the model a round evaluates
        self._downlink = Downlink()  # what the companions send with this round's weights
        self._accepted: list[Reply] = []  # the accepted replies of the last aggregation
        self._state: dict[str, np.ndarray] = {}  # the round state at the start of the round
        self._plan: dict[int, Assignment] = {}  # node -> what it was sent this round
        self.report = RoundReport(0)
        #: every metric name a training reply carried this session, the failed round's too (summary.json)
        self.reply_metric_names: set[str] = set()
        self.sizes: dict[int, float] = {}  # node id -> its last num-examples (message order)
        self._destinations: dict[str, int] = {}  # message id -> node id, of the round's messages

    def round_config(self, server_round: int) -> ConfigRecord:
        return self.nodes.round_config(server_round)

    # ---- sampling and broadcast -------------------------------------------
    def sample(self, node_ids: list[int], server_round: int) -> list[int]:
        """A seeded sample of ``fraction-train`` of the nodes, drawn by partition id (algorithms/sampling.py)."""
        return sample_nodes(node_ids, self.nodes.partitions, self.cfg.fraction_train, self.cfg.seed, server_round)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        node_ids = self.nodes.wait_for_nodes(grid)
        if self.cfg.fraction_train < 1.0 or not self.protocol.single_model:
            self.nodes.learn_partitions(grid, node_ids)
        sampled = self.sample(node_ids, server_round)
        self._plan = self.protocol.plan(server_round, self._state, {n: self.nodes.partitions.get(n) for n in sampled})
        if idle := [n for n in sampled if n not in self._plan]:
            log(INFO, "round %d: %s take(s) no part in this round (%s protocol)", server_round,
                ", ".join(self.nodes.name(n) for n in idle), self.cfg.protocol)
            sampled = [n for n in sampled if n in self._plan]
        if self.report.server_round != server_round:
            self.report = RoundReport(server_round)
        self.report.sampled = len(sampled)
        self.report.sampled_nodes = list(sampled)
        self.report.attempts += 1
        self.report.clients = []
        log(INFO, "round %d: training on %d of %d nodes", server_round, len(sampled), len(node_ids))
        emit(ROUND_START, round=server_round, sampled=len(sampled), nodes=len(node_ids), attempt=self.report.attempts)
        base = self.round_config(server_round)
        records: dict[int, RecordDict] = {}  # one per distinct assignment (the standard protocol: one)

        def record_for(a: Assignment) -> RecordDict:
            if id(a) not in records:
                sent = arrays if a.arrays is None else to_array_record(a.arrays)
                records[id(a)] = record = RecordDict({keys.ARRAYS: sent, keys.CONFIG: config_with(base, a.config)})
                if self._downlink:
                    record[keys.DOWNLINK] = to_array_record(self._downlink.arrays)
                    record[keys.DOWNLINK_VALUES] = ConfigRecord(dict(self._downlink.values))
            return records[id(a)]

        # Largest clients first (their sizes are known from earlier replies): with fewer
        # workers than clients, a large client started last would finish the round alone.
        order = sorted(sampled, key=lambda n: (-self.sizes.get(n, math.inf), n))
        return [
            Message(content=record_for(self._plan[node_id]), message_type=MessageType.TRAIN, dst_node_id=node_id)
            for node_id in order
        ]

    # ---- aggregation --------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message], reference: dict[str, np.ndarray] | None = None
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check each reply against ``reference`` (the broadcast weights) and combine the
        accepted ones as the protocol and the server optimizer say."""
        replies = list(replies)
        accepted = self._accept(server_round, replies, reference)
        self._note_silent(server_round, replies)
        # Sum in partition order, not arrival order: float sums then do not depend on which
        # client happened to finish first, so a run (and its resume) is reproducible bit for bit.
        accepted.sort(key=lambda r: (self.nodes.partitions.get(int(r.client), math.inf), r.client))
        self.report.accepted = len(accepted)
        self._accepted = accepted
        if accepted and reference is not None and self.protocol.single_model:
            self.report.drift_diversity = drift_diversity([r.arrays for r in accepted], reference)
        if not accepted:
            log(WARNING, "round %d: no usable reply; the global model is unchanged", server_round)
            return None, None
        arrays = self._combine(server_round, accepted, reference)
        train_metrics = average_metrics(accepted)
        self.report.train_metrics = train_metrics
        self.report.num_examples = float(sum(r.num_examples for r in accepted))
        return to_array_record(arrays), MetricRecord(dict(train_metrics))

    def _accept(self, server_round: int, replies: list[Message], reference: ArrayDict | None) -> list[Reply]:
        """The replies that pass the checks, in arrival order; the others recorded as failed or
        rejected, with the reason."""
        accepted: list[Reply] = []
        for msg in replies:
            reply = self._judge(server_round, msg, reference, accepted)
            if reply is not None:
                accepted.append(reply)
                node_id = self._node_of(msg)
                self.sizes[node_id] = reply.num_examples
                self.report.clients.append({"node": str(node_id), "num_examples": reply.num_examples,
                                            **self._client_info(msg.content)})
        return accepted

    def _judge(self, server_round: int, msg: Message, reference: ArrayDict | None, accepted: list[Reply]) -> Reply | None:
        """One reply: its partition noted, then failed (the client raised), rejected (its layout,
        its numbers, a partition already accepted) or the :class:`Reply` to aggregate."""
        node_id = self._node_of(msg)
        node = str(node_id)
        if not msg.has_error() and has_record(msg.content, keys.METRICS, MetricRecord):
            metrics = metrics_in(msg.content, keys.METRICS)
            self.report.reply_metrics.update(metrics.keys())  # what left the site, whatever the server makes of it
            self.reply_metric_names.update(metrics.keys())
            if keys.PARTITION_ID in metrics:
                self.nodes.partitions[node_id] = integer(metrics[keys.PARTITION_ID])
        if msg.has_error():
            self.protocol.forget_node(node_id)
            reason = short_reason(msg.error.reason or "no reason given")
            self.report.failed.append(self.nodes.failure(node_id, reason))
            log(WARNING, "round %d: %s failed: %s", server_round, self.nodes.name(node_id), reason)
            return None
        reply, problem = self._parse(node, msg.content)
        layout = self._layout(node_id, reference)
        if reply is not None and layout is not None:
            problem = check_reply(reply, layout)
        if problem is not None or reply is None:
            self._reject(server_round, node_id, problem)
            return None
        if (twin := same_partition(self.nodes.partitions, node_id, [int(r.client) for r in accepted])) is not None:
            self._reject(server_round, node_id, (
                f"partition {self.nodes.partitions[node_id]} is also node {twin}'s: two SuperNodes were given "
                "the same partition-id (its data would count twice); give each its own partition-id"))
            return None
        return reply

    def _note_silent(self, server_round: int, replies: list[Message]) -> None:
        """The sampled nodes that did not answer before round-timeout, recorded as failed."""
        answered = {self._node_of(m) for m in replies}
        silent: list[int | None] = [n for n in self.report.sampled_nodes if n not in answered]
        silent += [None] * max(0, self.report.sampled - len(replies) - len(silent))  # sampled_nodes unknown
        for missing in silent:
            self.report.failed.append(self.nodes.failure(missing, "no reply before round-timeout"))
            if missing is not None:
                log(WARNING, "round %d: no reply from %s before round-timeout", server_round, self.nodes.name(missing))

    def _combine(self, server_round: int, accepted: list[Reply], reference: ArrayDict | None) -> ArrayDict:
        """The next round state: the protocol combines each group's replies, then the server
        optimizer steps from the broadcast weights (a protocol of one global model)."""
        ref = reference if reference is not None else accepted[0].arrays
        groups: dict[str, list[Reply]] = {}
        for r in accepted:
            groups.setdefault(self._plan[int(r.client)].group if int(r.client) in self._plan else "global", []).append(r)
        arrays = self.protocol.aggregate(server_round, ref, groups)
        if reference is not None and self.protocol.single_model:
            arrays = self.server_optimizer.step(server_round, reference, arrays, accepted)
        return arrays

    def _reject(self, server_round: int, node_id: int, problem: str | None) -> None:
        self.report.rejected.append(self.nodes.failure(node_id, problem))
        log(WARNING, "round %d: rejected the reply of %s: %s", server_round, self.nodes.name(node_id), problem)

    def _layout(self, node_id: int, reference: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        """What a node's reply must look like: what its assignment says, else the broadcast weights."""
        a = self._plan.get(node_id)
        if a is None:
            return reference
        return a.reply_layout if a.reply_layout is not None else (a.arrays if a.arrays is not None else reference)

    def _node_of(self, reply: Message) -> int:
        """The node a reply is about: the destination of the message it answers. (Flower's
        own error replies, e.g. "node unavailable", come from the SuperLink's node id.)"""
        return self._destinations.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)

    @staticmethod
    def _client_info(content: RecordDict) -> dict[str, Any]:
        metrics = metrics_in(content, keys.METRICS)
        info: dict[str, Any] = {}
        if keys.PARTITION_ID in metrics:
            info["partition_id"] = integer(metrics[keys.PARTITION_ID])
        if keys.CLASS_COUNTS in metrics:
            info["class_counts"] = [int(c) for c in numbers(metrics[keys.CLASS_COUNTS])]
        if keys.LOCAL_PER_CLASS_ACCURACY in metrics:
            info["local_per_class_accuracy"] = numbers(metrics[keys.LOCAL_PER_CLASS_ACCURACY])
        if keys.PEAK_GPU_MB in metrics:
            info["peak_gpu_mb"] = number(metrics[keys.PEAK_GPU_MB])
        if has_record(content, keys.CLIENT_INFO, ConfigRecord):
            said = config_in(content, keys.CLIENT_INFO)
            info["device"] = str(said.get(keys.DEVICE, "?"))
            if keys.NODE in said:  # "node" is Flower's node id here: this is the machine
                info["ran_on"] = str(said[keys.NODE])
        return info

    @staticmethod
    def _parse(node: str, content: RecordDict) -> tuple[Reply | None, str | None]:
        if not has_record(content, keys.ARRAYS, ArrayRecord) or not has_record(content, keys.METRICS, MetricRecord):
            return None, (f"reply lacks the '{keys.ARRAYS}' ArrayRecord or the "
                          f"'{keys.METRICS}' MetricRecord")
        metrics = dict(metrics_in(content, keys.METRICS))
        if keys.NUM_EXAMPLES not in metrics:
            return None, f"reply metrics lack '{keys.NUM_EXAMPLES}'"
        try:
            num_examples = number(metrics.pop(keys.NUM_EXAMPLES))
        except TypeError as err:
            return None, f"reply metric '{keys.NUM_EXAMPLES}': {err}"
        for name in keys.NOT_AVERAGED:
            metrics.pop(name, None)
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        try:  # read, never written: the reply's own bytes, not a copy of them (read_only_dict)
            arrays = read_only_dict(arrays_in(content, keys.ARRAYS))
        except Exception as err:  # noqa: BLE001 - an array numpy cannot read: this reply is rejected, not the round
            return None, f"reply '{keys.ARRAYS}' holds an array that cannot be read: {type(err).__name__}: {err}"
        return Reply(node, arrays, num_examples, scalars), None

    def initial_state(self, grid: Grid, model_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The round state before round 1 (the protocol's), with the sites' declared
        statistics when the protocol asks for them (once: FedConcat's clustering)."""
        stats = self.nodes.site_statistics(grid) if self.protocol.wants_site_statistics() else {}
        return self.protocol.initial_state(model_arrays, stats)

    # ---- state kept on the server -------------------------------------------
    def server_state(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps besides the round state: every server part's, under its kind."""
        return state_by_kind(self.parts)

    def load_server_state(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Hand a checkpoint's parts' state back to them; returns the round state."""
        state, saved = split_state(arrays, self.parts)
        for kind, part in self.parts.items():
            part.load_state(saved[kind])
        return state

    # ---- what the server run asks of the round ---------------------------------
    def bind_model(self, model: nn.Module) -> None:
        """The run's architecture, on the server: what the protocol builds the evaluated model from."""
        self.model = model
        self.protocol.bind_model(model)

    def evaluation_arrays(self, arrays: ArrayRecord) -> ArrayDict:
        """The arrays whose accuracy a round reports: the global model, unless the server
        optimizer evaluates something else (FedExP may average the last two): read-only views
        over the record's bytes, which the evaluation only reads (a ResNet-18's 45 MB not copied
        every round)."""
        return self.server_optimizer.evaluation_arrays(read_only_dict(arrays))

    def evaluation_model(self, evaluated: ArrayDict, server_round: int) -> nn.Module | None:
        """The model to test, as the protocol builds it from ``evaluated`` and the bound
        architecture; None when there is none yet (FedConcat's first stage)."""
        if self.model is None:
            raise RuntimeError("RunStrategy.evaluation_model: bind_model(model) first")
        return self.protocol.evaluation_model(evaluated, self.model, server_round)

    def round_info(self, server_round: int) -> dict[str, Any]:
        """What a round's record says of the protocol (FedConcat's stage)."""
        return self.protocol.round_info(server_round)

    def describe(self, state: ArrayDict) -> dict[str, Any] | None:
        """What the run folder keeps about the protocol (protocol.json); None: nothing."""
        return self.protocol.describe(state)

    def partitions_of(self, nodes: Iterable[int]) -> list[int | None]:
        """The partition ids of ``nodes``, sorted (None, unknown, last)."""
        return sorted((self.nodes.partitions.get(n) for n in nodes), key=lambda p: (p is None, p or 0))

    def client_devices(self, grid: Grid) -> dict[str, str]:
        """Which device every node would train on (asked before round 1 when a GPU is wanted)."""
        return self.nodes.client_devices(grid)

    # ---- federated evaluation ------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every connected node evaluates ``arrays`` on its local test split."""
        record = RecordDict({keys.ARRAYS: arrays, keys.CONFIG: self.round_config(server_round)})
        return [Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node_id)
                for node_id in sorted(self.nodes.wait_for_nodes(grid))]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The nodes' evaluations pooled per class (absent figures left out)."""
        pooled = self.pool_evaluations(replies)
        return MetricRecord({k: v for k, v in pooled.items() if v is not None}) if pooled["eval_nodes"] else None

    @staticmethod
    def pool_evaluations(replies: Iterable[Message]) -> dict:
        return pool_evaluations([dict(m.content[keys.METRICS]) for m in replies
                                 if not m.has_error() and has_record(m.content, keys.METRICS, MetricRecord)])

    def evaluate_federated(self, grid: Grid, arrays: ArrayRecord, server_round: int) -> dict:
        """The global model on every node's local test split, pooled per class."""
        messages = list(self.configure_evaluate(server_round, arrays, ConfigRecord(), grid))
        return self.pool_evaluations(exchange(grid, messages, self.cfg.round_timeout))

    def summary(self) -> None:
        log(INFO, "%s: %d node(s) seen, partitions %s", type(self).__name__, len(self.nodes.partitions),
            sorted(set(self.nodes.partitions.values())))

    # ---- the round loop -------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Refused: Flower's loop would call the four hooks without the server optimizer's step,
        the server companions' downlink, retries, ``min-fit-fraction`` or a resume point."""
        raise RuntimeError(
            "RunStrategy does not run Flower's Strategy.start loop, which would skip the server optimizer, "
            "the parts' downlink (FedGF) and the failure policy: run a whole experiment with "
            "fedvls_flwr.app.server.run_experiment(grid, cfg) (evaluation, result files, resume), or the rounds "
            "alone with RunStrategy.run(grid, initial_arrays, on_round_end=...)")

    def run(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        *,
        on_round_end: Callable[[int, ArrayRecord, RoundReport], None],
        start_round: int = 1,
    ) -> ArrayRecord:
        """Rounds ``start_round..num-server-rounds``: train, aggregate, hand to ``on_round_end``.

        Flower's ``Strategy.start`` runs a fixed number of rounds with no failure policy and
        no resume point; this loop adds both and leaves evaluation and saving to the caller."""
        arrays = initial_arrays
        for server_round in range(start_round, self.cfg.num_server_rounds + 1):
            t0 = time.perf_counter()
            self.report = RoundReport(server_round)
            arrays = self._train_round(grid, server_round, arrays)
            self.report.seconds = time.perf_counter() - t0
            on_round_end(server_round, arrays, self.report)
        return arrays

    def min_replies(self, sampled: int) -> int:
        return max(1, math.ceil(self.cfg.min_fit_fraction * sampled - 1e-9))

    def _train_round(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """One round with the failure policy: a round counts when at least
        ceil(min-fit-fraction x sampled) clients (and at least one) gave usable replies;
        otherwise it is re-run up to round-retries times, then the run stops."""
        reference = self._state = read_only_dict(arrays)  # read, never written: views over the record's bytes
        self._downlink = merge_downlinks({kind: c.downlink(server_round, reference) for kind, c in self.companions.items()})
        for attempt in range(self.cfg.round_retries + 1):
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = exchange(grid, messages, self.cfg.round_timeout)
            # the Grid gave each message its id when it pushed it
            self._destinations = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
            new_arrays, _ = self.aggregate_train(server_round, replies, reference)
            needed = self.min_replies(self.report.sampled)
            if new_arrays is not None and self.report.accepted >= needed:
                new_global = read_only_dict(new_arrays) if self.companions else {}
                for companion in self.companions.values():
                    companion.observe(server_round, reference, new_global, self._accepted)
                self._accepted = []  # the replies' arrays (ResNet-18: 43 MB each) not kept to the next round
                for part in self.parts.values():
                    self.report.server_parts.update(part.report())
                return new_arrays
            log(
                WARNING, "round %d attempt %d: %d usable replies of %d sampled, %d needed (min-fit-fraction %.2f)",
                server_round, attempt + 1, self.report.accepted, self.report.sampled, needed,
                self.cfg.min_fit_fraction,
            )
        reasons = "; ".join(
            f"node {f['node']}" + ("" if f.get("partition_id") is None else f" (partition {f['partition_id']})")
            + f": {f['reason']}" for f in (self.report.failed + self.report.rejected)[-5:]
        )
        raise RoundFailedError(
            f"round {server_round} failed {self.cfg.round_retries + 1} time(s): fewer than "
            f"min-fit-fraction = {self.cfg.min_fit_fraction} of the sampled clients gave usable replies "
            f"(last reasons: {reasons or 'none reported'}). Results up to round {server_round - 1} are saved; "
            "fix the cause and continue with resume=true."
        )
