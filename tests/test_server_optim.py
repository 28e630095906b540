"""Server optimizers against straightforward references over several rounds; their state
survives a checkpoint; integer buffers and dtypes are kept."""

import numpy as np
import pytest

from fedvls_flwr.algorithms.aggregation import Reply, weighted_average
from fedvls_flwr.algorithms.parts import RunContext
from fedvls_flwr.algorithms.server_optim import ServerOptimizer, build_server_optimizer
from fedvls_flwr.config.registry import get_part
from fedvls_flwr.config.run_config import RunConfig


def server_optimizer(values) -> ServerOptimizer:
    """The server optimizer ``values`` selects, with its settings there."""
    return build_server_optimizer(values, RunContext(RunConfig()))

RNG = np.random.default_rng(0)


def rounds_of_replies(num_rounds=3, clients=3, dtype=np.float64):
    """Per round: client models near the current global, with sizes 10, 20, 30."""
    out = []
    for _ in range(num_rounds):
        out.append([(RNG.normal(size=(2, 3)).astype(dtype), RNG.normal(size=4).astype(dtype), 10 * (i + 1))
                    for i in range(clients)])
    return out


def run(name, plan, overrides=None, dtype=np.float64, split_at=None):
    """Drive optimizer ``name`` through ``plan``; returns the global models after every round.
    ``split_at``: save the state after that round and continue in a fresh optimizer."""
    settings = {**get_part("server-optimizer", name).defaults(), **(overrides or {})}
    opt = server_optimizer({**settings, "server-optimizer": name})
    w = {"a": np.zeros((2, 3), dtype), "b": np.zeros(4, dtype), "n": np.array(0, np.int64)}
    history = []
    for t, clients in enumerate(plan, start=1):
        replies = [Reply(str(i), {"a": w["a"] + a, "b": w["b"] + b, "n": np.array(t * 5, np.int64)}, n, {})
                   for i, (a, b, n) in enumerate(clients)]
        avg = weighted_average(replies, w)
        w = opt.step(t, w, avg, replies)
        history.append(w)
        if split_at == t:
            state = {k: v.copy() for k, v in opt.state().items()}
            opt = server_optimizer({**settings, "server-optimizer": name})
            opt.load_state(state)
    return history


def ref(name, plan, p):
    """The optimizers' updates written out: d = average - w (the pseudo-gradient's negative)."""
    w = {"a": np.zeros((2, 3)), "b": np.zeros(4)}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    mom = None
    out = []
    for t, clients in enumerate(plan, start=1):
        total = sum(n for *_, n in clients)
        d = {"a": sum(n / total * a for a, _, n in clients), "b": sum(n / total * b for _, b, n in clients)}
        if name == "fedavgm":
            pg = {k: -d[k] for k in d}
            mom = pg if mom is None or p["fedavgm-momentum"] == 0 else {k: p["fedavgm-momentum"] * mom[k] + pg[k] for k in d}
            w = {k: w[k] - p["fedavgm-lr"] * mom[k] for k in w}
        elif name == "fedexp":
            num = sum(n / total * (np.sum(a * a) + np.sum(b * b)) for a, b, n in clients)
            den = 2 * (np.sum(d["a"] ** 2) + np.sum(d["b"] ** 2) + p["fedexp-eps"])
            eta = max(1.0, num / den)
            w = {k: w[k] + eta * d[k] for k in w}
        else:
            b1 = 0.0 if name == "fedadagrad" else p[f"{name}-beta1"]
            m = {k: b1 * m[k] + (1 - b1) * d[k] for k in d}
            if name == "fedadam":
                b2 = p["fedadam-beta2"]
                v = {k: b2 * v[k] + (1 - b2) * d[k] ** 2 for k in d}
                eta = p["fedadam-eta"] * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            elif name == "fedyogi":
                b2 = p["fedyogi-beta2"]
                v = {k: v[k] - (1 - b2) * d[k] ** 2 * np.sign(v[k] - d[k] ** 2) for k in d}
                eta = p["fedyogi-eta"]
            else:
                v = {k: v[k] + d[k] ** 2 for k in d}
                eta = p["fedadagrad-eta"]
            w = {k: w[k] + eta * m[k] / (np.sqrt(v[k]) + p[f"{name}-tau"]) for k in w}
        out.append(w)
    return out


CASES = [
    ("fedavgm", {"fedavgm-momentum": 0.9, "fedavgm-lr": 0.7}),
    ("fedavgm", {}),  # Flower's defaults: plain averaging
    ("fedadam", {}),
    ("fedyogi", {}),
    ("fedadagrad", {}),
    ("fedexp", {}),
    ("fedexp", {"fedexp-eps": 1e3}),  # step size clipped at 1
]


