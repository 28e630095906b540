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
  ``OMP_NUM_THREADS``) unless the run's ``torch-threads`` sets them, random generators that the
  messages it serves draw from in turn, and nothing it does to torch's thread count or the
  random generators reaches the ServerApp's side.

A round's clients run at once on client workers (:mod:`fedvls_flwr.ops.client_pool`), as many
as the federation config gives room for (:func:`fedvls_flwr.ops.resources.plan_workers`); one
worker on a machine without a GPU is this process, the clients one after another in the order
the ServerApp pushed them. Flower's objects are handled through
:mod:`fedvls_flwr.ops.flower_internals`.
"""

from __future__ import annotations

import atexit
import secrets
import time
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY, SUPERLINK_NODE_ID
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from fedvls_flwr.app.client_app import app as project_client_app
from fedvls_flwr.app.server_app import RUN_RECORD
from fedvls_flwr.app.server_app import app as server_app
from fedvls_flwr.config.run_config import ConfigError, RunConfig
from fedvls_flwr.ops.client_pool import PROJECT_CLIENT_APP, ClientPool
from fedvls_flwr.ops.client_worker import ClientGenerators, generators_apart, run_client, stamped
from fedvls_flwr.ops.flower_internals import own_copy, set_message_id, task_identity
from fedvls_flwr.ops.launch import PROJECT_DIR
from fedvls_flwr.ops.resources import (
    FLOWER_DEFAULT_CLIENT_CPUS,
    FLOWER_DEFAULT_CLIENT_GPUS,
    Machine,
    WorkerPlan,
    detect_machine,
    plan_workers,
    resource_problem,
)

__all__ = ["InProcessGrid", "InProcessRun", "close_kept_pool", "run_in_process"]

#: How long one ``pull_messages`` waits for the replies it asks for (the server's own loop sleeps
#: 10 ms between pulls: waiting here instead, it sees the round's last reply at once).
PULL_WAIT = 0.1


def _new_node_ids(count: int) -> list[int]:
    """Random, distinct node ids, as a SuperLink gives them (the app orders nodes by partition)."""
    ids: set[int] = set()
    while len(ids) < count:
        ids.add(secrets.randbits(63) or 1)
    return list(ids)


class InProcessGrid(Grid):
    """Flower's ``Grid`` over a ClientApp in this process (see the module docstring)."""

    #: Every node is registered when the run starts (as in Flower's simulation): the app's
    #: server waits for none and judges ``min-nodes`` at once.
    every_node_registered = True

    def __init__(self, client_app: ClientApp, run: Run, run_config: dict[str, Any], num_nodes: int,
                 client_threads: int = 1, pool: ClientPool | None = None) -> None:
        self.client_app = client_app
        self._run = run
        self.client_threads = client_threads
        self.pool = pool  # None: every message runs here, when it is pushed
        self.client_generators = ClientGenerators()  # theirs, when they run here
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
        ids, batch = [], []
        # without workers the clients run here, beside the server
        with generators_apart(self.client_generators) if self.pool is None else nullcontext():
            for message in messages:
                set_message_id(message, str(uuid4()))
                if message.metadata.dst_node_id not in self.contexts:
                    raise ValueError(f"no node {message.metadata.dst_node_id} in this run")
                if self.pool is None:
                    self._replies[message.metadata.message_id] = self._deliver(message)
                else:
                    batch.append((message, self.contexts[message.metadata.dst_node_id]))
                ids.append(message.metadata.message_id)
        if batch and self.pool is not None:
            self.pool.submit(batch)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies that are ready; with workers, once all are or after PULL_WAIT."""
        message_ids = list(message_ids)
        if self.pool is None:
            return [self._replies.pop(i) for i in message_ids if i in self._replies]
        return self.pool.collect(message_ids, wait=PULL_WAIT)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        waiting = list(self.push_messages(messages))
        replies: list[Message] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while waiting and (deadline is None or time.monotonic() < deadline):
            got = list(self.pull_messages(waiting))
            replies += got
            done = {m.metadata.reply_to_message_id for m in got}
            waiting = [i for i in waiting if i not in done]
        return replies

    # ---- one message ----------------------------------------------------------------------
    def _deliver(self, message: Message) -> Message:
        """The node's reply to its own copy of ``message`` (an error reply when the ClientApp raises)."""
        context = self.contexts[message.metadata.dst_node_id]
        received = own_copy(message)  # as a transport would: the node's own message
        t0 = time.perf_counter()
        try:
            reply, _ = run_client(self.client_app, received, context, self.client_threads)
        finally:
            self.client_seconds += time.perf_counter() - t0
        return stamped(reply)


@dataclass
class InProcessRun:
    """What a run on the in-process engine did: its folder, where its seconds went, its workers."""

    run_dir: Path
    seconds: float
    client_seconds: float
    nodes: int
    workers: str = ""  # the plan's one line
    extra: dict[str, Any] = field(default_factory=dict)


#: The pool kept warm between runs in this process (see ``keep_pool``), with what it was made for.
_kept: tuple[ClientPool, tuple] | None = None


def close_kept_pool() -> None:
    """Stop the workers a ``keep_pool`` run left running (at exit; a sweep worker when it ends)."""
    global _kept
    if _kept is not None:
        _kept[0].close()
        _kept = None


