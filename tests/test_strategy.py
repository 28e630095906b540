"""The Flower strategy with real Message objects and a fake Grid (no Flower processes)."""

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata

from fedvls_flwr.app.keys import ARRAYS as ARRAYS_KEY
from fedvls_flwr.app.keys import CONFIG as CONFIG_KEY
from fedvls_flwr.app.keys import METRICS as METRICS_KEY
from fedvls_flwr.app.messages import to_numpy_dict
from fedvls_flwr.app.strategy import RoundFailedError, RunStrategy
from fedvls_flwr.config.run_config import RunConfig
from tests.fake_grid import FakeGridBase

GLOBAL = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)}


pytestmark = pytest.mark.usefixtures("run_identity")  # Flower's messages need a run identity


def reply(node: int, arrays: dict | None = None, num_examples: float = 10, error: str | None = None, **metrics):
    meta = Metadata(
        run_id=1, message_id=f"m{node}", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
        group_id="1", created_at=time.time(), ttl=60.0, message_type="train",
    )
    if error is not None:
        return Message(Error(code=1, reason=error), metadata=meta)
    content = RecordDict({METRICS_KEY: MetricRecord({"num-examples": num_examples, **metrics})})
    if arrays is not None:
        content[ARRAYS_KEY] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
    return Message(content, metadata=meta)


def arrays(value: float) -> dict:
    return {k: np.full_like(v, value) for k, v in GLOBAL.items()}


def test_weighted_average_over_accepted_replies_malformed_and_nan_rejected():
    strategy = RunStrategy(RunConfig())
    strategy.report.sampled = 5
    replies = [
        reply(1, arrays(1.0), 10, **{"train-loss": 1.0}),
        reply(2, arrays(4.0), 30, **{"train-loss": 2.0}),
        reply(3, {"w": np.ones((2, 3), np.float32), "b": np.ones(2, np.float32)}, 50),  # wrong shape
        reply(4, {**arrays(1.0), "w": np.full((2, 2), np.nan, np.float32)}, 50),       # NaN
        reply(5, error="client raised"),
    ]
    new, metrics = strategy.aggregate_train(1, replies, GLOBAL)
    out = to_numpy_dict(new)
    np.testing.assert_allclose(out["w"], np.full((2, 2), 0.25 * 1 + 0.75 * 4), rtol=1e-6)
    assert metrics["train-loss"] == pytest.approx(0.25 * 1 + 0.75 * 2)
    assert strategy.report.accepted == 2
    assert len(strategy.report.rejected) == 2 and len(strategy.report.failed) == 1
    assert "shape" in strategy.report.rejected[0]["reason"]
    assert "NaN" in strategy.report.rejected[1]["reason"]
    assert strategy.report.drift_diversity == pytest.approx((1 * 6 + 16 * 6) / (25 * 6))


def test_a_reply_whose_array_cannot_be_read_is_rejected_and_the_round_goes_on():
    strategy = RunStrategy(RunConfig())
    strategy.report.sampled = 2
    broken = reply(2, arrays(3.0), 10)
    broken.content[ARRAYS_KEY]["w"] = Array(dtype="float32", shape=(2, 2), stype="numpy.ndarray", data=b"not npy")
    new, _ = strategy.aggregate_train(1, [reply(1, arrays(1.0), 10), broken], GLOBAL)
    np.testing.assert_array_equal(to_numpy_dict(new)["w"], np.ones((2, 2), np.float32))
    assert strategy.report.accepted == 1 and len(strategy.report.rejected) == 1
    assert "holds an array that cannot be read" in strategy.report.rejected[0]["reason"]


def test_aggregation_reads_the_replies_without_changing_them():
    """The server reads each reply's arrays in place (no copy of a 45 MB model per reply): the
    replies hold afterwards exactly the bytes they came with, and the average is theirs."""
    strategy = RunStrategy(RunConfig())
    strategy.report.sampled = 3
    replies = [reply(n, arrays(float(n)), 10 * n) for n in (1, 2, 3)]
    sent = [{k: a.data for k, a in r.content[ARRAYS_KEY].items()} for r in replies]
    new, _ = strategy.aggregate_train(1, replies, GLOBAL)
    assert [{k: a.data for k, a in r.content[ARRAYS_KEY].items()} for r in replies] == sent
    np.testing.assert_array_equal(to_numpy_dict(new)["w"], np.full((2, 2), (10 + 40 + 90) / 60, np.float32))


