"""A part's server companion through the real strategy: what it sends with the weights, what
it sees after a round, and its state in the checkpoint (a toy companion; FedGF's own is
tested in test_fedgf.py)."""

import numpy as np
import pytest

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply
from fedvls_flwr.algorithms.downlink import Downlink, merge_downlinks
from fedvls_flwr.algorithms.parts import RunContext, ServerCompanion
from fedvls_flwr.app.keys import DOWNLINK, DOWNLINK_VALUES
from fedvls_flwr.app.messages import to_numpy_dict
from fedvls_flwr.app.strategy import RunStrategy
from fedvls_flwr.config.run_config import RunConfig
from tests.test_strategy import FakeGrid, arrays, initial, reply

pytestmark = pytest.mark.usefixtures("run_identity")  # Flower's messages need a run identity


class Counter(ServerCompanion):
    """Sends the last global model plus one, and how many rounds it has seen."""

    def __init__(self, settings):
        super().__init__(settings, RunContext(RunConfig()))
        self.seen: list[tuple[int, ArrayDict, ArrayDict, list[Reply]]] = []
        self.last: ArrayDict | None = None

    def downlink(self, server_round, global_arrays):
        if self.last is None:
            return Downlink()
        return Downlink({"w-next": self.last["w"] + 1}, {"rounds": float(len(self.seen))})

    def observe(self, server_round, sent, new_global, replies):
        self.seen.append((server_round, sent, new_global, replies))
        self.last = new_global

    def state(self):
        return {} if self.last is None else {"last-w": self.last["w"], "n": np.array(len(self.seen))}

    def load_state(self, state):
        self.last = {"w": state["last-w"]}
        self.seen = [None] * int(state["n"])  # type: ignore[list-item]


def with_companion(strategy: RunStrategy) -> RunStrategy:
    """The strategy with a Counter as its local optimizer's server companion."""
    strategy.parts["local-optimizer"] = strategy.companions["local-optimizer"] = Counter({})
    return strategy


def test_companion_downlink_observe_and_state_round_trip():
    strategy = with_companion(RunStrategy(RunConfig(num_server_rounds=3)))
    values = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    grid = FakeGrid([11, 12], lambda node, attempt: reply(node, arrays(next(values)), 10))
    strategy.run(grid, initial(), on_round_end=lambda r, a, rep: None)
    first, second, third = grid.sent
    assert all(DOWNLINK not in m.content.array_records for m in first)  # nothing to send yet
    # round 2 carries the round-1 global model (mean of 1 and 2) plus one, and one observed round
    for m in second:
        np.testing.assert_array_equal(to_numpy_dict(m.content.array_records[DOWNLINK])["w-next"], np.full((2, 2), 2.5))
        assert m.content.config_records[DOWNLINK_VALUES]["rounds"] == 1.0
    assert third[0].content.config_records[DOWNLINK_VALUES]["rounds"] == 2.0
    companion = strategy.companions["local-optimizer"]
    assert [s[0] for s in companion.seen] == [1, 2, 3]
    round2 = companion.seen[1]
    np.testing.assert_array_equal(round2[1]["w"], np.full((2, 2), 1.5))  # what was sent in round 2
    np.testing.assert_array_equal(round2[2]["w"], np.full((2, 2), 3.5))  # the new global model
    assert len(round2[3]) == 2 and {r.num_examples for r in round2[3]} == {10}

    state = strategy.server_state()
    assert set(state) == {"local-optimizer/last-w", "local-optimizer/n"}  # each part's state under its kind
    fresh = with_companion(RunStrategy(RunConfig(num_server_rounds=3)))
    model = fresh.load_server_state({**state, "w": np.zeros(2)})
    assert set(model) == {"w"}
    assert fresh.companions["local-optimizer"].downlink(4, {}).values == companion.downlink(4, {}).values


def test_a_failed_attempt_is_not_observed():
    strategy = with_companion(
        RunStrategy(RunConfig(num_server_rounds=1, round_retries=1, min_fit_fraction=1.0, round_timeout=0.2)))
    grid = FakeGrid([11, 12], lambda node, attempt: reply(node, arrays(1.0), 10) if attempt > 1 or node == 11 else None)
    strategy.run(grid, initial(), on_round_end=lambda r, a, rep: None)
    assert [s[0] for s in strategy.companions["local-optimizer"].seen] == [1]  # the retry, once


def test_two_parts_sending_the_same_key_is_an_error():
    with pytest.raises(ValueError, match="sends"):
        merge_downlinks({"a": Downlink({"x": np.zeros(1)}), "b": Downlink({"x": np.ones(1)})})
