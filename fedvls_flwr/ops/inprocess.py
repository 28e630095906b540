"""The in-process engine: the project's own ServerApp and ClientApp, unchanged, in this process.

``flwr run .`` starts a SuperLink, a SuperExec and a Ray cluster, and moves every message
through them: seconds of start-up per run and milliseconds per message, which for the small
models of label-skew research is most of a run's time. This engine gives the ServerApp a Grid
(:class:`InProcessGrid`, Flower's ``Grid`` interface) that hands each pushed message to the
ClientApp with that node's ``Context`` and keeps the reply for ``pull_messages``. No SuperLink,
no SuperExec, no Ray; the same run folder, checkpoints, resume, tracking and refusals.

What it keeps identical to Flower's simulation (``flwr/server/superlink/fleet/vce``), so that
a deterministic run's history equals ``flwr run .``'s bit for bit:

* the run config: the app's ``[tool.flwr.app.config]`` fused with the overrides, as Flower
  fuses them; each node's ``Context``: ``node_config`` {partition-id, num-partitions}, a
  ``state`` that persists across that node's messages (and is left as it was when the
  ClientApp raises, as a Ray actor's copy would be), the run config; random node ids;
* messages: ids given at push, each node handed its own copy of the message, replies built by
  the ClientApp (``reply_to`` set), and for a ClientApp that raises the error reply Flower's
  simulation builds (code ``CLIENT_APP_RAISED_EXCEPTION``, the exception's text);
* the ClientApp's process as Ray gives it: ``client-resources-num-cpus`` torch threads (Ray's
  ``OMP_NUM_THREADS``) unless the run's ``torch-threads`` sets them, and nothing it does to
  torch's thread count or the random generators reaches the ServerApp's side.

Clients run one after another (a round's messages in the order the ServerApp pushed them).
A GPU, where torch sees one, is the clients' and the server's.
"""

from __future__ import annotations

import copy
import random
import secrets
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY, SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedvls_flwr.app.client_app import app as project_client_app
from fedvls_flwr.app.server_app import RUN_RECORD
from fedvls_flwr.app.server_app import app as server_app
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.ops.launch import PROJECT_DIR

__all__ = ["InProcessGrid", "InProcessRun", "run_in_process"]

#: Flower's default ``client-resources-num-cpus`` in a simulation (Ray's per-actor CPUs).
FLOWER_DEFAULT_CLIENT_CPUS = 2.0


def _new_node_ids(count: int) -> list[int]:
    """Random, distinct node ids, as a SuperLink gives them (the app orders nodes by partition)."""
    ids: set[int] = set()
    while len(ids) < count:
        ids.add(secrets.randbits(63) or 1)
    return list(ids)


@contextmanager
def _client_process(threads: int) -> Iterator[None]:
    """The ClientApp as a Ray actor runs it: its own torch thread count and random generators,
    which the ServerApp's side (evaluation, sampling) never sees."""
    server_threads = torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(server_threads)
            random.setstate(py_state)
            np.random.set_state(np_state)


def _own_copy(message: Message) -> Message:
    """A copy of ``message`` that shares nothing mutable with it: new records, new ``Array``
    objects over the same (immutable) bytes, lists copied. What a transport's serialisation
    gives, without re-encoding the arrays."""
    copied = copy.copy(message)
    copied.__dict__["_metadata"] = copy.copy(message.metadata)
    copied.__dict__["_content"] = None if message.__dict__.get("_content") is None else _content_copy(message.content)
    return copied


def _content_copy(content: RecordDict) -> RecordDict:
    """Records copied without Flower's per-item checks (the items were checked when the server
    set them): an ``Array``'s fields are replaced, never changed in place, so a copied ``Array``
    may share its bytes."""
    out = copy.copy(content)
    records = {}
    for name, record in content.items():
        new = copy.copy(record)
        if isinstance(record, ArrayRecord):
            new.__dict__["_data"] = {k: copy.copy(a) for k, a in record.items()}
        else:  # ConfigRecord / MetricRecord: scalars and lists of scalars
            new.__dict__["_data"] = {k: list(v) if isinstance(v, list) else v for k, v in record.items()}
        records[name] = new
    out.__dict__["_data"] = records
    return out