class FakeGrid(FakeGridBase):
    """Answers train messages with ``respond(node, attempt)``; counts calls."""

    def __init__(self, nodes, respond):
        super().__init__(nodes)
        self.respond, self.calls, self.sent = respond, 0, []

    def answer(self, messages):
        self.calls += 1
        self.sent.append(messages)
        return [r for m in messages if (r := self.respond(m.metadata.dst_node_id, self.calls)) is not None]


def good(node, attempt):
    return reply(node, arrays(float(node)), 10, **{"train-loss": 0.5})


def initial():
    return ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})


def test_round_config_carries_round_and_hyperparameters():
    cfg = RunConfig(method="fedntd", lr=0.05, num_server_rounds=2)
    grid = FakeGrid([11, 12], good)
    seen = []
    RunStrategy(cfg).run(grid, initial(), on_round_end=lambda r, a, rep: seen.append(r))
    assert seen == [1, 2]
    config = grid.sent[1][0].content[CONFIG_KEY]
    assert config["server-round"] == 2 and config["method"] == "fedntd" and config["lr"] == 0.05


def test_seeded_partial_participation():
    nodes = list(range(100, 110))
    a = RunStrategy(RunConfig(fraction_train=0.3, seed=1))
    b = RunStrategy(RunConfig(fraction_train=0.3, seed=1))
    c = RunStrategy(RunConfig(fraction_train=0.3, seed=2))
    assert len(a.sample(nodes, 1)) == 3
    assert a.sample(nodes, 1) == b.sample(nodes, 1) == b.sample(list(reversed(nodes)), 1)
    assert a.sample(nodes, 1) != a.sample(nodes, 2) or a.sample(nodes, 1) != c.sample(nodes, 1)


def test_failing_client_is_dropped_and_the_round_completes():
    def respond(node, attempt):
        return reply(node, error="ValueError: boom") if node == 12 else good(node, attempt)

    reports = []
    cfg = RunConfig(num_server_rounds=1, min_fit_fraction=0.5)
    final = RunStrategy(cfg).run(FakeGrid([11, 12, 13], respond), initial(), on_round_end=lambda r, a, rep: reports.append(rep))
    assert reports[0].accepted == 2 and len(reports[0].failed) == 1 and reports[0].attempts == 1
    np.testing.assert_allclose(to_numpy_dict(final)["w"], np.full((2, 2), 12.0))


@pytest.mark.parametrize(("fraction", "sampled", "needed"),
                         [(0.5, 3, 2), (0.75, 4, 3), (0.3, 10, 3), (1.0, 4, 4), (0.0, 5, 1), (0.5, 1, 1)])
def test_min_replies_is_the_ceiling_of_the_fraction_and_at_least_one(fraction, sampled, needed):
    assert RunStrategy(RunConfig(min_fit_fraction=fraction)).min_replies(sampled) == needed


def test_some_usable_replies_but_fewer_than_min_fit_fraction_are_not_a_round():
    """4 sampled, min-fit-fraction 0.75: 3 usable replies make a round, 2 do not (re-run,
    then the run stops), although the 2 alone could be averaged."""
    def two_fail_first(node, attempt):
        return reply(node, error="ValueError: boom") if attempt == 1 and node in (13, 14) else good(node, attempt)

    reports = []
    cfg = RunConfig(num_server_rounds=1, min_fit_fraction=0.75, round_retries=1, round_timeout=0.2)
    final = RunStrategy(cfg).run(FakeGrid([11, 12, 13, 14], two_fail_first), initial(),
                                   on_round_end=lambda r, a, rep: reports.append(rep))
    assert reports[0].attempts == 2 and reports[0].accepted == 4
    np.testing.assert_allclose(to_numpy_dict(final)["w"], np.full((2, 2), 12.5))  # the second attempt's average

    def one_fails(node, attempt):
        return reply(node, error="ValueError: boom") if node == 14 else good(node, attempt)

    reports.clear()
    final = RunStrategy(cfg).run(FakeGrid([11, 12, 13, 14], one_fails), initial(),
                                   on_round_end=lambda r, a, rep: reports.append(rep))
    assert reports[0].attempts == 1 and reports[0].accepted == 3  # exactly the 3 needed
    np.testing.assert_allclose(to_numpy_dict(final)["w"], np.full((2, 2), 12.0))

    def two_always_fail(node, attempt):
        return reply(node, error="ValueError: boom") if node in (13, 14) else good(node, attempt)

    grid = FakeGrid([11, 12, 13, 14], two_always_fail)
    with pytest.raises(RoundFailedError, match=r"round 1 failed 2 time\(s\): fewer than min-fit-fraction = 0.75"):
        RunStrategy(cfg).run(grid, initial(), on_round_end=lambda *a: None)
    assert grid.calls == 2


