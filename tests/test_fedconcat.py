"""FedConcat checked against its authors' code (sjtudyq/FedConcat, experiments.py), each
value computed here independently of the app's code path: the clustering input (counts / n_i),
stage 1's per-cluster sample-weighted FedAvg, the new head over the concatenated frozen
encoders (3 SGD mini-batches with torch.optim.SGD, head only), stage 2's unweighted head
average; K = 1 in stage 1 is FedAvg; a run resumed in stage 1 or stage 2 equals a straight
run bit for bit; the run config's rules."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata
from torch import nn

from fedvls_flwr.algorithms.aggregation import Reply
from fedvls_flwr.algorithms.fedconcat import (
    ASSIGNMENT,
    HEAD_BIAS,
    HEAD_WEIGHT,
    FedConcat,
    cluster_sites,
    encoder_rounds,
)
from fedvls_flwr.algorithms.parts import ClientState, RunContext
from fedvls_flwr.algorithms.rounds import ClientOutcome, ClientRound, build_protocol
from fedvls_flwr.app.keys import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, PARTITION_ID, SERVER_ROUND, TRAIN_LOSS
from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.app.server import run_experiment
from fedvls_flwr.config.run_config import ConfigError, RunConfig, parse_run_config
from fedvls_flwr.models import FeatureTap, build_model, classifier_of
from tests.fake_grid import FakeGridBase

pytestmark = pytest.mark.usefixtures("run_identity")  # Flower's messages need a run identity


def protocol(**params) -> FedConcat:
    cfg = RunConfig(protocol="fedconcat", num_server_rounds=params.pop("rounds", 4), seed=3,
                    **{k.replace("-", "_"): v for k, v in params.items()})
    p = build_protocol(cfg.to_flower(), RunContext(cfg))
    assert isinstance(p, FedConcat)
    return p


def test_the_authors_split_of_rounds():
    # run.sh: 50 encoder rounds + 1000 classifier rounds; every stage at least one round
    assert encoder_rounds(1050, 0) == 50 and encoder_rounds(4, 0) == 1 and encoder_rounds(2, 0) == 1
    assert encoder_rounds(50, 0) == 2 and encoder_rounds(100, 7) == 7


def test_clustering_reads_label_distributions_not_counts():
    """The authors cluster counts / n_i: two sites with the same classes in the same
    proportions but 10x the data belong together."""
    p = protocol(fedconcat_clusters=2)
    stats = {0: [50, 50, 0, 0], 1: [500, 500, 0, 0], 2: [0, 0, 5, 5], 3: [0, 1, 30, 29]}
    model = {"w": np.zeros((2, 2), np.float32)}
    state = p.initial_state(model, {k: {"class-counts": v} for k, v in stats.items()})
    a = state[ASSIGNMENT]
    assert a[0] == a[1] and a[2] == a[3] and a[0] != a[2]
    np.testing.assert_allclose(p.site_distributions[3], np.array([0, 1, 30, 29]) / 60)
    # seeded: the same input gives the same labels; all clusters start from equal, separate copies
    again = cluster_sites(np.array([np.array(v) / sum(v) for v in stats.values()]), 2, seed=3)
    np.testing.assert_array_equal(again, a)
    assert state["cluster0/w"] is not state["cluster1/w"] and not np.shares_memory(state["cluster0/w"], model["w"])


def test_clustering_is_the_authors_kmeans_call():
    """experiments.py calls ``KMeans(n_clusters=K)`` on counts / n_i, whose defaults when it was
    written were k-means++ with 10 restarts (unseeded); the app seeds it. The reference is
    ``KMeans(n_clusters=K, init='k-means++', n_init=10, random_state=seed)`` written out here:
    the same clusters (up to their numbering) as the app's, on sites where one k-means++ start
    (scikit-learn's default 'auto' since 1.4) would give other clusters."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(0)
    counts = np.stack([rng.multinomial(int(rng.integers(50, 500)), rng.dirichlet([0.3] * 10)) for _ in range(20)])
    distributions = counts / counts.sum(axis=1, keepdims=True)
    one_start_differs = False
    for seed in range(4):
        cfg = RunConfig(protocol="fedconcat", num_server_rounds=4, seed=seed, fedconcat_clusters=4)
        state = build_protocol(cfg.to_flower(), RunContext(cfg)).initial_state(
            {"w": np.zeros((2, 2), np.float32)}, {i: {"class-counts": c.tolist()} for i, c in enumerate(counts)})
        ten = KMeans(n_clusters=4, init="k-means++", n_init=10, random_state=seed).fit(distributions).labels_
        one = KMeans(n_clusters=4, init="k-means++", n_init=1, random_state=seed).fit(distributions).labels_
        assert adjusted_rand_score(state[ASSIGNMENT], ten) == 1.0, f"seed {seed}"
        one_start_differs |= adjusted_rand_score(one, ten) < 1.0
    assert one_start_differs  # else this data could not tell 10 restarts from one


def reply(node, arrays, n):
    return Reply(str(node), {k: np.asarray(v, np.float32) for k, v in arrays.items()}, float(n), {})


def test_stage_one_is_sample_weighted_fedavg_inside_each_cluster():
    p = protocol(fedconcat_clusters=2, fedconcat_assignment="0,1,0", fedconcat_encoder_rounds=2)
    state = p.initial_state({"w": np.zeros(3, np.float32)}, {})
    plan = p.plan(1, state, {11: 0, 12: 1, 13: 2, 14: None})
    assert 14 not in plan  # unknown at the clustering: no part in stage 1
    assert plan[11].group == plan[13].group == "cluster0" and plan[12].group == "cluster1"
    new = p.aggregate(1, state, {"cluster0": [reply(11, {"w": [3, 0, 0]}, 1), reply(13, {"w": [0, 0, 1]}, 3)]})
    np.testing.assert_allclose(new["cluster0/w"], [0.75, 0, 0.75])  # (1*[3,0,0] + 3*[0,0,1]) / 4
    np.testing.assert_array_equal(new["cluster1/w"], np.zeros(3))  # no reply: unchanged


def mlp_state(seed):
    torch.manual_seed(seed)
    model = build_model("mlp", (1, 8, 8), 10)
    return model, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def test_end_of_stage_one_freezes_encoders_and_draws_a_new_head_or_concatenates_theirs():
    model, arrays = mlp_state(0)
    for init in ("random", "concat"):
        p = protocol(fedconcat_clusters=2, fedconcat_assignment="0,1", fedconcat_encoder_rounds=1,
                     fedconcat_head_init=init)
        p.bind_model(model)
        state = p.initial_state(arrays, {})
        state["cluster1/5.weight"] = state["cluster1/5.weight"] + 1.0  # tell the clusters apart
        new = p.aggregate(1, state, {})  # the last stage-1 round (no reply: models unchanged)
        assert not any(k.startswith("cluster") for k in new)
        np.testing.assert_array_equal(new["encoder1/5.weight"], state["cluster1/5.weight"])
        assert new[HEAD_WEIGHT].shape == (10, 400) and new[HEAD_BIAS].shape == (10,)
        if init == "concat":  # the authors' start for CIFAR-100: [W_0 | W_1], b_0 + b_1
            np.testing.assert_array_equal(new[HEAD_WEIGHT][:, :200], state["cluster0/5.weight"])
            np.testing.assert_array_equal(new[HEAD_WEIGHT][:, 200:], state["cluster1/5.weight"])
            np.testing.assert_allclose(new[HEAD_BIAS], state["cluster0/5.bias"] + state["cluster1/5.bias"])
        else:  # nn.Linear(400, 10)'s default init: uniform within 1/sqrt(400)
            assert np.abs(new[HEAD_WEIGHT]).max() <= 1 / 20 and np.abs(new[HEAD_BIAS]).max() <= 1 / 20
            again = p.aggregate(1, state, {})
            np.testing.assert_array_equal(again[HEAD_WEIGHT], new[HEAD_WEIGHT])  # seeded: resume draws it again


def test_stage_two_averages_heads_unweighted_and_sends_the_encoders_once():
    model, arrays = mlp_state(0)
    p = protocol(fedconcat_clusters=2, fedconcat_assignment="0,1", fedconcat_encoder_rounds=1)
    p.bind_model(model)
    state = p.aggregate(1, p.initial_state(arrays, {}), {})
    first = p.plan(2, state, {11: 0, 12: 1})
    assert any(k.startswith("encoder") for k in first[11].arrays) and set(first[11].reply_layout) == {HEAD_WEIGHT, HEAD_BIAS}
    w = state[HEAD_WEIGHT]
    replies = [reply(11, {HEAD_WEIGHT: w + 1, HEAD_BIAS: [1.0] * 10}, 5),
               reply(12, {HEAD_WEIGHT: w + 4, HEAD_BIAS: [4.0] * 10}, 500)]
    new = p.aggregate(2, state, {"head": replies})
    np.testing.assert_allclose(new[HEAD_WEIGHT], w + 2.5, rtol=1e-6)  # the sizes (5, 500) do not weigh
    np.testing.assert_allclose(new[HEAD_BIAS], np.full(10, 2.5))
    second = p.plan(3, new, {11: 0, 12: 1, 13: 7})
    assert set(second[11].arrays) == {HEAD_WEIGHT, HEAD_BIAS}  # already holds the encoders
    assert any(k.startswith("encoder") for k in second[13].arrays)  # a late node gets them
    p.forget_node(11)  # a node that failed may have lost its state: sent again
    assert any(k.startswith("encoder") for k in p.plan(4, new, {11: 0})[11].arrays)


class Data:
    def __init__(self, x, y, num_classes=10):
        self.x, self.y, self.num_classes, self.mean, self.std = x, y, num_classes, None, None


def client_step(cfg, arrays, stage, data, model_factory, seed) -> ClientOutcome:
    """The client's side of a FedConcat training message in ``stage``."""
    p = build_protocol(cfg.to_flower(), RunContext(cfg))
    return p.client_train(ClientRound(arrays=arrays, config={"fedconcat-stage": stage}, cfg=cfg, data=data,
                                      model_factory=model_factory, device=torch.device("cpu"),
                                      generator=torch.Generator().manual_seed(seed), state=ClientState()))


def test_client_head_training_matches_torch_sgd_on_concatenated_features():
    """The authors' train_net_classifier: SGD(classifier params, lr, momentum=rho, wd=reg),
    one shuffled pass cut after 3 mini-batches, CE of classifier(concat(encoder_k(x)))."""
    (m0, a0), (m1, a1) = mlp_state(1), mlp_state(2)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(150, 1, 8, 8, generator=g), torch.randint(0, 10, (150,), generator=g)
    head_w, head_b = torch.randn(10, 400, generator=g) * 0.05, torch.zeros(10)
    arrays = {**{f"encoder0/{k}": torch.from_numpy(v) for k, v in a0.items()},
              **{f"encoder1/{k}": torch.from_numpy(v) for k, v in a1.items()},
              HEAD_WEIGHT: head_w, HEAD_BIAS: head_b}
    cfg = RunConfig(protocol="fedconcat", batch_size=64, lr=0.05, momentum=0.9, weight_decay=1e-3, augment=False)
    outcome = client_step(cfg, arrays, 2, Data(x, y), lambda: build_model("mlp", (1, 8, 8), 10), 9)
    weights, result = outcome.weights, outcome.result
    # reference: features by hand (each encoder's input to its last Linear), torch.optim.SGD
    order = torch.randperm(150, generator=torch.Generator().manual_seed(9))
    head = nn.Linear(400, 10)
    head.load_state_dict({"weight": head_w.clone(), "bias": head_b.clone()})
    opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    for s in range(3):  # 150 samples: 64 + 64 + 22
        idx = order[s * 64:(s + 1) * 64]
        feats = torch.cat([m0[:-1](x[idx]), m1[:-1](x[idx])], 1).detach()
        opt.zero_grad()
        nn.functional.cross_entropy(head(feats), y[idx]).backward()
        opt.step()
    torch.testing.assert_close(weights[HEAD_WEIGHT], head.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights[HEAD_BIAS], head.bias.detach(), rtol=1e-5, atol=1e-6)
    assert result.steps == 3 and result.num_examples == 150
    assert outcome.model is None  # the head is not the run's architecture: nothing for local-eval
    # stage 1 is the ordinary local training of the cluster's whole model
    cluster = {k: torch.from_numpy(v) for k, v in a0.items()}
    stage1 = client_step(cfg.replace(method="fedavg", local_epochs=1), cluster, 1, Data(x, y),
                         lambda: build_model("mlp", (1, 8, 8), 10), 9)
    assert stage1.model is not None and set(stage1.weights) == set(a0) and stage1.result.steps == 3


@pytest.mark.parametrize("name, shape", [
    ("mlp", (1, 8, 8)), ("cnn", (1, 28, 28)), ("cnn", (3, 32, 32)), ("resnet32", (3, 32, 32)),
    ("resnet18", (3, 32, 32)), ("resnet18-imagenet", (3, 64, 64)), ("mobilenetv2", (3, 32, 32)),
], ids=["mlp", "cnn-mnist", "cnn-cifar", "resnet32", "resnet18", "resnet18-imagenet", "mobilenetv2"])
def test_every_model_with_an_encoder_and_a_head_concatenates(name, shape):
    """Stage 2 on each architecture: the concatenated model's logits are head(concat of each
    encoder's classifier input), computed here from two separately loaded models in eval mode
    (BatchNorm with its aggregated statistics); in train mode the encoders stay in eval mode, so
    a forward pass leaves their BatchNorm statistics alone; the client's head step runs."""
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    arrays = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    p = protocol(fedconcat_clusters=2, fedconcat_assignment="0,1", fedconcat_encoder_rounds=1)
    p.bind_model(model)
    state = p.initial_state(arrays, {})
    g = np.random.default_rng(1)
    for key in [k for k in state if k.startswith("cluster1/") and state[k].dtype.kind == "f"]:
        state[key] = state[key] + (0.05 * g.standard_normal(state[key].shape)).astype(state[key].dtype)
    state = p.aggregate(1, state, {})
    width = 2 * classifier_of(model).in_features
    assert state[HEAD_WEIGHT].shape == (10, width)
    x = torch.randn(6, *shape, generator=torch.Generator().manual_seed(2))
    concat = p.evaluation_model(state, model, 2)
    assert concat is not None
    concat.eval()
    features = []
    for k in (0, 1):
        encoder = build_model(name, shape, 10)
        prefix = f"encoder{k}/"
        encoder.load_state_dict({key[len(prefix):]: torch.from_numpy(np.asarray(v))
                                 for key, v in state.items() if key.startswith(prefix)})
        encoder.eval()
        tap = FeatureTap(encoder)
        with torch.no_grad():
            encoder(x)
        features.append(tap.features.flatten(1))
    expected = torch.cat(features, 1) @ torch.from_numpy(state[HEAD_WEIGHT]).T + torch.from_numpy(state[HEAD_BIAS])
    with torch.no_grad():
        torch.testing.assert_close(concat(x), expected, rtol=1e-4, atol=1e-5)
    frozen = {key: v.clone() for key, v in concat.encoders.state_dict().items()}
    concat.train()  # as a client trains the head: the encoders stay in eval mode
    assert not any(m.training for m in concat.encoders.modules()) and concat.head.training
    concat(x)
    for key, v in concat.encoders.state_dict().items():  # BatchNorm's running statistics included
        assert torch.equal(v, frozen[key]), key
    sent = {**{key: torch.from_numpy(np.asarray(v)).clone() for key, v in state.items() if key.startswith("encoder")},
            HEAD_WEIGHT: torch.from_numpy(state[HEAD_WEIGHT]).clone(), HEAD_BIAS: torch.from_numpy(state[HEAD_BIAS]).clone()}
    before = {HEAD_WEIGHT: sent[HEAD_WEIGHT].clone()}
    cfg = RunConfig(protocol="fedconcat", batch_size=4, lr=0.05, augment=False)
    y = torch.arange(12) % 10
    outcome = client_step(cfg, sent, 2, Data(torch.randn(12, *shape, generator=torch.Generator().manual_seed(3)), y),
                          lambda: build_model(name, shape, 10), 4)
    weights, result = outcome.weights, outcome.result
    assert set(weights) == {HEAD_WEIGHT, HEAD_BIAS} and result.steps == 3 and math.isfinite(result.loss)
    assert not torch.equal(weights[HEAD_WEIGHT], before[HEAD_WEIGHT])


def test_frozen_features_are_computed_once_and_give_the_recomputed_results():
    """Without augmentation a process computes the frozen encoders' features of a client's data
    and of each server test batch once: later head rounds and evaluations run no encoder,
    and give what recomputing the features per batch gives (the CNN's convolutions round
    differently in larger batches: float tolerance); changed data or new encoders recompute."""
    from fedvls_flwr.algorithms.fedconcat import _BUILT
    from fedvls_flwr.algorithms.training import evaluate

    torch.manual_seed(0)
    shape = (1, 28, 28)
    encoders = [build_model("cnn", shape, 10) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, *shape, generator=g), torch.randint(0, 10, (300,), generator=g)
    test_x, test_y = torch.randn(500, *shape, generator=g), torch.randint(0, 10, (500,), generator=g)
    head_w, head_b = torch.randn(10, 100, generator=g) * 0.05, torch.zeros(10)
    arrays = {**{f"encoder{k}/{n}": v.detach().clone() for k, e in enumerate(encoders)
                 for n, v in e.state_dict().items()}, HEAD_WEIGHT: head_w, HEAD_BIAS: head_b}
    cfg = RunConfig(protocol="fedconcat", batch_size=32, lr=0.05, augment=False, eval_batch_size=128)
    data = Data(x, y)
    calls = []
    first = client_step(cfg, arrays, 2, data, lambda: build_model("cnn", shape, 10), 5)
    concat = _BUILT.model
    assert concat is not None
    hooks = [e.register_forward_hook(lambda *a: calls.append(1)) for e in concat.encoders]
    again = client_step(cfg, arrays, 2, data, lambda: build_model("cnn", shape, 10), 5)
    assert _BUILT.model is concat and not calls  # the kept features: no encoder ran
    torch.testing.assert_close(again.weights[HEAD_WEIGHT], first.weights[HEAD_WEIGHT], rtol=0, atol=0)
    # against features recomputed on every mini-batch (the loop before the features were kept)
    order = torch.randperm(300, generator=torch.Generator().manual_seed(5))
    head = nn.Linear(100, 10)
    head.load_state_dict({"weight": head_w.clone(), "bias": head_b.clone()})
    sgd = torch.optim.SGD(head.parameters(), lr=0.05, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for s in range(3):
        idx = order[s * 32:(s + 1) * 32]
        sgd.zero_grad()
        nn.functional.cross_entropy(head(concat.features(x[idx])), y[idx]).backward()
        sgd.step()
    torch.testing.assert_close(first.weights[HEAD_WEIGHT], head.weight.detach(), rtol=1e-5, atol=1e-6)
    # the server's evaluation: twice the same test set, the second without an encoder forward
    calls.clear()
    kept = [evaluate(concat, test_x, test_y, 10, device=torch.device("cpu"), batch_size=128) for _ in range(2)]
    assert len(calls) == 2 * 4  # 4 batches, 2 encoders, the first time only

    class Recomputed(nn.Module):
        def forward(self, xb):
            return concat.head(concat.features(xb))

    fresh = evaluate(Recomputed(), test_x, test_y, 10, device=torch.device("cpu"), batch_size=128)
    for res in kept:
        assert res.accuracy == fresh.accuracy and res.loss == pytest.approx(fresh.loss, rel=1e-6)
    # data changed in place: its features are computed again
    calls.clear()
    x.add_(0.0)
    client_step(cfg, arrays, 2, data, lambda: build_model("cnn", shape, 10), 5)
    assert calls
    for hook in hooks:
        hook.remove()


def test_a_node_without_its_encoders_says_so():
    cfg = RunConfig(protocol="fedconcat")
    with pytest.raises(RuntimeError, match="frozen encoders"):
        client_step(cfg, {HEAD_WEIGHT: torch.zeros(10, 400), HEAD_BIAS: torch.zeros(10)}, 2,
                    Data(torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)), None, 0)


@pytest.mark.parametrize("changes, match", [
    ({"num-server-rounds": 1}, "num-server-rounds >= 2"),
    ({"num-server-rounds": 4, "fedconcat-encoder-rounds": 4}, "no round for stage 2"),
    ({"server-optimizer": "fedadam"}, "server-optimizer='fedavg'"),
    ({"evaluation": "federated"}, "server's test set"),
    ({"fedconcat-assignment": "0,2,1"}, r"cluster\(s\) \[2\]"),
    ({"fedconcat-assignment": "0;1"}, "comma-separated"),
    ({"fedconcat-clusters": 0}, "fedconcat-clusters"),
    ({"local-optimizer": "fedgf"}, "local-optimizer 'fedgf'"),
    ({"fedconcat-assignment": "0,0,0,0"}, r"no partition in cluster\(s\) \[1\] .* lower fedconcat-clusters"),
    ({"fedconcat-clusters": 3, "fedconcat-assignment": "0,2,0,2"}, r"cluster\(s\) \[1\]"),
    ({"model": "logreg"}, "model 'logreg' has none"),
    ({"dataset": "synthetic"}, "model 'logreg' has none"),  # synthetic's auto model
])
def test_run_config_rules(changes, match):
    with pytest.raises(ConfigError, match=match):
        parse_run_config({"protocol": "fedconcat", **changes})


@pytest.mark.parametrize("changes, nodes, match", [
    ({"fedconcat-clusters": 8}, 4, "needs at least 8 sites for K-means, and the federation has 4 node"),
    ({"fedconcat-assignment": "0,1"}, 4, r"clusters of 2 partition\(s\), and the federation has 4 node"),
    ({"fedconcat-assignment": "0,1,0,1,0,1"}, 4, r"clusters of 6 partition\(s\).* \(4 numbers\)"),
    ({"fedconcat-clusters": 8, "fedconcat-assignment": "0,1,2,3,4,5,6,7"}, 8, None),  # as many sites as clusters
    ({"fedconcat-clusters": 4}, 4, None),
])
def test_federation_rules(changes, nodes, match):
    """What FedConcat needs of the number of nodes, said by ``fedvls check --num-supernodes``
    (and a sweep's federation) before anything runs."""
    from fedvls_flwr.experiments.check import check_run_config

    config = {"protocol": "fedconcat", "num-server-rounds": 4, **changes}
    if match is None:
        check_run_config(config, num_supernodes=nodes, data=False)
    else:
        with pytest.raises(ConfigError, match=match):
            check_run_config(config, num_supernodes=nodes, data=False)


# ---- the whole server: K = 1 is FedAvg, resume in either stage equals a straight run ----------
class ConcatGrid(FakeGridBase):
    """Deterministic clients: the received weights moved by a function of (node, round); stage 2
    replies the head only; queries answer the node's partition (node - 11)."""

    def __init__(self, nodes=(11, 12, 13, 14), stop_at=None):
        super().__init__(nodes)
        self.stop_at = stop_at

    def answer(self, messages):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            config = msg.content[CONFIG]
            server_round = int(config[SERVER_ROUND])
            if self.stop_at is not None and server_round >= self.stop_at:
                raise KeyboardInterrupt("server killed")
            metrics = {PARTITION_ID: node - 11}
            content = RecordDict()
            if msg.metadata.message_type == "train":
                rng = np.random.default_rng([node, server_round])
                sent = {k: a.numpy() for k, a in msg.content[ARRAYS].items() if not k.startswith("encoder")}
                content[ARRAYS] = ArrayRecord({k: Array(np.require(
                    v + (0.05 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v,
                    requirements="C")) for k, v in sent.items()})
                metrics.update({NUM_EXAMPLES: 10 + node, TRAIN_LOSS: float(server_round)})
            content[METRICS] = MetricRecord(metrics)
            meta = Metadata(run_id=1, message_id=f"r{node}-{server_round}", src_node_id=node, dst_node_id=0,
                            reply_to_message_id="x", group_id="1", created_at=time.time(), ttl=60.0,
                            message_type=msg.metadata.message_type)
            replies.append(Message(content, metadata=meta))
        return replies


def concat_config(out, **changes):
    settings = dict(dataset="digits", num_server_rounds=5, output_dir=str(out), run_name="r", protocol="fedconcat",
                    fedconcat_clusters=2, fedconcat_assignment="0,1,0,1", fedconcat_encoder_rounds=2,
                    deterministic=True, round_retries=0)
    return RunConfig(**{**settings, **changes})


def history(run_dir):
    return [(r["round"], r.get("stage"), r["accuracy"], r["loss"]) for r in read_rounds(run_dir)]


def test_k_equal_one_stage_one_is_fedavg(tmp_path):
    fedavg = run_experiment(ConcatGrid(), RunConfig(dataset="digits", num_server_rounds=2, output_dir=str(tmp_path),
                                                    run_name="avg", deterministic=True, method="fedavg"))
    concat = run_experiment(ConcatGrid(), concat_config(tmp_path, run_name="k1", fedconcat_clusters=1,
                                                        fedconcat_assignment="0,0,0,0", num_server_rounds=3,
                                                        method="fedavg"))
    from fedvls_flwr.app.results import CHECKPOINT_FILE, load_arrays, load_checkpoint
    done, ref = load_checkpoint(fedavg / CHECKPOINT_FILE)  # the global model after FedAvg's round 2, read whole
    assert done == 2
    got = load_arrays(concat / "model_final.npz")  # its encoder 0 = cluster 0 after stage 1's 2 rounds
    model_keys = [k for k in ref if not k.startswith("__")]
    assert model_keys
    for key in model_keys:
        np.testing.assert_array_equal(got[f"encoder0/{key}"], ref[key])


@pytest.mark.parametrize("stop_at", [2, 4])  # killed in stage 1 (round 2), in stage 2 (round 4)
def test_resumed_in_either_stage_equals_a_straight_run(tmp_path, stop_at, monkeypatch):
    from fedvls_flwr.app import results

    monkeypatch.setattr(results, "FROZEN_MIN_BYTES", 0)  # digits' small encoders too go to the frozen file
    straight = run_experiment(ConcatGrid(), concat_config(tmp_path / "a"))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(ConcatGrid(stop_at=stop_at), concat_config(tmp_path / "b"))
    if stop_at == 4:  # round 3's checkpoint takes the encoders, unchanged since round 2, from the frozen file
        names = results.load_arrays(tmp_path / "b" / "r" / results.CHECKPOINT_FILE)[results.CHECKPOINT_FROZEN_KEYS]
        assert any(str(name).startswith("encoder1/") for name in names.tolist())
        assert len(list((tmp_path / "b" / "r").glob(f"{results.FROZEN_FILE_PREFIX}*.npz"))) == 1
    resumed = run_experiment(ConcatGrid(), concat_config(tmp_path / "b", resume=True))
    assert history(resumed) == history(straight)
    final, again = results.load_arrays(straight / results.MODEL_FILE), results.load_arrays(resumed / results.MODEL_FILE)
    assert final.keys() == again.keys() and all(np.array_equal(final[k], again[k]) for k in final)
    assert [h[1] for h in history(straight)] == [1, 1, 1, 2, 2, 2]
    assert all(h[2] is None for h in history(straight)[:3]) and all(h[2] is not None for h in history(straight)[3:])
    about = json.loads((straight / "protocol.json").read_text())
    assert about["assignment"] == {"0": 0, "1": 1, "2": 0, "3": 1} and about["classifier_rounds"] == 3
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["stages"]["1"]["rounds"] == 2 and summary["stages"]["2"]["rounds"] == 3


def test_a_run_resumed_with_other_num_server_rounds_keeps_its_stage_boundary(tmp_path):
    """num-server-rounds may change on resume; FedConcat's stage 1 keeps the length it started
    with (the 1 : 20 split of 21 rounds is 1, of 42 it would be 2): the extra rounds are head
    rounds, and the history up to the stop (after round 1, where the two splits differ) equals a
    straight 21-round run's. Fewer rounds than stage 1 has are refused with the fix."""
    split = dict(fedconcat_encoder_rounds=0, num_server_rounds=21)
    straight = run_experiment(ConcatGrid(), concat_config(tmp_path / "a", **split))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(ConcatGrid(stop_at=2), concat_config(tmp_path / "b", **split))
    resumed = run_experiment(ConcatGrid(), concat_config(tmp_path / "b", resume=True, fedconcat_encoder_rounds=0,
                                                         num_server_rounds=42))
    stages = [h[1] for h in history(resumed)]
    assert stages == [1, 1] + [2] * 41  # round 0, round 1 (stage 1), rounds 2-42 (stage 2)
    assert history(resumed)[:2] == history(straight)[:2]
    summary = json.loads((resumed / "summary.json").read_text())
    assert (summary["stages"]["1"]["rounds"], summary["stages"]["2"]["rounds"]) == (1, 41)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(ConcatGrid(stop_at=3), concat_config(tmp_path / "c", fedconcat_encoder_rounds=2))
    with pytest.raises(ConfigError, match=r"stage 1 has 2 rounds .* num-server-rounds = 2 leaves no round for "
                                          r"stage 2; resume with num-server-rounds > 2"):
        run_experiment(ConcatGrid(), concat_config(tmp_path / "c", resume=True, fedconcat_encoder_rounds=2,
                                                   num_server_rounds=2))


def test_tables_tell_the_cluster_counts_apart():
    from fedvls_flwr.config.registry import combination_label
    assert combination_label({"method": "fedavg", "protocol": "fedconcat", "fedconcat-clusters": 4}) == "FedConcat K=4"
    assert combination_label({"method": "fedavg", "protocol": "fedconcat"}) == "FedConcat K=2"
    assert combination_label({"method": "fedvls", "protocol": "fedconcat"}) == "FedVLS + FedConcat K=2"
    assert combination_label({"method": "fedavg", "fedconcat-clusters": 4}) == "FedAvg"  # read by FedConcat only


def test_the_encoder_digest_tells_equal_encoders_from_different_ones_and_the_kept_model_follows_it():
    """A node keeps its encoders' digest beside them; the process's concatenated model is reused
    for the same digest (no tensor comparison) and rebuilt for encoders that differ in one bit."""
    from fedvls_flwr.algorithms.fedconcat import _BuiltConcat, encoder_digest

    torch.manual_seed(0)
    shape = (1, 8, 8)
    model = build_model("mlp", shape, 10)
    encoders = {k: {n: v.detach().clone() for n, v in model.state_dict().items()} for k in range(2)}
    flat = {f"encoder{k}/{n}": v for k, e in encoders.items() for n, v in e.items()}
    same = {k: v.clone() for k, v in flat.items()}
    flipped = {k: v.clone() for k, v in flat.items()}
    first = next(iter(flipped))
    flipped[first].view(-1)[0] = torch.nextafter(flipped[first].view(-1)[0], torch.tensor(1e9))
    assert encoder_digest(flat) == encoder_digest(same)
    assert encoder_digest(flat) != encoder_digest(flipped)
    assert encoder_digest(flat) != encoder_digest({k.replace("encoder0", "encoder9"): v for k, v in flat.items()})

    width = classifier_of(model).in_features * 2
    head = {"weight": torch.zeros(10, width), "bias": torch.zeros(10)}
    built = _BuiltConcat()
    a = built.get(lambda: model, encoders, head, None, digest=encoder_digest(flat))
    b = built.get(lambda: model, encoders, {"weight": torch.ones(10, width), "bias": torch.zeros(10)}, None,
                  digest=encoder_digest(same))
    assert b is a and torch.equal(b.head.weight, torch.ones(10, width))  # reused, the new head loaded
    other = {0: encoders[0], 1: {n: v + 1 for n, v in encoders[1].items()}}
    c = built.get(lambda: model, other, head, None, digest=encoder_digest(
        {f"encoder{k}/{n}": v for k, e in other.items() for n, v in e.items()}))
    assert c is not a and torch.equal(c.encoders[1].state_dict()[next(iter(encoders[1]))],
                                      next(iter(encoders[1].values())) + 1)
    # no digest (the server's evaluation): compared tensor for tensor
    assert built.get(lambda: model, other, head, None) is c
    assert built.get(lambda: model, encoders, head, None) is not c


def test_a_kept_models_head_is_loaded_as_load_state_dict_loads_it():
    """The reused model's head takes the received tensors as ``load_state_dict`` would (the same
    values, float64 converted to the head's float32); a head of another shape, or with keys of
    its own, is refused by ``load_state_dict`` with its own message."""
    from torch import nn

    from fedvls_flwr.algorithms.fedconcat import _load_head

    torch.manual_seed(0)
    fast, reference = nn.Linear(6, 3), nn.Linear(6, 3)
    head = {"weight": torch.randn(3, 6, dtype=torch.float64), "bias": torch.randn(3, dtype=torch.float64)}
    _load_head(fast, head)
    reference.load_state_dict(head)
    for name in ("weight", "bias"):
        got, want = getattr(fast, name), getattr(reference, name)
        assert got.dtype == torch.float32 and torch.equal(got, want)
        assert isinstance(got, nn.Parameter) and got.requires_grad  # still the module's parameter
    with pytest.raises(RuntimeError, match="size mismatch"):
        _load_head(fast, {"weight": torch.zeros(3, 7), "bias": torch.zeros(3)})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        _load_head(fast, {**head, "extra": torch.zeros(1)})