class InProcessGrid(Grid):
    """Flower's ``Grid`` over a ClientApp in this process (see the module docstring)."""

    #: Every node is registered when the run starts (as in Flower's simulation): the app's
    #: server waits for none and judges ``min-nodes`` at once.
    every_node_registered = True

    def __init__(self, client_app: ClientApp, run: Run, run_config: dict[str, Any], num_nodes: int,
                 client_threads: int = 1) -> None:
        self.client_app = client_app
        self._run = run
        self.client_threads = client_threads
        self.contexts: dict[int, Context] = {}
        for partition, node_id in enumerate(_new_node_ids(num_nodes)):
            node_config: dict[str, bool | float | int | str] = {PARTITION_ID_KEY: partition, NUM_PARTITIONS_KEY: num_nodes}
            self.contexts[node_id] = Context(run_id=run.run_id, node_id=node_id, node_config=node_config,
                                             state=RecordDict(), run_config=dict(run_config))
        self._replies: dict[str, Message] = {}
        self.client_seconds = 0.0  # time spent inside the ClientApp (all messages)

    # ---- Flower's Grid interface ----------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[Any]:
        from flwr.proto.node_pb2 import NodeInfo  # noqa: PLC0415 - only asked for by tools, never by the app

        return [NodeInfo(node_id=n) for n in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            if message.metadata.dst_node_id not in self.contexts:
                raise ValueError(f"no node {message.metadata.dst_node_id} in this run")
            self._replies[message.metadata.message_id] = self._deliver(message)
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # ---- one message ----------------------------------------------------------------------
    def _deliver(self, message: Message) -> Message:
        """The node's reply to its own copy of ``message`` (an error reply when the ClientApp raises)."""
        context = self.contexts[message.metadata.dst_node_id]
        received = _own_copy(message)  # as a transport would: the node's own message
        kept = dict(context.state.items())  # the records the node held before this message
        t0 = time.perf_counter()
        try:
            with _client_process(self.client_threads):
                reply = self.client_app(message=received, context=context)
        except Exception as ex:  # noqa: BLE001 - a ClientApp that raises is a failed reply, as in Flower
            for name in [n for n in context.state if n not in kept]:
                del context.state[name]
            for name, record in kept.items():
                context.state[name] = record
            wrapped = ClientAppException(str(ex))
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                  reason=str(type(wrapped)) + ":<'" + str(wrapped) + "'>"), reply_to=message)
        finally:
            self.client_seconds += time.perf_counter() - t0
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return reply


@dataclass
class InProcessRun:
    """What a run on the in-process engine did: its folder and where its seconds went."""

    run_dir: Path
    seconds: float
    client_seconds: float
    nodes: int
    extra: dict[str, Any] = field(default_factory=dict)


def run_in_process(overrides: dict[str, Any], num_supernodes: int = 10, *,
                   client_cpus: float = FLOWER_DEFAULT_CLIENT_CPUS, project_dir: Path | None = None,
                   client_app: ClientApp | None = None) -> InProcessRun:
    """Run one experiment on the in-process engine: ``overrides`` of the app's run config (as
    ``flwr run --run-config`` gives them), ``num_supernodes`` simulated nodes. Raises what the
    ServerApp raises (a run that fails here is one ``flwr run`` reports ``finished:failed``).
    ``client_app``: another ClientApp (the tests' fault injection wraps the project's)."""
    client_app = client_app or project_client_app
    run_config = fused_run_config(overrides, project_dir)
    run_id = secrets.randbits(63) or 1
    run = Run.create_empty(run_id)
    grid = InProcessGrid(client_app, run, run_config, num_supernodes, client_threads=max(1, int(client_cpus)))
    context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                      run_config=dict(run_config))
    identity = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    t0 = time.perf_counter()
    try:
        server_app(grid=grid, context=context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = identity
    run_dir = Path(str(context.state.config_records[RUN_RECORD]["run-dir"]))
    return InProcessRun(run_dir=run_dir, seconds=time.perf_counter() - t0, client_seconds=grid.client_seconds,
                        nodes=num_supernodes)


def fused_run_config(overrides: dict[str, Any], project_dir: Path | None = None) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` fused with ``overrides``, as Flower's simulation
    fuses them (an unknown key is an error there too); without the app's pyproject.toml (an
    installed package), the declared defaults, which that table is generated from."""
    app_dir = Path(project_dir or PROJECT_DIR)
    if (app_dir / "pyproject.toml").is_file():
        from flwr.common.config import get_fused_config_from_dir

        return dict(get_fused_config_from_dir(app_dir, dict(overrides)))
    defaults = RunConfig().to_flower()
    if unknown := sorted(set(overrides) - set(defaults)):
        raise ValueError(f"unknown run config key(s) {unknown}")
    return {**defaults, **overrides}