def test_too_few_replies_retries_then_stops_with_a_clear_error():
    def respond(node, attempt):
        return good(node, attempt) if attempt >= 2 else None  # first attempt: everybody silent

    reports = []
    cfg = RunConfig(num_server_rounds=1, min_fit_fraction=1.0, round_retries=1, round_timeout=0.2)
    RunStrategy(cfg).run(FakeGrid([11, 12], respond), initial(), on_round_end=lambda r, a, rep: reports.append(rep))
    assert reports[0].attempts == 2 and reports[0].accepted == 2 and len(reports[0].failed) == 2

    never = FakeGrid([11, 12], lambda n, a: None)
    with pytest.raises(RoundFailedError, match="min-fit-fraction"):
        RunStrategy(RunConfig(num_server_rounds=1, round_retries=2, round_timeout=0.2)).run(
            never, initial(), on_round_end=lambda *a: None)
    assert never.calls == 3


def test_min_nodes_is_a_start_condition_not_a_per_round_one():
    """A node that dies after round 1 must not stall the run: later rounds go on with
    the nodes still connected (min-nodes is only waited for before the first round)."""
    grid = FakeGrid([11, 12, 13], good)
    sampled = []

    def on_round_end(server_round, arrays, report):
        sampled.append(report.sampled)
        if server_round == 1:
            grid.nodes.remove(13)  # node 13 vanished

    cfg = RunConfig(num_server_rounds=3, min_nodes=3)
    RunStrategy(cfg).run(grid, initial(), on_round_end=on_round_end)
    assert sampled == [3, 2, 2]


def test_a_federation_with_no_node_left_stops_after_round_timeout():
    grid = FakeGrid([11], good)
    strategy = RunStrategy(RunConfig(num_server_rounds=2, min_nodes=1, round_timeout=1.0))
    with pytest.raises(RoundFailedError, match="no node has been connected"):
        strategy.run(grid, initial(), on_round_end=lambda r, a, rep: grid.nodes.clear())


def test_nan_reply_keeps_the_global_model_finite():
    def respond(node, attempt):
        bad = {k: np.full_like(v, np.nan) for k, v in GLOBAL.items()}
        return reply(node, bad if node == 11 else arrays(2.0), 10)

    final = RunStrategy(RunConfig(num_server_rounds=1)).run(
        FakeGrid([11, 12], respond), initial(), on_round_end=lambda *a: None
    )
    assert all(np.isfinite(v).all() for v in to_numpy_dict(final).values())


def test_failure_reason_is_the_clients_own_message():
    from fedvls_flwr.app.messages import short_reason

    wrapped = "<class 'RayTaskError'>:<'Traceback ...\nException ClientAppException occurred. Message: disk full'>"
    assert short_reason(wrapped) == "disk full"
    deployed = "<class 'fedvls_flwr.data.errors.DatasetNotFoundError'>:<'[partition 1] folder dataset: bad'>"
    assert short_reason(deployed) == "[partition 1] folder dataset: bad"  # a deployment's ClientApp
    assert short_reason("x" * 1000).endswith("...") and len(short_reason("x" * 1000)) == 603