atexit.register(close_kept_pool)


def _pool_for(plan: WorkerPlan, client_app: str, keep: bool) -> ClientPool:
    """A pool for ``plan``: the kept one when it was made for the same plan and ClientApp (each
    message carries the changes of this process's environment to its worker)."""
    global _kept
    key = (plan.devices, plan.omp_threads, client_app)
    if _kept is not None and _kept[1] == key and _kept[0].alive:
        return _kept[0]
    close_kept_pool()
    pool = ClientPool(plan, client_app)
    if keep:
        _kept = (pool, key)
    return pool


def client_plan(run_config: dict[str, Any], num_supernodes: int, client_cpus: float, client_gpus: float,
                machine: Machine | None = None, workers: int | None = None) -> WorkerPlan:
    """The run's client workers (:func:`fedvls_flwr.ops.resources.plan_workers`), or
    ConfigError when this machine (or ``machine``, a share of it) cannot serve the config."""
    machine = machine or detect_machine()
    if (problem := resource_problem(client_cpus, client_gpus, machine)) is not None:
        raise ConfigError(problem)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers = {workers}: give 1 or more (1: the clients one after another)")
    threads = run_config.get("torch-threads", 0)
    return plan_workers(machine, client_cpus, client_gpus, num_supernodes,
                        torch_threads=threads if isinstance(threads, int) else 0, most=workers)


def run_in_process(overrides: dict[str, Any], num_supernodes: int = 10, *,
                   client_cpus: float = FLOWER_DEFAULT_CLIENT_CPUS, client_gpus: float = FLOWER_DEFAULT_CLIENT_GPUS,
                   workers: int | None = None, machine: Machine | None = None, project_dir: Path | None = None,
                   client_app: ClientApp | str | None = None, keep_pool: bool = True,
                   client_output: Path | None = None) -> InProcessRun:
    """Run one experiment on the in-process engine: ``overrides`` of the app's run config (as
    ``flwr run --run-config`` gives them), ``num_supernodes`` simulated nodes, each client with
    ``client_cpus`` CPUs and ``client_gpus`` of a GPU (the federation config's
    ``client-resources-num-cpus`` / ``-num-gpus``), on as many workers as ``machine`` (default:
    this one) holds of them, at most ``workers``. Raises ConfigError before anything runs when
    the machine cannot serve the config, and what the ServerApp raises (a run that fails here
    is one ``flwr run`` reports ``finished:failed``).

    ``client_app``: another ClientApp: a ``module:attribute`` reference (a ClientApp, or a
    function that gives one: what a worker process imports), or a ClientApp object, which runs
    in this process only (one worker; the tests' fault injection wraps the project's).
    ``keep_pool``: leave the workers running for this process's next run with the same plan
    and ClientApp (a sweep worker's next run; they stop when this process ends);
    ``client_output``: the file the workers' own output goes to (the run's log).
    """
    run_config = fused_run_config(overrides, project_dir)
    app: ClientApp | None
    if isinstance(client_app, ClientApp):
        # an object cannot be sent to a worker: one worker, this process (whatever the GPUs)
        plan = client_plan(run_config, num_supernodes, client_cpus, 0.0, Machine(max(1.0, client_cpus)), workers=1)
        app, reference = client_app, None
    else:
        plan = client_plan(run_config, num_supernodes, client_cpus, client_gpus, machine, workers)
        reference = client_app or PROJECT_CLIENT_APP
        app = project_client_app if reference == PROJECT_CLIENT_APP else None
    run_id = secrets.randbits(63) or 1
    run = Run.create_empty(run_id)
    log(INFO, "client workers: %s", plan.describe())
    pool = None if plan.in_this_process or reference is None else _pool_for(plan, reference, keep_pool)
    if pool is None and app is None:
        from fedvls_flwr.ops.client_worker import load_client_app

        app = load_client_app(str(reference))
    assert app is not None or pool is not None
    if pool is not None and client_output is not None:
        pool.log_to = str(client_output)
    grid = InProcessGrid(app or project_client_app, run, run_config, num_supernodes,
                         client_threads=plan.omp_threads, pool=pool)
    context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                      run_config=dict(run_config))
    t0 = time.perf_counter()
    before = (pool.client_seconds, pool.transport_seconds, len(pool.crashes)) if pool is not None else (0.0, 0.0, 0)
    try:
        with task_identity(1, run_id, SUPERLINK_NODE_ID):  # the ServerApp's, as its SuperExec gives it
            server_app(grid=grid, context=context)
    finally:
        if pool is not None:
            pool.forget()
            if not (keep_pool and pool.alive):
                pool.close()
    run_dir = Path(str(context.state.config_records[RUN_RECORD]["run-dir"]))
    extra: dict[str, Any] = {}
    client_seconds = grid.client_seconds
    if pool is not None:
        client_seconds = pool.client_seconds - before[0]
        extra = {"transport_seconds": pool.transport_seconds - before[1], "crashes": pool.crashes[before[2]:]}
    return InProcessRun(run_dir=run_dir, seconds=time.perf_counter() - t0, client_seconds=client_seconds,
                        nodes=num_supernodes, workers=plan.describe(), extra=extra)


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
