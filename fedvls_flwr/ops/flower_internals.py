"""What the in-process engine does to Flower's objects, in one place: through Flower 1.41's
public API wherever it offers a way, and the one thing it does not offer, named here.

The one private name: a message's id. ``flwr run`` gives every message an id when the ServerApp
pushes it, in place, on the very object the ServerApp holds (its later ``pull_messages`` and its
replies' ``reply_to_message_id`` name it). ``Metadata.message_id`` has no setter, so Flower's own
grids write ``Metadata.__dict__["_message_id"]`` (``InMemoryGrid.push_messages``, the
SuperLink's store); :func:`set_message_id` does what they do. :data:`PRIVATE_NAMES` lists it, and
``tests/test_flower_internals.py`` fails, naming it, when a Flower upgrade removes it.

The rest is public: a node's own copy of a message (:func:`own_copy`: ``make_message`` over a new
``Metadata`` and new records, as a transport's deserialisation would give), and the identity of
the task running in this process (:func:`task_identity`: ``TaskIdentity``'s properties, read
and set, and put back afterwards).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.common import serde
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["PRIVATE_NAMES", "own_copy", "records_copy", "set_message_id", "task_identity", "values_copy", "wire_values"]

#: Every attribute below Flower's public API the engine reads or writes: (class, attribute).
PRIVATE_NAMES: tuple[tuple[type, str], ...] = ((Metadata, "_message_id"),)


def set_message_id(message: Message, message_id: str) -> None:
    """Give the pushed ``message`` its id in place, as Flower's grids do (see the module docstring)."""
    message.metadata.__dict__["_message_id"] = message_id


def copied_metadata(metadata: Metadata, message_id: str | None = None) -> Metadata:
    """A new ``Metadata`` equal to ``metadata`` (``message_id``: with that id instead)."""
    return Metadata(run_id=metadata.run_id, message_id=metadata.message_id if message_id is None else message_id,
                    src_node_id=metadata.src_node_id, dst_node_id=metadata.dst_node_id,
                    reply_to_message_id=metadata.reply_to_message_id, group_id=metadata.group_id,
                    created_at=metadata.created_at, ttl=metadata.ttl, message_type=metadata.message_type,
                    src_task_id=metadata.src_task_id, dst_task_id=metadata.dst_task_id)


def own_copy(message: Message) -> Message:
    """A copy of ``message`` that shares nothing mutable with it: new metadata, new records, new
    ``Array`` objects over the same (immutable) bytes, lists copied - what a transport's
    serialisation gives, without re-encoding the arrays."""
    metadata = copied_metadata(message.metadata)
    if message.has_error():
        return make_message(metadata, error=message.error)
    return make_message(metadata, content=records_copy(message.content))


def records_copy(content: RecordDict) -> RecordDict:
    """``content`` with every record new: an ``Array``'s fields are replaced, never changed in
    place, so a copied ``Array`` may share its bytes (and Flower's read-only cache of them); a
    config's or metric's values are what the wire gives back (:func:`values_copy`)."""
    records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            arrays = records[name] = ArrayRecord()  # set one by one: the dict constructor builds it twice
            for key, array in record.items():
                arrays[key] = copy.copy(array)
        else:
            records[name] = values_copy(record)
    return RecordDict(records)


#: What protobuf's sint64 holds: such an int comes back as it went.
_SINT64 = (-(2**63), 2**63)
_CONFIG_KINDS = frozenset((int, float, str, bytes, bool))
_METRIC_KINDS = frozenset((int, float))


def _list_sent_as_is(values: list[Any], kinds: frozenset[type]) -> bool:
    """A non-empty list of one plain kind (the wire types a list by its first value: ``[1,
    True]`` comes back ``[1, 1]``), its ints in sint64's range."""
    if not values:
        return False
    kind = type(values[0])
    return (kind in kinds and all(type(v) is kind for v in values)
            and (kind is not int or all(_SINT64[0] <= v < _SINT64[1] for v in values)))


def _all_sent_as_is(values: Iterable[Any], kinds: frozenset[type]) -> bool:
    """Whether the wire gives every value back unchanged: a scalar of exactly a plain kind (not
    numpy's float64, an enum, a subclass), an int in sint64's range, a list as
    :func:`_list_sent_as_is` says. One pass, no call per scalar: a run config's ~90 values are
    checked in every message."""
    low, high = _SINT64
    for value in values:
        kind = type(value)
        if kind is int:
            if not low <= value < high:
                return False
        elif kind is list:
            if not _list_sent_as_is(value, kinds):
                return False
        elif kind not in kinds:
            return False
    return True


def _as_sent(record: ConfigRecord | MetricRecord) -> ConfigRecord | MetricRecord:
    """``record`` itself where the wire gives every value back as it went (what this app
    sends); else what Flower's own serialisation gives back, which converts (a numpy scalar, an
    enum, a list the wire types by its first value) or refuses (a value put into a list after
    it was checked, an int beyond what the wire holds) as ``flwr run`` would."""
    kinds = _CONFIG_KINDS if isinstance(record, ConfigRecord) else _METRIC_KINDS
    if type(record) in (ConfigRecord, MetricRecord) and _all_sent_as_is(record.values(), kinds):
        return record
    if isinstance(record, ConfigRecord):
        return serde.config_record_from_proto(serde.config_record_to_proto(record))
    return serde.metric_record_from_proto(serde.metric_record_to_proto(record))


def values_copy(record: ConfigRecord | MetricRecord) -> ConfigRecord | MetricRecord:
    """A config or metric record as a transport delivers it (:func:`_as_sent`). Where every
    value comes back as it went, Flower's own shallow ``copy()`` (its scalars are immutable) with
    every list its own (two keys that share a list get one each, as from the wire): rebuilding
    it, or a deep copy, would check its ~90 values again one by one in every message (150 µs
    against 20 µs, most of it the check above)."""
    sent = _as_sent(record)
    if sent is not record:
        return sent
    copied = record.copy()
    for key, value in record.items():
        if type(value) is list:
            copied[key] = list(value)  # type: ignore[assignment]
    return copied


def wire_values(record: ConfigRecord | MetricRecord) -> dict[str, Any]:
    """A config or metric record's values as a transport delivers them, as a plain dict (for a
    transport of the engine's own that pickles them): converted or refused as
    :func:`_as_sent` says, every list its own (pickling keeps two keys' shared list shared)."""
    return {key: list(value) if type(value) is list else value for key, value in _as_sent(record).items()}


def _current(name: str) -> int | None:
    try:
        return int(getattr(TaskIdentity, name))
    except RuntimeError:  # not set in this process: Flower's getter refuses rather than give None
        return None


@contextmanager
def task_identity(task_id: int, run_id: int, node_id: int) -> Iterator[None]:
    """This process runs task ``task_id`` of run ``run_id`` on node ``node_id`` (what a new
    ``Message`` reads for its metadata) until the block ends; then what it was before."""
    names = ("task_id", "run_id", "node_id")
    before = {name: _current(name) for name in names}
    for name, value in zip(names, (task_id, run_id, node_id)):
        setattr(TaskIdentity, name, value)
    try:
        yield
    finally:
        for name in names:
            setattr(TaskIdentity, name, before[name])  # None again where it was not set