def test_federated_evaluation_pools_per_class_counts():
    from fedvls_flwr.app.federation import pool_evaluations

    a = {"num-examples": 4, "loss-sum": 4.0, "correct-per-class": [2, 1, 0], "total-per-class": [2, 2, 0]}
    b = {"num-examples": 6, "loss-sum": 3.0, "correct-per-class": [0, 0, 3], "total-per-class": [1, 0, 5]}
    empty = {"num-examples": 0}
    out = pool_evaluations([a, b, empty])
    assert out["accuracy"] == pytest.approx(6 / 10) and out["loss"] == pytest.approx(0.7)
    assert out["per_class_accuracy"] == pytest.approx([2 / 3, 1 / 2, 3 / 5])
    assert out["eval_nodes"] == 2 and out["eval_examples"] == 10
    assert pool_evaluations([empty])["accuracy"] is None


def test_client_evaluate_round_uses_the_local_test_split():
    # ARRAYS_KEY, CONFIG_KEY: the protocol names imported at the top
    from flwr.app import ConfigRecord

    from fedvls_flwr.app.client import evaluate_round
    from fedvls_flwr.config.run_config import RunConfig
    from fedvls_flwr.models import build_model

    cfg = RunConfig(dataset="digits", dirichlet_beta=0.5)
    model = build_model("mlp", (1, 8, 8), 10)
    content = RecordDict({
        ARRAYS_KEY: ArrayRecord({k: v.detach() for k, v in model.state_dict().items()}),
        CONFIG_KEY: ConfigRecord({**cfg.to_flower(), "server-round": 1}),
    })
    node = {"partition-id": 0, "num-partitions": 3, "test-fraction": 0.25, "cache-dir": ""}
    metrics = evaluate_round(content, node)[METRICS_KEY]
    assert metrics["num-examples"] > 0 and sum(metrics["total-per-class"]) == metrics["num-examples"]
    assert 0 <= sum(metrics["correct-per-class"]) <= metrics["num-examples"]
    no_split = evaluate_round(content, {"partition-id": 0, "num-partitions": 3, "cache-dir": ""})[METRICS_KEY]
    assert no_split["num-examples"] == 0


def test_replies_are_collected_often_and_missing_ones_after_the_timeout():
    from fedvls_flwr.app import messages as S

    grid = FakeGrid([11, 12], lambda node, attempt: reply(node, arrays(1.0), 10) if node == 11 else None)
    messages = list(RunStrategy(RunConfig()).configure_train(1, initial(), ConfigRecord(), grid))
    pulls = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: pulls.append(1) or pull(ids)
    t0 = time.monotonic()
    replies = S.exchange(grid, messages, timeout=0.3, interval=S.SIMULATION_PULL_INTERVAL)
    assert [r.metadata.src_node_id for r in replies] == [11]  # 12 never answered
    assert 0.3 <= time.monotonic() - t0 < 1.8  # the timeout, not much more (a loaded machine is slow)
    assert len(pulls) >= 5  # often: every 10 ms (about 30 pulls), not every 0.2 s or 1 s
    assert S.SIMULATION_PULL_INTERVAL < S.DEPLOYMENT_PULL_INTERVAL < 3.0  # Flower's deployment Grid sleeps 3 s


def test_simulation_and_deployment_grids_are_told_apart_by_flowers_classes():
    """Flower 1.41: simulations run on InMemoryGrid, deployments on HttpGrid (no instance is
    started here: only the class decides)."""
    from flwr.superlink.grid import InMemoryGrid
    from flwr.superlink.grid.http_grid import HttpGrid

    from fedvls_flwr.app.messages import DEPLOYMENT_PULL_INTERVAL, SIMULATION_PULL_INTERVAL, pull_interval

    assert pull_interval(object.__new__(InMemoryGrid)) == SIMULATION_PULL_INTERVAL
    assert pull_interval(object.__new__(HttpGrid)) == DEPLOYMENT_PULL_INTERVAL


