"""Round records name the machines the replies ran on, never Flower's node ids.

Flower gives every node a random id per run (the in-process engine too). A round's ``nodes``
counts the accepted replies per machine, as each reply's ``client-info`` names it
(``keys.NODE``: the host here, a Ray node in a simulation); ``sampled_partitions`` names the
sites. Both must come out the same in two runs of one config, whatever ids Flower drew.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, MessageType
from flwr.clientapp import ClientApp

from fedvls_flwr.app import client_app as production
from fedvls_flwr.app import keys
from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.ops.inprocess import run_in_process
from tests.runs import DIGITS_RUN

NODES = 4
CONFIG = {**DIGITS_RUN, "method": "fedavg", "num-server-rounds": 3, "fraction-train": 0.5, "seed": 5,
          "torch-threads": 1}


def app_with(mod: Callable[[Message, Context, Callable[[Message, Context], Message]], Message]) -> ClientApp:
    """The project's handlers behind ``mod``."""
    app = ClientApp(mods=[mod])
    app.train()(production.train)
    app.evaluate()(production.evaluate)
    app.query()(production.query)
    return app


def run_once(tmp_path, name: str, mod) -> list[dict]:
    run_in_process({**CONFIG, "output-dir": str(tmp_path), "run-name": name}, NODES, client_cpus=1, client_app=app_with(mod))
    return read_rounds(tmp_path / name)


def test_two_runs_name_the_same_machines_and_sites_whatever_flowers_node_ids(tmp_path):
    trained_by: list[set[int]] = []

    def recording(msg: Message, context: Context, call_next):
        if msg.metadata.message_type == MessageType.TRAIN:
            trained_by[-1].add(context.node_id)
        return call_next(msg, context)

    runs = []
    for name in ("a", "b"):
        trained_by.append(set())
        runs.append(run_once(tmp_path, name, recording))
    assert trained_by[0].isdisjoint(trained_by[1]), "Flower's node ids should differ between runs"
    host = socket.gethostname()
    for rounds in runs:
        for r in rounds[1:]:
            assert r["nodes"] == {host: r["clients_accepted"]} and r["clients_accepted"] == NODES // 2
    assert [r["nodes"] for r in runs[0][1:]] == [r["nodes"] for r in runs[1][1:]]
    assert [r["sampled_partitions"] for r in runs[0][1:]] == [r["sampled_partitions"] for r in runs[1][1:]]
    assert len({tuple(r["sampled_partitions"]) for r in runs[0][1:]}) > 1  # the sample changes from round to round


def test_a_round_counts_the_machine_each_reply_names(tmp_path):
    """Replies say they ran on one of two machines (by partition); the round record counts those
    names, not Flower's node ids, and the summary adds them up over the run."""

    def machine(partition: int) -> str:
        return f"machine-{partition % 2}"

    def relabelling(msg: Message, context: Context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            info = dict(reply.content.config_records[keys.CLIENT_INFO])
            info[keys.NODE] = machine(int(context.node_config["partition-id"]))
            reply.content[keys.CLIENT_INFO] = ConfigRecord(info)
        return reply

    rounds = run_once(tmp_path, "named", relabelling)
    total: Counter[str] = Counter()
    for r in rounds[1:]:
        want = Counter(machine(p) for p in r["sampled_partitions"])
        assert r["nodes"] == dict(want), r["round"]
        total += want
    summary = json.loads((tmp_path / "named" / "summary.json").read_text())
    assert summary["replies_per_node"] == dict(total)
