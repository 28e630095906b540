"""Test ClientApps for the client workers' plumbing (tests/test_client_workers.py): small,
fast and telling - what state they saw, which process ran them - importable by a worker
process as ``tests.worker_apps:app``.

A train message's ConfigRecord ``"do"`` says what to do: ``count`` (the default) adds one to
a counter in the node's ``Context.state`` and replies the received arrays; ``raise`` changes
the state, then raises; ``die`` kills the worker process (SIGKILL); ``hold`` keeps a 4 MB array in
the node's state, written the first time and left alone after; ``slow`` counts after waiting 0.3 s
(long enough that every worker of a pool takes a message of the round, however loaded the machine);
``draw`` counts and replies a number drawn from each of Python's, numpy's and torch's global
random generators; ``own`` counts and replies, instead of the received arrays, an array as large
filled with its partition id (replies that differ, to tell one from another); ``linger`` writes
its process id to the file ``$FEDVLS_TEST_LINGERING`` names,
then waits 30 s (a worker caught in the middle of a message); ``poison`` raises as a CUDA error that
breaks the process's GPU context would, and makes the worker's check of its context say it broke
(only ever sent to a worker: the check stays changed in the process that ran it); ``refused``
replies a metric list changed after Flower checked it (a value Flower's wire refuses).
"""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()

#: The file a ``linger`` message writes its worker's process id to (then it waits).
LINGERING_ENV = "FEDVLS_TEST_LINGERING"


@app.train()
def train(msg: Message, context: Context) -> Message:
    do = str(msg.content.config_records["config"].get("do", "count")) if "config" in msg.content.config_records else "count"
    seen = int(context.state.config_records["seen"]["count"]) if "seen" in context.state.config_records else 0
    if do == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if do == "slow":
        time.sleep(0.3)
    if do == "linger":
        with open(os.environ[LINGERING_ENV], "w") as marker:
            marker.write(str(os.getpid()))
        time.sleep(30)
    if do == "hold" and "big" not in context.state.array_records:
        context.state["big"] = ArrayRecord({"x": Array(np.full(1_000_000, seen + 1, dtype=np.float32))})
    context.state["seen"] = ConfigRecord({"count": seen + 1})
    context.state["history"] = ArrayRecord({"last": Array(np.full(3, seen + 1, dtype=np.int64))})
    if do == "raise":
        raise ValueError(f"asked to raise at count {seen + 1}")
    if do == "poison":
        from fedvls_flwr.ops import client_worker

        client_worker.gpu_context_broken = lambda: True
        raise RuntimeError("CUDA error: an illegal memory access was encountered (a test)")
    arrays = msg.content.array_records.get("arrays", ArrayRecord())
    if do == "own":
        partition = float(context.node_config.get("partition-id", -1))
        arrays = ArrayRecord({k: Array(np.full(a.shape, partition, dtype=np.float32)) for k, a in arrays.items()})
    metrics = MetricRecord({"count": seen + 1, "pid": os.getpid(),
                            "partition": int(context.node_config.get("partition-id", -1))})
    if do == "refused":
        metrics["listed"] = [1, 2]
        metrics["listed"].append("x")  # type: ignore[union-attr]  # past the record's check, as a ClientApp may
    if do == "draw":
        import torch

        metrics["drawn"] = [random.random(), float(np.random.random()), float(torch.rand(1))]
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which process answered; the type of every config value received (a value's, or a list's
    values'), and a numpy scalar among its metrics (the wire gives the server a float)."""
    config = msg.content.config_records.get("config", ConfigRecord())
    seen = [f"{key}:{'list ' + ','.join(type(v).__name__ for v in value) if isinstance(value, list) else type(value).__name__}"
            for key, value in config.items()]
    return Message(RecordDict({"metrics": MetricRecord({"pid": os.getpid(), "half": np.float64(0.5)}),
                               "seen": ConfigRecord({"types": seen})}), reply_to=msg)


def broken() -> ClientApp:
    raise ImportError("this ClientApp cannot be loaded (a test)")


#: A file the recording ClientApp appends "round partition pid" to for every train message.
SERVED_BY_ENV = "FEDVLS_TEST_SERVED_BY"
#: Seconds a train message waits, by its node's place in the round's finishing order: no sum of
#: two is within 0.4 s of a third, so one worker's two messages never tie with another's one.
PACE = (0.0, 0.4, 1.0, 2.0)


def record_worker(msg: Message, context: Context, call_next) -> Message:  # noqa: ANN001 - Flower's mod signature
    """A mod that says which process trained which node in which round (the project's replies
    unchanged). Each node first waits ``PACE[(partition + round) % 4]`` seconds, so the
    order in which a round's messages finish - hence which free worker takes which queued
    message - changes from round to round and no longer rests on the threads' timing (the gaps,
    0.4 s or more, dwarf a digits client's jitter): the nodes move between workers by design."""
    if msg.metadata.message_type == "train" and (path := os.environ.get(SERVED_BY_ENV)):
        partition = int(context.node_config.get("partition-id", -1))
        server_round = int(msg.content.config_records["config"]["server-round"])
        time.sleep(PACE[(partition + server_round) % len(PACE)])
        with open(path, "a") as out:
            out.write(f"{server_round} {partition} {os.getpid()}\n")
    return call_next(msg, context)


def project_recording_workers() -> ClientApp:
    """The project's ClientApp handlers behind :func:`record_worker` (``tests.worker_apps:project_recording_workers``)."""
    from fedvls_flwr.app import client_app as production

    recording = ClientApp(mods=[record_worker])
    recording.train()(production.train)
    recording.evaluate()(production.evaluate)
    recording.query()(production.query)
    return recording