def test_aggregated_record_round_trips_0d_integer_buffers_across_rounds():
    """Three rounds on a model with a BatchNorm-style 0-d buffer: each round's aggregate,
    through the ArrayRecord the strategy broadcasts, is the reference the next round's
    replies are checked against; every reply of every round must be accepted."""
    layout = {"w": np.zeros((2, 2), np.float32), "bn.num_batches_tracked": np.array(0, np.int64)}
    strategy = RunStrategy(RunConfig())
    reference = layout
    for server_round in (1, 2, 3):
        strategy.report.sampled = 2
        replies = [
            reply(node, {"w": np.full((2, 2), node, np.float32),
                         "bn.num_batches_tracked": np.array(server_round * 5, np.int64)}, 10)
            for node in (1, 2)
        ]
        strategy.report.rejected.clear()
        new, _ = strategy.aggregate_train(server_round, replies, reference)
        assert strategy.report.rejected == [], strategy.report.rejected
        assert strategy.report.accepted == 2
        reference = to_numpy_dict(new)
        assert reference["bn.num_batches_tracked"].shape == ()
        assert reference["bn.num_batches_tracked"].dtype == np.int64
        assert int(reference["bn.num_batches_tracked"]) == server_round * 5


class PartitionGrid(FakeGrid):
    """Answers query messages with the node's partition id (``partition_of``), train
    messages with ``respond``."""

    def __init__(self, partition_of, respond):
        super().__init__(list(partition_of), respond)
        self.partition_of = partition_of

    def answer(self, messages):
        if messages and messages[0].metadata.message_type == "query":
            self.sent.append(messages)
            return [query_reply(m.metadata.dst_node_id, self.partition_of[m.metadata.dst_node_id]) for m in messages]
        return super().answer(messages)


def query_reply(node, partition):
    meta = Metadata(
        run_id=1, message_id=f"q{node}", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
        group_id="0", created_at=time.time(), ttl=60.0, message_type="query",
    )
    return Message(RecordDict({METRICS_KEY: MetricRecord({"partition-id": partition})}), metadata=meta)


def test_partial_participation_samples_the_same_partitions_whatever_the_node_ids():
    """Flower's node ids are random per run: two runs with the same seed (two methods)
    must train the same partitions in every round; the strategy learns each node's
    partition once with a query message."""
    cfg = RunConfig(fraction_train=0.3, seed=5, num_server_rounds=4)
    picked = []
    for node_ids in ([901, 17, 455, 23, 78, 3000, 64, 12, 5, 700], [3, 88, 41, 2, 999, 5000, 7, 61, 10, 400]):
        partition_of = {node: pid for pid, node in enumerate(node_ids)}
        grid = PartitionGrid(partition_of, good)
        rounds = []
        RunStrategy(cfg).run(grid, initial(), on_round_end=lambda r, a, rep, rounds=rounds, of=partition_of: (
            rounds.append(sorted(of[n] for n in rep.sampled_nodes))))
        assert sum(1 for batch in grid.sent if batch[0].metadata.message_type == "query") == 1  # asked once
        picked.append(rounds)
    assert picked[0] == picked[1] and all(len(r) == 3 for r in picked[0])
    assert len({tuple(r) for r in picked[0]}) > 1  # different clients from round to round


def test_failures_name_the_partition_of_the_node():
    cfg = RunConfig(num_server_rounds=2, min_fit_fraction=0.3, round_timeout=0.2)

    def respond(node, attempt):
        if node == 12 and attempt == 2:
            return reply(node, error="boom")
        if node == 13 and attempt == 2:
            return None  # no reply
        return reply(node, arrays(1.0), 10, **{"partition-id": node - 10})

    reports = []
    RunStrategy(cfg).run(FakeGrid([11, 12, 13], respond), initial(), on_round_end=lambda r, a, rep: reports.append(rep))
    failed = {f["node"]: f for f in reports[1].failed}
    assert failed["12"]["partition_id"] == 2 and "boom" in failed["12"]["reason"]
    assert failed["13"]["partition_id"] == 3 and "no reply" in failed["13"]["reason"]


def test_train_messages_go_out_largest_client_first_once_sizes_are_known():
    sizes = {11: 10, 12: 300, 13: 50}
    grid = FakeGrid(list(sizes), lambda node, attempt: reply(node, arrays(1.0), sizes[node]))
    RunStrategy(RunConfig(num_server_rounds=2)).run(grid, initial(), on_round_end=lambda *a: None)
    assert [m.metadata.dst_node_id for m in grid.sent[1]] == [12, 13, 11]


