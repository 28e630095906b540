"""Flower's objects as the in-process engine handles them (fedvls_flwr/ops/flower_internals.py):
the one private name it writes still does what Flower's own grids rely on, a node's copy of a
message shares nothing mutable with the server's, and the task identity is put back. A Flower
upgrade that removes or renames the private attribute fails here, naming it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedvls_flwr.ops.flower_internals import PRIVATE_NAMES, own_copy, set_message_id, task_identity


def metadata(message_id: str = "") -> Metadata:
    return Metadata(run_id=1, message_id=message_id, src_node_id=0, dst_node_id=7, reply_to_message_id="",
                    group_id="3", created_at=1.0, ttl=60.0, message_type="train")


@pytest.mark.parametrize("owner, name", PRIVATE_NAMES, ids=[f"{o.__name__}.{n}" for o, n in PRIVATE_NAMES])
def test_every_private_name_the_engine_relies_on_is_still_there(owner, name):
    instance = metadata() if owner is Metadata else owner()
    assert name in vars(instance), (
        f"Flower no longer keeps {owner.__module__}.{owner.__name__}().__dict__[{name!r}]: "
        "fedvls_flwr/ops/flower_internals.py must find this Flower version's way to do it")


def test_a_pushed_message_gets_its_id_in_place():
    with task_identity(task_id=1, run_id=1, node_id=0):
        message = Message(RecordDict(), 7, "train")
    assert message.metadata.message_id == ""  # what Flower's Message leaves to the SuperLink
    set_message_id(message, "m-1")
    assert message.metadata.message_id == "m-1"
    reply = Message(RecordDict(), reply_to=message)
    assert reply.metadata.reply_to_message_id == "m-1"  # as the server matches replies by it


def test_a_nodes_copy_shares_nothing_mutable_with_the_servers_message():
    weights = np.arange(6, dtype=np.float32)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(weights)}),
                          "config": ConfigRecord({"lr": 0.1, "ids": [1, 2]}),
                          "metrics": MetricRecord({"seen": [3, 4]})})
    with task_identity(task_id=1, run_id=1, node_id=0):
        message = Message(content, 7, "train", group_id="3")
    set_message_id(message, "m-2")
    copy = own_copy(message)
    assert copy is not message and copy.metadata is not message.metadata
    assert (copy.metadata.message_id, copy.metadata.dst_node_id, copy.metadata.group_id) == ("m-2", 7, "3")
    assert copy.metadata.created_at == message.metadata.created_at and copy.metadata.ttl == message.metadata.ttl
    copy.content["config"]["ids"].append(9)
    copy.content["metrics"]["seen"].append(9)
    copy.content["arrays"]["w"] = Array(np.zeros(6, dtype=np.float32))
    copy.content["extra"] = ConfigRecord({"x": 1})
    copy.content["config"]["lr"] = 0.5
    copy.content["metrics"]["new"] = 1
    assert message.content["config"]["ids"] == [1, 2] and message.content["metrics"]["seen"] == [3, 4]
    assert message.content["config"]["lr"] == 0.1 and "new" not in message.content["metrics"]
    # the copies are records of their kind that still check what is put into them
    assert type(copy.content["config"]) is ConfigRecord and type(copy.content["metrics"]) is MetricRecord
    with pytest.raises(TypeError):
        copy.content["config"]["bad"] = {"a dict": 1}  # type: ignore[assignment]
    with pytest.raises(TypeError):
        copy.content["metrics"]["bad"] = "text"  # type: ignore[assignment]
    assert np.array_equal(message.content["arrays"]["w"].numpy(), weights) and "extra" not in message.content
    assert own_copy(message).content["arrays"]["w"].data is message.content["arrays"]["w"].data  # bytes shared


def test_the_task_identity_is_put_back_even_when_it_was_unset():
    names = ("task_id", "run_id", "node_id")

    def current():
        out = []
        for name in names:
            try:
                out.append(getattr(TaskIdentity, name))
            except RuntimeError:
                out.append(None)
        return out

    before = current()
    with pytest.raises(ValueError), task_identity(task_id=5, run_id=6, node_id=7):
        assert current() == [5, 6, 7]
        with task_identity(task_id=8, run_id=9, node_id=10):
            assert current() == [8, 9, 10]
        assert current() == [5, 6, 7]
        raise ValueError("the block fails: the identity comes back all the same")
    assert current() == before


# ---- a node's copy gives what Flower's wire gives back (its serialisation to protobuf and back)
def _wire(record):
    from flwr.common import serde

    if isinstance(record, ConfigRecord):
        return serde.config_record_from_proto(serde.config_record_to_proto(record))
    return serde.metric_record_from_proto(serde.metric_record_to_proto(record))


def _as_delivered(record):
    with task_identity(task_id=1, run_id=1, node_id=0):
        return own_copy(Message(RecordDict({"r": record}), dst_node_id=7, message_type="train")).content["r"]


class Colour(str):
    pass


@pytest.mark.parametrize("values", [
    {"f": np.float64(0.5), "l": [np.float64(1.5)]},     # numpy scalars come back as floats
    {"s": Colour("red")},                                # a str subclass comes back a str
    {"l": [1, True]},                                    # a list is typed by its first value
    {"f": 0.5, "i": 3, "s": "x", "b": b"y", "t": True, "fl": [0.5, 1.5], "sl": ["a"], "bl": [True, False]},
    {"big": 2**63},                                      # beyond sint64: sent as uint64
], ids=["numpy", "subclass", "mixed-list", "plain", "uint64"])
def test_a_config_record_reaches_the_node_as_the_wire_gives_it(values):
    record = ConfigRecord(values)
    got, wire = _as_delivered(record), _wire(record)
    assert dict(got.items()) == dict(wire.items())
    assert {k: (type(v), [type(x) for x in v] if isinstance(v, list) else None) for k, v in got.items()} == {
        k: (type(v), [type(x) for x in v] if isinstance(v, list) else None) for k, v in wire.items()}


def test_a_metric_record_reaches_the_node_as_the_wire_gives_it():
    record = MetricRecord({"f": np.float64(0.25), "l": [np.float64(1.5), np.float64(2.0)]})
    got = _as_delivered(record)
    assert type(got["f"]) is float and [type(x) for x in got["l"]] == [float, float]


def test_two_keys_sharing_a_list_get_one_each():
    shared = [1, 2]
    got = _as_delivered(ConfigRecord({"a": shared, "b": shared}))
    got["a"].append(3)
    assert got["b"] == [1, 2] and shared == [1, 2]


def test_a_value_put_into_a_list_after_its_check_is_refused_as_flwr_run_refuses_it():
    record = ConfigRecord({"a": [1, 2]})
    record["a"].append("x")  # Flower checks values when they are set, not lists changed later
    with pytest.raises(TypeError):
        _as_delivered(record)


def test_an_int_beyond_what_the_wire_holds_is_refused():
    with pytest.raises(ValueError):
        _as_delivered(ConfigRecord({"a": -(2**63) - 1}))


def test_a_reply_shares_nothing_with_what_the_client_app_keeps():
    from fedvls_flwr.ops.client_worker import stamped

    kept = MetricRecord({"loss": [0.5, 0.25]})
    with task_identity(task_id=1, run_id=1, node_id=0):
        reply = Message(RecordDict({"m": kept, "c": ConfigRecord({"k": np.float64(1.5)})}),
                        reply_to=Message(RecordDict(), dst_node_id=7, message_type="train"))
        stored = stamped(reply)
    assert stored.content["m"] is not kept and stored.content["m"]["loss"] is not kept["loss"]
    stored.content["m"]["loss"].append(1.0)
    assert kept["loss"] == [0.5, 0.25]
    assert type(stored.content["c"]["k"]) is float