@pytest.mark.parametrize("name, overrides", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_server_optimizer_matches_reference_over_three_rounds(name, overrides):
    plan = rounds_of_replies()
    settings = {**get_part("server-optimizer", name).defaults(), **overrides}
    got = run(name, plan, overrides)
    want = ref(name, plan, settings)
    for t, (g, r) in enumerate(zip(got, want), start=1):
        for k in ("a", "b"):
            np.testing.assert_allclose(g[k], r[k], rtol=1e-10, atol=1e-12, err_msg=f"{name} round {t} {k}")
        assert g["n"].shape == () and g["n"].dtype == np.int64 and int(g["n"]) == t * 5


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedexp"])
def test_state_survives_a_checkpoint(name):
    plan = rounds_of_replies(4)
    overrides = {"fedavgm-momentum": 0.5} if name == "fedavgm" else {}
    straight = run(name, plan, overrides)
    resumed = run(name, plan, overrides, split_at=2)
    for g, r in zip(straight, resumed):
        for k in g:
            np.testing.assert_array_equal(g[k], r[k])


@pytest.mark.parametrize("name", ["fedadam", "fedexp", "fedavgm"])
def test_float32_models_stay_float32(name):
    got = run(name, rounds_of_replies(2, dtype=np.float32), {"fedavgm-momentum": 0.9}, dtype=np.float32)
    assert all(w[k].dtype == np.float32 for w in got for k in ("a", "b"))


def test_fedexp_evaluates_the_average_of_the_last_two_models():
    opt = server_optimizer({"server-optimizer": "fedexp", "fedexp-eps": 0.01, "fedexp-eval": "average-last-two"})
    w0 = {"a": np.zeros(3), "n": np.array(0, np.int64)}
    replies = [Reply("0", {"a": np.array([1.0, -1.0, 0.0]), "n": np.array(1, np.int64)}, 1, {}),
               Reply("1", {"a": np.array([-1.0, 1.0, 0.2]), "n": np.array(1, np.int64)}, 1, {})]
    w1 = opt.step(1, w0, weighted_average(replies, w0), replies)
    np.testing.assert_allclose(opt.evaluation_arrays(w1)["a"], (w1["a"] + w0["a"]) / 2)
    # nearly opposing updates: sum ||d_i||^2 = 4.04, ||d_bar||^2 = 0.01 -> eta = 4.04 / (4 * 0.02)
    assert opt.last_step_size == pytest.approx(50.5)
    np.testing.assert_allclose(w1["a"], 50.5 * np.array([0.0, 0.0, 0.1]))
    last = server_optimizer({"server-optimizer": "fedexp", "fedexp-eps": 0.01, "fedexp-eval": "last"})
    assert last.evaluation_arrays(w1) is w1


# Our keys -> the keyword arguments of Flower's strategies of the same name.
FLOWER_KWARGS = {
    "fedavgm": {"fedavgm-lr": "server_learning_rate", "fedavgm-momentum": "server_momentum"},
    "fedadam": {"fedadam-eta": "eta", "fedadam-beta1": "beta_1", "fedadam-beta2": "beta_2", "fedadam-tau": "tau"},
    "fedyogi": {"fedyogi-eta": "eta", "fedyogi-beta1": "beta_1", "fedyogi-beta2": "beta_2", "fedyogi-tau": "tau"},
    "fedadagrad": {"fedadagrad-eta": "eta", "fedadagrad-tau": "tau"},
}


def flower_step(strategy, name, server_round, global_arrays, average):
    """Flower's own strategy applied to ``average``: one reply that carries it (weight 1)."""
    import time

    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.app.metadata import Metadata

    current = {k: v for k, v in global_arrays.items() if v.dtype.kind == "f"}
    strategy.current_arrays = ArrayRecord({k: Array(v) for k, v in current.items()}) if name == "fedavgm" else current
    content = RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(average[k])) for k in current}),
                          "metrics": MetricRecord({"num-examples": 1})})
    metadata = Metadata(run_id=0, message_id="average", src_node_id=0, dst_node_id=0, reply_to_message_id="",
                        group_id=str(server_round), created_at=time.time(), ttl=1.0, message_type="train")
    record, _ = strategy.aggregate_train(server_round, [Message(content, metadata=metadata)])
    return {k: record[k].numpy() for k in current}


@pytest.mark.parametrize("name, overrides", [c for c in CASES if c[0] in FLOWER_KWARGS],
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES) if n in FLOWER_KWARGS])
def test_server_optimizers_match_flowers_own_bit_for_bit(name, overrides):
    """Our numpy server optimizers against Flower 1.41's strategies, float32, four rounds."""
    import flwr.serverapp.strategy as flower

    settings = {**get_part("server-optimizer", name).defaults(), **overrides}
    cls = {"fedavgm": flower.FedAvgM, "fedadam": flower.FedAdam, "fedyogi": flower.FedYogi,
           "fedadagrad": flower.FedAdagrad}[name]
    theirs = cls(**{flwr_key: settings[key] for key, flwr_key in FLOWER_KWARGS[name].items()})
    ours = server_optimizer({**settings, "server-optimizer": name})
    w = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)}
    for t, clients in enumerate(rounds_of_replies(4, dtype=np.float32), start=1):
        replies = [Reply(str(i), {"a": w["a"] + a, "b": w["b"] + b}, n, {}) for i, (a, b, n) in enumerate(clients)]
        avg = weighted_average(replies, w)
        want = flower_step(theirs, name, t, w, avg)
        w = ours.step(t, w, avg, replies)
        for k in want:
            np.testing.assert_array_equal(w[k], want[k].astype(np.float32), err_msg=f"{name} round {t} {k}")