def test_average_does_not_depend_on_the_order_replies_arrive_in():
    """Float sums depend on their order (1e16 + 1 - 1e16 != 1e16 - 1e16 + 1); the strategy
    sums in partition order, so the arrival order cannot change the global model."""
    ref = {"w": np.zeros(3, np.float64)}
    values = [1e16, 1.0, -1e16, 3.0, 2.0 ** -30, -7.0]
    clients = [(11 + i, np.full(3, v), 1.0) for i, v in enumerate(values)]

    def aggregate(order):
        strategy = RunStrategy(RunConfig())
        strategy.report.sampled = len(order)
        replies = [reply(n, {"w": w}, size, **{"partition-id": n - 11}) for n, w, size in order]
        return to_numpy_dict(strategy.aggregate_train(1, replies, ref)[0])["w"]

    first = aggregate(clients)
    rng = np.random.default_rng(0)
    for _ in range(10):
        assert np.array_equal(first, aggregate([clients[i] for i in rng.permutation(len(clients))]))


def test_an_error_reply_from_flower_is_counted_once_for_the_node_it_is_about():
    """Flower answers for a dead node with an error whose source is the SuperLink (node 1):
    it must count as that node's failure, not as a second failure besides a missing reply."""

    class FlowerErrorGrid(FakeGrid):
        def answer(self, messages):
            out = []
            for m in messages:
                if m.metadata.dst_node_id == 12:
                    r = reply(1, error="Node unavailable")
                    r.metadata.__dict__["_reply_to_message_id"] = m.metadata.message_id
                    out.append(r)
                else:
                    out.append(reply(m.metadata.dst_node_id, arrays(1.0), 10))
            return out

    reports = []
    RunStrategy(RunConfig(num_server_rounds=1, min_fit_fraction=0.3)).run(
        FlowerErrorGrid([11, 12, 13], None), initial(), on_round_end=lambda r, a, rep: reports.append(rep))
    (failure,) = reports[0].failed
    assert failure["node"] == "12" and "unavailable" in failure["reason"]


def test_more_min_nodes_than_a_simulation_has_fails_at_once(monkeypatch):
    """min-nodes=6 on 4 simulated nodes: a simulation has all its nodes from the start, so it
    fails within the moment Flower takes to register them (no 'waiting for nodes' every 30 s),
    naming both numbers and both fixes."""
    import fedvls_flwr.app.nodes as strategy_module  # where the wait for nodes lives

    monkeypatch.setattr(strategy_module, "is_simulation", lambda grid: True)
    monkeypatch.setattr(strategy_module, "SIMULATION_REGISTRATION_SECONDS", 0.3)
    grid = FakeGrid([11, 12, 13, 14], good)
    t0 = time.monotonic()
    with pytest.raises(RoundFailedError) as err:
        RunStrategy(RunConfig(num_server_rounds=1, min_nodes=6)).run(grid, initial(), on_round_end=lambda *a: None)
    assert time.monotonic() - t0 < 5
    assert "min-nodes = 6 but this simulation has 4 SuperNode(s)" in str(err.value)
    assert "num-supernodes=6" in str(err.value) and "min-nodes=4" in str(err.value)
    assert grid.calls == 0  # nothing was sent


def test_the_simulation_grid_is_flowers_in_memory_grid():
    from flwr.superlink.grid import InMemoryGrid

    from fedvls_flwr.app.messages import is_simulation

    assert is_simulation(InMemoryGrid.__new__(InMemoryGrid))
    assert not is_simulation(FakeGrid([1], good))


def test_a_deployment_short_of_min_nodes_fails_after_min_nodes_timeout_naming_the_partitions():
    """In a deployment nodes may still come: wait min-nodes-timeout, then fail saying how
    many came and which partitions they say they are (the only ones the server can know)."""
    grid = PartitionGrid({901: 0, 455: 2, 17: 3}, good)
    cfg = RunConfig(num_server_rounds=1, min_nodes=5, min_nodes_timeout=1.0)
    with pytest.raises(RoundFailedError) as err:
        RunStrategy(cfg).run(grid, initial(), on_round_end=lambda *a: None)
    text = str(err.value)
    assert "only 3 of min-nodes = 5 SuperNodes connected within min-nodes-timeout = 1 s" in text
    assert "partition id(s) 0, 2, 3" in text and "the missing ones are 1, 4" in text
    assert all(batch[0].metadata.message_type == "query" for batch in grid.sent)  # no training


