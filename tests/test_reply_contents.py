"""A site's reply carries exactly what the run's parts declare, in any combination of parts and
whatever the server's message asks for.

The ClientApp's own handlers (``train_round``, ``query_round``) build the replies. What each may
carry is derived here from the declarations, not from the handlers:

* a training reply: the trained arrays (the model's state; FedConcat's head in stage 2),
  ``num-examples``, ``train-loss``, ``partition-id`` and ``train-<term>`` for each of the
  objective's ``term_names`` (FedConcat's stage 2: its head's cross-entropy); the class counts
  and vacant classes only under ``share-class-counts``, the per-class test accuracy only under
  ``local-eval``; and ``client-info`` (device, machine). A part's declared statistics
  (``Part.shares``) are asked for by a query, never sent with training;
* a query reply: ``partition-id`` and ``client-info``, plus each statistic the query asks for
  that the run's parts declare (``Part.shares``, read here from the declarations and the
  documented exception - FedConcat shares nothing when ``fedconcat-assignment`` is set - not
  from the function the ClientApp calls), nothing for one no part declares.

The server's messages carry extra requests: every site statistic and unknown ones in
``want-shares``, keys no setting declares, and for FedGF the downlink. And the other direction:
the server asks a site only for what the run needs (a run of the real server on the in-process
engine, every message recorded).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.app import keys
from fedvls_flwr.app.client import query_round, train_round
from fedvls_flwr.config.registry import KINDS, SITE_STATISTICS, get_method, get_part
from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.data.node_data import client_data

RUN = {"dataset": "digits", "local-epochs": 1, "dirichlet-beta": 0.1, "seed": 3, "device": "cpu"}
NODE = {"partition-id": 1, "num-partitions": 4}
#: What a server might add to any message: every statistic there is and some there are not.
ASKED = ",".join([*SITE_STATISTICS, "label-histogram", keys.NUM_VACANT, keys.LOCAL_PER_CLASS_ACCURACY])
EXTRA = {keys.WANT_SHARES: ASKED, "send-class-counts": True, "share-everything": "yes"}
BASE_METRICS = {keys.NUM_EXAMPLES, keys.TRAIN_LOSS, keys.PARTITION_ID}
CLIENT_INFO = {keys.DEVICE, keys.NODE}

METHODS = [p.name for p in KINDS["method"][0]]
LOCAL = [p.name for p in KINDS["local-optimizer"][0]]
SERVER = [p.name for p in KINDS["server-optimizer"][0]]
PROTOCOLS = [p.name for p in KINDS["protocol"][0]]


def combinations() -> list[dict[str, Any]]:
    """Every method with every local optimizer, and every method under each protocol's stages;
    server optimizers (the client never reads them) and the two diagnostics cycled over them."""
    out = []
    for i, (method, local) in enumerate(itertools.product(METHODS, LOCAL)):
        out.append({"method": method, "local-optimizer": local, "server-optimizer": SERVER[i % len(SERVER)],
                    "share-class-counts": i % 2 == 0, "local-eval": i % 3 == 0})
    for i, method in enumerate(METHODS):
        for stage in (1, 2):
            out.append({"method": method, "local-optimizer": LOCAL[i % 2], "protocol": "fedconcat", "stage": stage,
                        "num-server-rounds": 4, "fedconcat-encoder-rounds": 2, "fedconcat-assignment": "0,1,0,1",
                        "share-class-counts": i % 2 == 1, "local-eval": i % 3 == 1})
    assert {c.get("protocol", "standard") for c in out} == set(PROTOCOLS), "a protocol is missing from the covering set"
    return out


def _id(c: dict[str, Any]) -> str:
    flags = "".join(f"+{k}" for k in ("share-class-counts", "local-eval") if c[k])
    where = f"fedconcat{c['stage']}" if "stage" in c else c["server-optimizer"]
    return f"{c['method']}-{c['local-optimizer']}-{where}{flags}"


def training_message(combo: dict[str, Any]) -> tuple[RecordDict, set[str], Any]:
    """The server's message for ``combo`` (with the extra requests), the array names the reply
    must have, and the run config."""
    values = {**RUN, **{k: v for k, v in combo.items() if k != "stage"}}
    cfg = parse_run_config(values)
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 8, 8), 10)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = {**cfg.to_flower(), keys.SERVER_ROUND: 3 if combo.get("stage") == 2 else 1, **EXTRA}
    arrays: dict[str, torch.Tensor] = state
    if combo.get("stage") == 2:
        classifier = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        head = {"head/weight": torch.zeros(10, 2 * classifier.in_features), "head/bias": torch.zeros(10)}
        arrays = {**head, **{f"encoder{k}/{name}": v for k in range(2) for name, v in state.items()}}
        config["fedconcat-stage"] = 2
    content = RecordDict({keys.ARRAYS: ArrayRecord(arrays), keys.CONFIG: ConfigRecord(config)})
    if combo["local-optimizer"] == "fedgf":  # what FedGF's server sends from round 2
        perturbed = {k: v + 0.01 for k, v in state.items() if v.is_floating_point()}
        content[keys.DOWNLINK] = ArrayRecord(perturbed)
        content[keys.DOWNLINK_VALUES] = ConfigRecord({"c": 0.3})
    expected_arrays = {"head/weight", "head/bias"} if combo.get("stage") == 2 else set(state)
    return content, expected_arrays, cfg


@pytest.mark.parametrize("combo", combinations(), ids=_id)
def test_a_training_reply_carries_exactly_what_is_declared(combo):
    content, expected_arrays, cfg = training_message(combo)
    kept = RecordDict()
    reply = train_round(content, dict(NODE), kept)

    if combo.get("stage") == 2:
        terms = {"head-ce"}
    else:
        terms = set(get_method(combo["method"]).load().term_names)
    expected = BASE_METRICS | {keys.TRAIN_TERM_PREFIX + t for t in terms}
    if combo["share-class-counts"]:
        expected |= {keys.CLASS_COUNTS, keys.NUM_VACANT}
    if combo["local-eval"] and combo.get("stage") != 2:
        expected |= {keys.LOCAL_PER_CLASS_ACCURACY}
    assert set(reply.array_records) == {keys.ARRAYS} and set(reply.metric_records) == {keys.METRICS}
    assert set(reply.config_records) == {keys.CLIENT_INFO}
    assert set(reply.metric_records[keys.METRICS]) == expected
    assert set(reply.array_records[keys.ARRAYS]) == expected_arrays
    assert set(reply.config_records[keys.CLIENT_INFO]) == CLIENT_INFO
    if combo["share-class-counts"]:
        held = torch.bincount(client_data(cfg, 1, 4).y, minlength=10).tolist()
        assert list(reply.metric_records[keys.METRICS][keys.CLASS_COUNTS]) == held


def declared_shares(values: dict[str, Any]) -> set[str]:
    """What the run's parts declare a site shares (``Part.shares`` of each part the run selects),
    less what docs/methods.md says a run does not need: FedConcat "shares nothing when
    fedconcat-assignment is set"."""
    shared = {s for kind, (_, default) in KINDS.items() for s in get_part(kind, str(values.get(kind, default))).shares}
    if values.get("protocol") == "fedconcat" and values.get("fedconcat-assignment"):
        shared.discard(keys.CLASS_COUNTS)
    return shared


