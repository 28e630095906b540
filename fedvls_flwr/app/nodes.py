"""What the server knows of and asks the nodes, outside training: who is connected (and waiting
for ``min-nodes``), which partition each node is, which device it would train on, and the
per-site statistics a run's parts declare (``Part.shares``). The strategy holds one."""

from __future__ import annotations

import math
import time
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedvls_flwr.app import keys
from fedvls_flwr.app.federation import same_partition, too_few_nodes
from fedvls_flwr.app.messages import (
    config_in,
    config_with,
    exchange,
    has_record,
    integer,
    is_simulation,
    metrics_in,
    numbers,
    short_reason,
)
from fedvls_flwr.config.registry import site_shares
from fedvls_flwr.config.run_config import RunConfig

#: Seconds a simulation's ServerApp waits for Flower to register its nodes (all at once, in
#: memory, right after the ServerApp starts) before fewer than min-nodes is final.
SIMULATION_REGISTRATION_SECONDS = 5.0


class RoundFailedError(RuntimeError):
    """Too few usable replies in a round, after the configured retries."""


class NodeDirectory:
    """The nodes as the server knows them: their partition ids (from queries and replies) and
    whether the federation has assembled (``min-nodes`` were connected once)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.partitions: dict[int, int] = {}  # node id -> partition id
        self.federation_assembled = False
        self._run_config: tuple[RunConfig, ConfigRecord] | None = None

    def round_config(self, server_round: int) -> ConfigRecord:
        """The run config and the round, for a round's messages (a new record each time)."""
        if self._run_config is None or self._run_config[0] is not self.cfg:
            self._run_config = (self.cfg, ConfigRecord(self.cfg.to_flower()))
        return config_with(self._run_config[1], {keys.SERVER_ROUND: server_round})

    def query_nodes(self, grid: Grid, node_ids: list[int], connected: list[int] | None = None) -> dict[int, str]:
        """Ask ``node_ids`` who they are (one query message each; the ClientApp answers from
        its node config and torch, without loading data): records their partition ids, warns
        of two ``connected`` nodes that say the same one, and returns node id -> the device
        each would train on."""
        record = RecordDict({keys.CONFIG: self.round_config(0)})
        messages = [Message(content=record, message_type=MessageType.QUERY, dst_node_id=n) for n in node_ids]
        devices: dict[int, str] = {}
        for reply in exchange(grid, messages, self.cfg.round_timeout):
            if reply.has_error():
                continue
            node_id = reply.metadata.src_node_id
            if has_record(reply.content, keys.METRICS, MetricRecord):
                metrics = metrics_in(reply.content, keys.METRICS)
                if keys.PARTITION_ID in metrics:
                    self.partitions[node_id] = integer(metrics[keys.PARTITION_ID])
            if has_record(reply.content, keys.CLIENT_INFO, ConfigRecord):
                devices[node_id] = str(config_in(reply.content, keys.CLIENT_INFO).get(keys.DEVICE, "?"))
        connected = node_ids if connected is None else connected
        for node in node_ids:
            if (twin := same_partition(self.partitions, node, connected)) is not None and (
                    twin not in node_ids or node > twin):  # said once per pair
                log(WARNING, "%s and node %d say the same partition-id: only one reply per partition is "
                    "used in a round; give each SuperNode its own partition-id", self.name(node), twin)
        return devices

    def learn_partitions(self, grid: Grid, node_ids: list[int]) -> None:
        """Query the nodes whose partition id is not known yet."""
        unknown = [n for n in node_ids if n not in self.partitions]
        if not unknown:
            return
        self.query_nodes(grid, unknown, connected=node_ids)
        missing = [n for n in unknown if n not in self.partitions]
        if missing:
            log(WARNING, "%d node(s) did not say their partition id; they are sampled after the others", len(missing))

    def client_devices(self, grid: Grid) -> dict[str, str]:
        """Before the first round: the device every connected node would train on, by node name."""
        devices = self.query_nodes(grid, self.wait_for_nodes(grid))
        return {self.name(n): d for n, d in sorted(devices.items())}

    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """The nodes to sample from.

        ``min-nodes`` is a start condition: before the first round of this server the
        federation is still assembling, so it waits (logging every 30 s) until that many
        nodes are connected - at most ``min-nodes-timeout`` seconds in a deployment, and
        only the moment Flower takes to register them in a simulation, whose nodes all
        exist from the start (more can never come). After that a round uses the nodes
        connected now - a node that died is gone, a late one joins - and
        ``min-fit-fraction`` judges the replies. Only when no node is left does it wait,
        at most ``round-timeout`` seconds.
        """
        assembled = self.federation_assembled
        needed = 1 if assembled else self.cfg.min_nodes
        simulation = is_simulation(grid)
        limit = self.cfg.round_timeout if assembled else (
            SIMULATION_REGISTRATION_SECONDS if simulation else self.cfg.min_nodes_timeout)
        step = 0.1 if simulation and not assembled else 1.0
        waited, logged = 0.0, -math.inf
        while len(node_ids := list(grid.get_node_ids())) < needed:
            if waited >= limit:
                if assembled:
                    raise RoundFailedError(
                        f"no node has been connected for {waited:.0f} s (round-timeout); "
                        "the results up to the last completed round are saved: restart nodes "
                        "and continue with resume=true"
                    )
                raise RoundFailedError(self._too_few_nodes(grid, node_ids, waited, simulation))
            if waited - logged >= 30 and not simulation:
                logged = waited
                log(INFO, "waiting for nodes: %d connected, %d needed%s", len(node_ids), needed,
                    "" if assembled else f" (min-nodes) before the first round; the run fails after "
                    f"min-nodes-timeout = {self.cfg.min_nodes_timeout:g} s")
            time.sleep(step)
            waited += step
        self.federation_assembled = True
        return node_ids

    def _too_few_nodes(self, grid: Grid, node_ids: list[int], waited: float, simulation: bool) -> str:
        """Why the first round cannot start; a deployment's connected nodes are asked which
        partitions they are (the server knows no more than what they say)."""
        if not simulation and node_ids:
            self.learn_partitions(grid, node_ids)
        said = [self.partitions[n] for n in node_ids if n in self.partitions]
        return too_few_nodes(self.cfg.min_nodes, self.cfg.min_nodes_timeout, len(node_ids), said, waited,
                             simulation)

    def name(self, node_id: int) -> str:
        partition = self.partitions.get(node_id)
        return f"node {node_id}" + ("" if partition is None else f" (partition {partition})")

    def failure(self, node_id: int | None, reason: str | None) -> dict:
        """A failure record: Flower's node id and, where known, the partition id / site."""
        if node_id is None:
            return {"node": "?", "partition_id": None, "reason": reason}
        return {"node": str(node_id), "partition_id": self.partitions.get(node_id), "reason": reason}

    def site_statistics(self, grid: Grid) -> dict[int, dict[str, list[int]]]:
        """partition id -> the statistics the run's parts declare (``Part.shares``), asked of
        every connected node in one query each; a site answers only what is declared."""
        wanted = sorted(site_shares(self.cfg.to_flower()))
        node_ids = self.wait_for_nodes(grid)
        config = ConfigRecord({**self.cfg.to_flower(), keys.SERVER_ROUND: 0, keys.WANT_SHARES: ",".join(wanted)})
        messages = [Message(content=RecordDict({keys.CONFIG: config}), message_type=MessageType.QUERY, dst_node_id=n)
                    for n in node_ids]
        stats: dict[int, dict[str, list[int]]] = {}
        for reply in exchange(grid, messages, self.cfg.round_timeout):
            if reply.has_error() or not has_record(reply.content, keys.METRICS, MetricRecord):
                log(WARNING, "%s did not share %s: %s", self.name(reply.metadata.src_node_id), ", ".join(wanted),
                    short_reason(reply.error.reason or "no reason given") if reply.has_error() else "no metrics")
                continue
            metrics = metrics_in(reply.content, keys.METRICS)
            partition = integer(metrics[keys.PARTITION_ID])
            self.partitions[reply.metadata.src_node_id] = partition
            stats[partition] = {name: [int(v) for v in numbers(metrics[name])] for name in wanted if name in metrics}
        if not stats:
            raise RoundFailedError(f"no site shared {', '.join(wanted)}, which protocol '{self.cfg.protocol}' needs "
                                   "before round 1; see the nodes' errors")
        return stats