def test_two_supernodes_of_one_partition_are_not_averaged_twice():
    """Two SuperNodes given the same partition-id: the second reply of that partition in a
    round is rejected, naming both nodes and the fix (its data would otherwise count twice)."""
    def respond(node, attempt):
        return reply(node, arrays(1.0), 10, **{"partition-id": {11: 0, 12: 1, 13: 1}[node]})

    reports = []
    RunStrategy(RunConfig(num_server_rounds=1)).run(
        FakeGrid([11, 12, 13], respond), initial(), on_round_end=lambda r, a, rep: reports.append(rep))
    assert reports[0].accepted == 2 and len(reports[0].rejected) == 1
    rejected = reports[0].rejected[0]
    assert rejected["node"] == "13" and rejected["partition_id"] == 1
    assert "partition 1 is also node 12's: two SuperNodes were given the same partition-id" in rejected["reason"]


def test_the_start_message_says_duplicates_and_what_did_not_answer():
    from fedvls_flwr.app.federation import too_few_nodes

    text = too_few_nodes(4, 60.0, 3, [1, 1], 60.0, simulation=False)
    assert "only 3 of min-nodes = 4" in text and "partition id(s) 1, 1 (1 did not answer)" in text
    assert "partition id(s) 1 said by two nodes" in text and "the missing ones are 0, 2, 3" in text
    assert "none said its partition id" in too_few_nodes(4, 60.0, 0, [], 60.0, simulation=False)
    sites = too_few_nodes(4, 60.0, 2, [1, 1829374651], 60.0, simulation=False)  # a node-local site's hash
    assert "partition id(s) 1, 1829374651" in sites and "the missing ones" not in sites


def test_a_simulation_says_its_own_size_after_flowers_default_warning(tmp_path, caplog, monkeypatch):
    """Flower 1.41 logs 'default simulated SuperNodes changed from 10 to 2' in every Ray
    simulation, also when 10 were asked for: the ServerApp's log says the size this run has."""
    import logging

    from fedvls_flwr.app import server
    from fedvls_flwr.config.run_config import RunConfig
    from tests.test_resume import TrainingGrid

    monkeypatch.setattr(server, "runs_on_ray", lambda grid: True)
    with caplog.at_level(logging.INFO):
        server.ServerRun(TrainingGrid(nodes=tuple(range(10, 20))), RunConfig(output_dir=str(tmp_path), run_name="r"))
    assert "federation: 10 simulated SuperNodes (Flower's warning above is about its default" in caplog.text


def test_the_round_state_is_read_in_place_and_an_unchanged_array_crosses_rounds_uncopied():
    """Each round reads the round state as read-only views over its record's bytes (a protocol or
    server part that wrote into it would raise, not change what was sent), and an array the next
    state holds unchanged (FedConcat's frozen encoders, say) is those same bytes in the next
    round's record, not a copy."""
    strategy = RunStrategy(RunConfig(num_server_rounds=3))
    average = strategy.protocol.aggregate
    seen_states = []

    def keeps_b(server_round, state, groups):
        seen_states.append(state)
        return {**average(server_round, state, groups), "b": state["b"]}

    strategy.protocol.aggregate = keeps_b
    records = []
    strategy.run(FakeGrid([11, 12], good), initial(), on_round_end=lambda r, a, rep: records.append(a))
    first = initial()
    assert records[0]["b"].data == first["b"].data
    assert records[1]["b"].data is records[0]["b"].data and records[2]["b"].data is records[0]["b"].data
    for state in seen_states:
        assert not state["w"].flags.writeable and not state["b"].flags.writeable
    np.testing.assert_allclose(to_numpy_dict(records[2])["w"], np.full((2, 2), 11.5))
