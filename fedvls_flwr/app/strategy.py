"""The server strategy: broadcast, seeded sampling, checked sample-weighted aggregation.

A subclass of Flower's Message-API ``FedAvg``. It keeps Flower's message plumbing and
replaces what a research comparison needs to be exact about: which clients are sampled
(seeded), what every client is told (the whole validated run config plus the round),
which replies are trusted (layout and finiteness checked against the global model),
and how they are averaged (float64, integer buffers kept integer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedvls_flwr.algorithms.aggregation import (
    Reply,
    average_metrics,
    check_reply,
    drift_diversity,
)
from fedvls_flwr.algorithms.downlink import Downlink, build_companions, merge_downlinks
from fedvls_flwr.algorithms.rounds import Assignment, build_protocol
from fedvls_flwr.algorithms.sampling import sample_nodes
from fedvls_flwr.algorithms.server_optim import build_server_optimizer
from fedvls_flwr.app import protocol
from fedvls_flwr.app.events import ROUND_START, emit
from fedvls_flwr.app.federation import pool_evaluations, same_partition
from fedvls_flwr.app.messages import (
    arrays_in,
    exchange,
    integer,
    metrics_in,
    number,
    numbers,
    short_reason,
    to_array_record,
    to_numpy_dict,
)
from fedvls_flwr.app.nodes import NodeDirectory, RoundFailedError
from fedvls_flwr.config.registry import part_params
from fedvls_flwr.config.run_config import RunConfig

#: Checkpoint arrays under these prefixes are the server optimizer's state and each part's
#: server companion's state (``companion/<part>/``), not the global model's.
SERVER_STATE_PREFIX = "server-optimizer/"
COMPANION_STATE_PREFIX = "companion/"


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
    server_step_size: float | None = None  # FedExP's eta_g of the round
    server_parts: dict[str, float] = field(default_factory=dict)  # the companions' report() (FedGF's D, c)
    attempts: int = 0
    seconds: float = 0.0


class CheckedFedAvg(NodeDirectory, FedAvg):
    """FedAvg whose replies are checked: seeded sampling, the whole run config broadcast,
    every reply checked against the global model, sample-weighted averaging in float64,
    and a failure policy (retries, min-fit-fraction). Used with every local objective."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(
            fraction_train=cfg.fraction_train,
            min_train_nodes=1,
            min_available_nodes=cfg.min_nodes,
            arrayrecord_key=protocol.ARRAYS,
            configrecord_key=protocol.CONFIG,
        )
        # The global model is evaluated on the server's test set (evaluate_federated when there
        # is none): Flower's own federated evaluation is off. Set as FedAvg's constructor sets it
        # for fraction_evaluate=0.0, without its warning in every run (app/known_warnings.py).
        self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.cfg = cfg
        self.server_optimizer = build_server_optimizer(cfg.server_optimizer, part_params(cfg, "server-optimizer"))
        self.companions = build_companions(cfg.to_flower())  # parts with state on the server (FedGF)
        self._downlink = Downlink()  # what the companions send with this round's weights
        self._accepted: list[Reply] = []  # the accepted replies of the last aggregation
        self.protocol = build_protocol(cfg)  # the federation's shape (rounds.py)
        self._state: dict[str, np.ndarray] = {}  # the server's state at the start of the round
        self._plan: dict[int, Assignment] = {}  # node -> what it was sent this round
        self.report = RoundReport(0)
        self._federation_assembled = False  # min-nodes were connected once (see _wait_for_nodes)
        self.partitions: dict[int, int] = {}  # node id -> partition id (queries and replies)
        self.sizes: dict[int, float] = {}  # node id -> its last num-examples (message order)
        self._destinations: dict[str, int] = {}  # message id -> node id, of the round's messages
        self.reply_metric_names: set[str] = set()  # what the sites' training replies carried (summary.json)

    # ---- sampling and broadcast -------------------------------------------
    def sample(self, node_ids: list[int], server_round: int) -> list[int]:
        """A seeded sample of ``fraction-train`` of the nodes (at least one), drawn over the
        nodes ordered by partition id.

        Flower's node ids are random per run; ordered by partition id (the same every run)
        two runs with the same seed - two methods, say - train the same clients in every
        round. Nodes whose partition is not known yet come last, by node id.
        """
        return sample_nodes(node_ids, self.partitions, self.cfg.fraction_train, self.cfg.seed, server_round)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        node_ids = self._wait_for_nodes(grid)
        if self.cfg.fraction_train < 1.0 or not self.protocol.single_model:
            self.learn_partitions(grid, node_ids)
        sampled = self.sample(node_ids, server_round)
        self._plan = self.protocol.plan(server_round, self._state, {n: self.partitions.get(n) for n in sampled})
        if idle := [n for n in sampled if n not in self._plan]:
            log(INFO, "round %d: %s take(s) no part in this round (%s protocol)", server_round,
                ", ".join(self._name(n) for n in idle), self.cfg.protocol)
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
                records[id(a)] = record = RecordDict({protocol.ARRAYS: sent, protocol.CONFIG: ConfigRecord({**base, **a.config})})
                if self._downlink:
                    record[protocol.DOWNLINK] = to_array_record(self._downlink.arrays)
                    record[protocol.DOWNLINK_VALUES] = ConfigRecord(dict(self._downlink.values))
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
        """Check each reply against ``reference`` (the broadcast weights) and average."""
        accepted: list[Reply] = []
        replies = list(replies)
        for msg in replies:
            node_id = self._node_of(msg)
            node = str(node_id)
            if not msg.has_error() and protocol.METRICS in msg.content.metric_records:
                metrics = metrics_in(msg.content, protocol.METRICS)
                if protocol.PARTITION_ID in metrics:
                    self.partitions[node_id] = integer(metrics[protocol.PARTITION_ID])
            if msg.has_error():
                self.protocol.forget_node(node_id)
                reason = short_reason(msg.error.reason or "no reason given")
                self.report.failed.append(self._who(node_id, reason))
                log(WARNING, "round %d: %s failed: %s", server_round, self._name(node_id), reason)
                continue
            reply, problem = self._parse(node, msg.content)
            layout = self._layout(node_id, reference)
            if reply is not None and layout is not None:
                problem = check_reply(reply, layout)
            if problem is not None or reply is None:
                self.report.rejected.append(self._who(node_id, problem))
                log(WARNING, "round %d: rejected the reply of %s: %s", server_round, self._name(node_id), problem)
                continue
            if (twin := same_partition(self.partitions, node_id, [int(r.client) for r in accepted])) is not None:
                problem = (f"partition {self.partitions[node_id]} is also node {twin}'s: two SuperNodes were given "
                           "the same partition-id (its data would count twice); give each its own partition-id")
                self.report.rejected.append(self._who(node_id, problem))
                log(WARNING, "round %d: rejected the reply of %s: %s", server_round, self._name(node_id), problem)
                continue
            accepted.append(reply)
            self.sizes[node_id] = reply.num_examples
            self.report.clients.append({"node": node, "num_examples": reply.num_examples, **self._client_info(msg.content)})
            self.reply_metric_names.update(metrics_in(msg.content, protocol.METRICS).keys())
        answered = {self._node_of(m) for m in replies}
        silent: list[int | None] = [n for n in self.report.sampled_nodes if n not in answered]
        silent += [None] * max(0, self.report.sampled - len(replies) - len(silent))  # sampled_nodes unknown
        for missing in silent:
            self.report.failed.append(self._who(missing, "no reply before round-timeout"))
            if missing is not None:
                log(WARNING, "round %d: no reply from %s before round-timeout", server_round, self._name(missing))
        # Sum in partition order, not arrival order: float sums then do not depend on which
        # client happened to finish first, so a run (and its resume) is reproducible bit for bit.
        accepted.sort(key=lambda r: (self.partitions.get(int(r.client), math.inf), r.client))
        self.report.accepted = len(accepted)
        self._accepted = accepted
        if accepted and reference is not None and self.protocol.single_model:
            self.report.drift_diversity = drift_diversity([r.arrays for r in accepted], reference)
        if not accepted:
            log(WARNING, "round %d: no usable reply; the global model is unchanged", server_round)
            return None, None
        ref = reference if reference is not None else accepted[0].arrays
        groups: dict[str, list[Reply]] = {}
        for r in accepted:
            groups.setdefault(self._plan[int(r.client)].group if int(r.client) in self._plan else "global", []).append(r)
        arrays = self.protocol.aggregate(server_round, ref, groups)
        if reference is not None and self.protocol.single_model:
            arrays = self.server_optimizer.step(server_round, reference, arrays, accepted)
            step_size = getattr(self.server_optimizer, "last_step_size", None)
            if step_size is not None:
                self.report.server_step_size = step_size
        train_metrics = average_metrics(accepted)
        self.report.train_metrics = train_metrics
        self.report.num_examples = float(sum(r.num_examples for r in accepted))
        return to_array_record(arrays), MetricRecord(dict(train_metrics))

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

    def _who(self, node_id: int | None, reason: str | None) -> dict:
        """A failure record: Flower's node id and, where known, the partition id / site."""
        if node_id is None:
            return {"node": "?", "partition_id": None, "reason": reason}
        return {"node": str(node_id), "partition_id": self.partitions.get(node_id), "reason": reason}

    @staticmethod
    def _client_info(content: RecordDict) -> dict[str, Any]:
        metrics = metrics_in(content, protocol.METRICS)
        info: dict[str, Any] = {}
        if protocol.PARTITION_ID in metrics:
            info["partition_id"] = integer(metrics[protocol.PARTITION_ID])
        if protocol.CLASS_COUNTS in metrics:
            info["class_counts"] = [int(c) for c in numbers(metrics[protocol.CLASS_COUNTS])]
        if protocol.LOCAL_PER_CLASS_ACCURACY in metrics:
            info["local_per_class_accuracy"] = numbers(metrics[protocol.LOCAL_PER_CLASS_ACCURACY])
        if protocol.PEAK_GPU_MB in metrics:
            info["peak_gpu_mb"] = number(metrics[protocol.PEAK_GPU_MB])
        if protocol.CLIENT_INFO in content.config_records:
            said = content.config_records[protocol.CLIENT_INFO]
            info["device"] = str(said.get(protocol.DEVICE, "?"))
            if protocol.NODE in said:  # "node" is Flower's node id here: this is the machine
                info["ran_on"] = str(said[protocol.NODE])
        return info

    @staticmethod
    def _parse(node: str, content: RecordDict) -> tuple[Reply | None, str | None]:
        if protocol.ARRAYS not in content.array_records or protocol.METRICS not in content.metric_records:
            return None, (f"reply lacks the '{protocol.ARRAYS}' ArrayRecord or the "
                          f"'{protocol.METRICS}' MetricRecord")
        metrics = dict(metrics_in(content, protocol.METRICS))
        if protocol.NUM_EXAMPLES not in metrics:
            return None, f"reply metrics lack '{protocol.NUM_EXAMPLES}'"
        try:
            num_examples = number(metrics.pop(protocol.NUM_EXAMPLES))
        except TypeError as err:
            return None, f"reply metric '{protocol.NUM_EXAMPLES}': {err}"
        for name in protocol.NOT_AVERAGED:
            metrics.pop(name, None)
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        return Reply(node, to_numpy_dict(arrays_in(content, protocol.ARRAYS)), num_examples, scalars), None

    def initial_state(self, grid: Grid, model_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The server's state before round 1 (the protocol's), with the sites' declared
        statistics when the protocol asks for them (once: FedConcat's clustering)."""
        stats = self.site_statistics(grid) if self.protocol.wants_site_statistics() else {}
        return self.protocol.initial_state(model_arrays, stats)

    # ---- state kept on the server -------------------------------------------
    def server_state(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps besides the global model: the server optimizer's and the
        companions' state, each under its prefix."""
        state = {SERVER_STATE_PREFIX + k: v for k, v in self.server_optimizer.state().items()}
        for name, companion in self.companions.items():
            state.update({f"{COMPANION_STATE_PREFIX}{name}/{k}": v for k, v in companion.state().items()})
        return state

    def load_server_state(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Hand a checkpoint's server state back to its owners; returns the global model's arrays."""
        self.server_optimizer.load_state(
            {k[len(SERVER_STATE_PREFIX):]: v for k, v in arrays.items() if k.startswith(SERVER_STATE_PREFIX)})
        for name, companion in self.companions.items():
            prefix = f"{COMPANION_STATE_PREFIX}{name}/"
            companion.load_state({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        state = {k: v for k, v in arrays.items() if not k.startswith((SERVER_STATE_PREFIX, COMPANION_STATE_PREFIX))}
        self.protocol.restore(state)
        return state

    # ---- federated evaluation ------------------------------------------------
    def evaluate_federated(self, grid: Grid, arrays: ArrayRecord, server_round: int) -> dict:
        """The global model on every node's local test split, pooled per class."""
        record = RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: self.round_config(server_round)})
        messages = [
            Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node_id)
            for node_id in sorted(self._wait_for_nodes(grid))
        ]
        replies = exchange(grid, messages, self.cfg.round_timeout)
        return pool_evaluations(
            [dict(m.content[protocol.METRICS]) for m in replies
             if not m.has_error() and protocol.METRICS in m.content.metric_records]
        )

    # ---- the round loop -------------------------------------------------------
    def run(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        *,
        on_round_end: Callable[[int, ArrayRecord, RoundReport], None],
        start_round: int = 1,
    ) -> ArrayRecord:
        """Rounds ``start_round..num-server-rounds``: train, aggregate, hand to ``on_round_end``."""
        arrays = initial_arrays
        for server_round in range(start_round, self.cfg.num_server_rounds + 1):
            t0 = time.perf_counter()
            self.report = RoundReport(server_round)
            new_arrays = self._train_round(grid, server_round, arrays)
            arrays = new_arrays
            self.report.seconds = time.perf_counter() - t0
            on_round_end(server_round, arrays, self.report)
        return arrays

    def min_replies(self, sampled: int) -> int:
        return max(1, math.ceil(self.cfg.min_fit_fraction * sampled - 1e-9))

    def _train_round(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """One round with the failure policy: a round counts when at least
        ceil(min-fit-fraction x sampled) clients (and at least one) gave usable replies;
        otherwise it is re-run up to round-retries times, then the run stops."""
        reference = self._state = to_numpy_dict(arrays)
        self._downlink = merge_downlinks({name: c.downlink(server_round, reference) for name, c in self.companions.items()})
        for attempt in range(self.cfg.round_retries + 1):
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = exchange(grid, messages, self.cfg.round_timeout)
            # the Grid gave each message its id when it pushed it
            self._destinations = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
            new_arrays, _ = self.aggregate_train(server_round, replies, reference)
            needed = self.min_replies(self.report.sampled)
            if new_arrays is not None and self.report.accepted >= needed:
                if self.companions:
                    new_global = to_numpy_dict(new_arrays)
                    for companion in self.companions.values():
                        companion.observe(server_round, reference, new_global, self._accepted)
                        self.report.server_parts.update(companion.report())
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
