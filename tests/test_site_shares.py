"""A site shares only what its method needs: a training reply carries the site's class counts
(its label distribution) only under the diagnostic share-class-counts; a simulation's server
rebuilds them from the split for its class-wise views, a deployment's has none."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.app import keys
from fedvls_flwr.app.client import train_round
from fedvls_flwr.app.site_counts import KnownClassCounts, with_mean_vacant
from fedvls_flwr.config.registry import KINDS, site_shares
from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.data.node_data import client_data, partition_class_counts

RUN = {"dataset": "digits", "local-epochs": 1, "dirichlet-beta": 0.1, "seed": 3}


def reply_metrics(method: str, **extra: object) -> dict:
    cfg = parse_run_config({**RUN, "method": method, **extra})
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 8, 8), 10)
    content = RecordDict({
        keys.ARRAYS: ArrayRecord(model.state_dict()),
        keys.CONFIG: ConfigRecord({**cfg.to_flower(), keys.SERVER_ROUND: 1}),
    })
    reply = train_round(content, {"partition-id": 1, "num-partitions": 4})
    return dict(reply.metric_records[keys.METRICS])


@pytest.mark.parametrize("method", ["fedavg", "fedlc", "fedntd", "fedvls"])
def test_a_training_reply_carries_no_label_distribution_by_default(method):
    metrics = reply_metrics(method)
    assert keys.NUM_EXAMPLES in metrics and keys.TRAIN_LOSS in metrics
    assert keys.CLASS_COUNTS not in metrics and keys.NUM_VACANT not in metrics


def test_share_class_counts_sends_the_sites_counts():
    metrics = reply_metrics("fedvls", **{"share-class-counts": True})
    held = torch.bincount(client_data(parse_run_config(RUN), 1, 4).y, minlength=10).tolist()
    assert list(metrics[keys.CLASS_COUNTS]) == held
    assert metrics[keys.NUM_VACANT] == held.count(0) > 0


def test_only_fedconcat_declares_a_site_statistic():
    assert site_shares({"method": "fedvls"}) == set()
    assert site_shares({"method": "fedvls", "protocol": "fedconcat"}) == {"class-counts"}
    assert [p.name for parts, _ in KINDS.values() for p in parts if p.shares] == ["fedconcat"]


@pytest.mark.parametrize("extra", [{}, {"partition": "shards", "shards-per-client": 2}])
def test_the_server_rebuilds_each_simulated_partition(extra):
    cfg = parse_run_config({**RUN, **extra})
    counts = partition_class_counts(cfg, 5)
    assert sorted(counts) == list(range(5))
    for pid in range(5):  # what each node's own data loader holds
        assert counts[pid] == torch.bincount(client_data(cfg, pid, 5).y, minlength=10).tolist()


def test_synthetic_partitions_are_its_clients():
    cfg = parse_run_config({"dataset": "synthetic", "synthetic-clients": 4})
    counts = partition_class_counts(cfg, 4)
    assert sorted(counts) == [0, 1, 2, 3] and all(len(c) == 10 and sum(c) > 0 for c in counts.values())


def test_known_counts_in_a_simulation_and_a_deployment():
    cfg = parse_run_config(RUN)
    clients = [{"partition_id": 0, "num_examples": 5.0}, {"partition_id": 2, "num_examples": 7.0}]
    simulated = KnownClassCounts(cfg, simulation=True, num_nodes=lambda: 4).of(clients)
    assert simulated == {p: c for p, c in partition_class_counts(cfg, 4).items() if p in (0, 2)}
    assert KnownClassCounts(cfg, simulation=False, num_nodes=lambda: 4).of(clients) == {}
    sent = [{"partition_id": 9, "class_counts": [1, 0, 2]}]
    assert KnownClassCounts(cfg, simulation=False, num_nodes=lambda: 4).of(sent) == {9: [1, 0, 2]}


def test_a_server_without_the_dataset_leaves_the_views_out(tmp_path):
    cfg = parse_run_config({"dataset": "mnist", "data-dir": str(tmp_path), "download": False})
    assert KnownClassCounts(cfg, simulation=True, num_nodes=lambda: 4).of([{"partition_id": 0}]) == {}


def test_mean_vacant_is_sample_weighted_like_the_replies_average():
    counts = {0: [3, 0, 0, 1], 1: [0, 2, 2, 2]}
    clients = [{"partition_id": 0, "num_examples": 4.0}, {"partition_id": 1, "num_examples": 6.0}]
    train = with_mean_vacant({"train-loss": 1.5}, clients, counts)
    assert train == {"num-vacant": pytest.approx((4 * 2 + 6 * 1) / 10), "train-loss": 1.5}
    assert list(train) == sorted(train)  # the order average_metrics gives
    # sent by the replies (share-class-counts) or not computable for every client: left as is
    assert with_mean_vacant({"num-vacant": 9.0}, clients, counts) == {"num-vacant": 9.0}
    assert with_mean_vacant({"train-loss": 1.0}, clients, {0: [1, 0]}) == {"train-loss": 1.0}
    assert with_mean_vacant({}, clients, counts) == {}


def test_mean_vacant_equals_the_average_of_what_replies_sent():
    """The server's figure in a simulation equals the one the replies' num-vacant averaged to."""
    cfg = parse_run_config(RUN)
    counts = partition_class_counts(cfg, 4)
    clients = [{"partition_id": p, "num_examples": float(sum(c))} for p, c in counts.items()]
    sent = np.array([c.count(0) for c in counts.values()], float)
    sizes = np.array([sum(c) for c in counts.values()], float)
    assert with_mean_vacant({"x": 0.0}, clients, counts)["num-vacant"] == pytest.approx(float(sent @ sizes / sizes.sum()))