#: Every protocol, and FedConcat with its clusters given.
QUERY_RUNS = [{"protocol": p} for p in PROTOCOLS] + [{"protocol": "fedconcat", "fedconcat-assignment": "0,1,0,1"}]


@pytest.mark.parametrize("run", QUERY_RUNS, ids=lambda r: "+".join(str(v) for v in r.values()))
@pytest.mark.parametrize("asked", ["", "class-counts", ASKED, "label-histogram"])
@pytest.mark.parametrize("share_class_counts", [False, True])
def test_a_query_reply_carries_only_the_declared_statistics_it_was_asked_for(run, asked, share_class_counts):
    values = {**RUN, **run, "num-server-rounds": 4, "share-class-counts": share_class_counts}
    cfg = parse_run_config(values)
    config = {**cfg.to_flower(), keys.SERVER_ROUND: 0, "send-class-counts": True, **({keys.WANT_SHARES: asked} if asked else {})}
    reply = query_round(RecordDict({keys.CONFIG: ConfigRecord(config)}), dict(NODE))

    declared = declared_shares(values)
    expected = {keys.PARTITION_ID} | ({s for s in asked.split(",") if s} & declared)
    assert set(reply.metric_records) == {keys.METRICS} and set(reply.config_records) == {keys.CLIENT_INFO}
    assert not reply.array_records
    assert set(reply.metric_records[keys.METRICS]) == expected
    assert set(reply.config_records[keys.CLIENT_INFO]) == CLIENT_INFO
    if keys.CLASS_COUNTS in expected:
        held = torch.bincount(client_data(cfg, 1, 4).y, minlength=10).tolist()
        assert list(reply.metric_records[keys.METRICS][keys.CLASS_COUNTS]) == held


