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
  that the run's parts declare (``site_shares``), nothing for one no part declares.

The server's messages carry extra requests: every site statistic and unknown ones in
``want-shares``, keys no setting declares, and for FedGF the downlink.
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
from fedvls_flwr.config.registry import KINDS, SITE_STATISTICS, get_method, site_shares
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


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("asked", ["", "class-counts", ASKED, "label-histogram"])
@pytest.mark.parametrize("share_class_counts", [False, True])
def test_a_query_reply_carries_only_the_declared_statistics_it_was_asked_for(protocol, asked, share_class_counts):
    values = {**RUN, "protocol": protocol, "num-server-rounds": 4, "share-class-counts": share_class_counts}
    cfg = parse_run_config(values)
    config = {**cfg.to_flower(), keys.SERVER_ROUND: 0, "send-class-counts": True, **({keys.WANT_SHARES: asked} if asked else {})}
    reply = query_round(RecordDict({keys.CONFIG: ConfigRecord(config)}), dict(NODE))

    declared = site_shares(cfg.to_flower())
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