def test_a_query_without_a_config_says_only_who_the_node_is():
    reply = query_round(RecordDict(), dict(NODE))
    assert set(reply.metric_records[keys.METRICS]) == {keys.PARTITION_ID}


def test_no_loss_term_can_pass_for_another_reply_metric():
    """``train-<term>`` of every objective is a name of its own (a term called ``loss`` would
    overwrite ``train-loss``)."""
    reserved = {keys.NUM_EXAMPLES, keys.TRAIN_LOSS, keys.PARTITION_ID, keys.NUM_VACANT, keys.CLASS_COUNTS,
                keys.LOCAL_PER_CLASS_ACCURACY, keys.PEAK_GPU_MB, *SITE_STATISTICS}
    for method in METHODS:
        names = {keys.TRAIN_TERM_PREFIX + t for t in get_method(method).load().term_names}
        assert not names & reserved, method


def recording_client_app(seen: list[tuple[str, str | None, set[str]]]):
    """The project's ClientApp handlers behind a mod that records every message: its type, the
    statistics its config asks for (``want-shares``, None when absent) and the reply's metric names."""
    from flwr.clientapp import ClientApp

    from fedvls_flwr.app import client_app as production

    def record(msg, context, call_next):
        config = msg.content.config_records.get(keys.CONFIG)
        reply = call_next(msg, context)
        metrics = reply.content.metric_records.get(keys.METRICS) if not reply.has_error() else None
        seen.append((msg.metadata.message_type, None if config is None else config.get(keys.WANT_SHARES),
                     set(metrics or {})))
        return reply

    app = ClientApp(mods=[record])
    app.train()(production.train)
    app.evaluate()(production.evaluate)
    app.query()(production.query)
    return app


@pytest.mark.parametrize("run", QUERY_RUNS, ids=lambda r: "+".join(str(v) for v in r.values()))
def test_the_server_asks_a_site_only_for_what_the_run_needs(run, tmp_path):
    """A run of the real ServerApp: a statistic is asked for, once per site before round 1, only
    when the run's parts need it (K-means' label distributions); FedConcat with its clusters given
    sends no query for statistics, and no reply of any kind carries the class counts."""
    from tests.runs import run_here

    values = {**RUN, **run, "method": "fedavg", "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "r"}
    if run["protocol"] == "fedconcat":
        values["fedconcat-encoder-rounds"] = 1
    seen: list[tuple[str, str | None, set[str]]] = []
    run_here(values, 4, client_app=recording_client_app(seen))
    needed = declared_shares(values)
    asked = [(kind, want) for kind, want, _ in seen if want is not None]
    if needed:
        assert asked == [("query", ",".join(sorted(needed)))] * 4, asked
    else:
        assert asked == [], f"the server asked the sites for statistics the run does not need: {asked}"
    carried = [kind for kind, _, metrics in seen if keys.CLASS_COUNTS in metrics]
    assert carried == (["query"] * 4 if keys.CLASS_COUNTS in needed else []), carried
