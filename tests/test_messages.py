"""Reading an Array's values without np.load gives exactly what Flower's ``Array.numpy()`` gives."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedvls_flwr.app.messages import array_values

CASES = {
    "0-d float": np.zeros(()),
    "0-d int64 (BatchNorm's num_batches_tracked)": np.array(7, np.int64),
    "float32 matrix": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
    "empty float16": np.zeros((0, 3), np.float16),
    "bool": np.array([True, False, True]),
    "float64 3-d": np.random.default_rng(1).random((2, 3, 4)),
    "fortran order": np.asfortranarray(np.random.default_rng(2).random((3, 4))),
    "big-endian": np.arange(12, dtype=">f4").reshape(3, 4),
    "a strided view": np.random.default_rng(3).random((3, 4))[:, ::2],
    "uint8 image": np.random.default_rng(4).integers(0, 255, (2, 3, 8, 8), dtype=np.uint8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_array_values_equal_flowers_own_decoding(name):
    arr = Array(np.asarray(CASES[name]))
    ours, flowers = array_values(arr), arr.numpy()
    assert ours.dtype == flowers.dtype and ours.shape == flowers.shape
    assert np.array_equal(ours, flowers) and ours.flags.writeable
    ours[...] = 0 if ours.size else ours  # a copy: the message's bytes are never written
    assert np.array_equal(arr.numpy(), flowers)


# ---- a message's records read directly: what Flower's typed views give, without building them
def _content():
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    return RecordDict({"w": ArrayRecord({"x": Array(np.ones(2, np.float32))}), "c": ConfigRecord({"k": 1}),
                       "m": MetricRecord({"loss": 0.5}), "w2": ArrayRecord()})


@pytest.mark.parametrize("kind_name", ["ArrayRecord", "ConfigRecord", "MetricRecord"])
def test_records_read_directly_are_flowers_typed_views(kind_name):
    import flwr.app

    from fedvls_flwr.app.messages import has_record, names_of, record_in

    kind = getattr(flwr.app, kind_name)
    content = _content()
    view = {"ArrayRecord": content.array_records, "ConfigRecord": content.config_records,
            "MetricRecord": content.metric_records}[kind_name]
    assert names_of(content, kind) == list(view)
    for name in ["w", "c", "m", "w2", "absent"]:
        assert has_record(content, name, kind) == (name in view)
        if name in view:
            assert record_in(content, name, kind) is view[name]
        else:  # absent, or a record of another kind: KeyError, as Flower's view raises
            with pytest.raises(KeyError):
                view[name]
            with pytest.raises(KeyError):
                record_in(content, name, kind)


def test_a_config_with_changes_leaves_its_base_alone_and_checks_the_changes():
    from flwr.app import ConfigRecord

    from fedvls_flwr.app.messages import config_with

    base = ConfigRecord({"a": 1, "l": [1, 2], "s": "x"})
    got = config_with(base, {"s": "y", "new": 2.5})
    assert list(got.items()) == [("a", 1), ("l", [1, 2]), ("s", "y"), ("new", 2.5)]
    got["l"].append(3)  # its own list
    assert dict(base) == {"a": 1, "l": [1, 2], "s": "x"}
    with pytest.raises(TypeError):
        config_with(base, {"bad": object()})  # a change is checked as Flower checks a value set


# ---- arrays encoded as Flower encodes them, without np.save's header every time
ENCODE_CASES = {**CASES, "int64 vector": np.arange(5), "float32 matrix again": np.ones((3, 4), np.float32),
                "bool 0-d": np.array(True), "uint16 3-d": np.arange(24, dtype=np.uint16).reshape(2, 3, 4),
                "long shape": np.zeros((1,) * 20, np.float64), "complex": np.array([1 + 2j, 3j]),
                "datetime": np.array(["2026-11-29", "1970-01-01"], dtype="datetime64[D]"),
                "large float32": np.random.default_rng(3).standard_normal(300_000).astype(np.float32)}


@pytest.mark.parametrize("name", sorted(ENCODE_CASES))
def test_an_array_is_encoded_byte_for_byte_as_flower_encodes_it(name):
    from fedvls_flwr.app.messages import npy_array

    value = ENCODE_CASES[name]
    for attempt in range(2):  # the first builds the header, the second reuses it
        ours, flowers = npy_array(value.copy(order="K") if attempt else value), Array.from_numpy_ndarray(value)
        assert (ours.dtype, ours.shape, ours.stype, ours.data) == (flowers.dtype, flowers.shape, flowers.stype, flowers.data)
        assert np.array_equal(ours.numpy(), value)


def test_what_flower_refuses_or_saves_its_own_way_is_left_to_flower():
    from fedvls_flwr.app.messages import npy_array

    npy_array(np.array(1.0, np.float32))  # a header for (float32, ()) is kept
    with pytest.raises(AssertionError):  # a numpy scalar is not an ndarray, for Flower too
        npy_array(np.float32(2.0))
    masked = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    npy_array(masked.data)  # a header for (float64, (3,)) is kept
    assert npy_array(masked).data == Array.from_numpy_ndarray(masked).data  # np.save writes the raw values


def test_a_reused_header_follows_the_arrays_dtype_and_shape():
    from fedvls_flwr.app.messages import npy_array, numpy_record

    a, b = np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)
    npy_array(a)
    npy_array(np.zeros((2, 3), ">f4"))
    for value in (b, a.astype(np.float64), np.zeros((2, 3), ">f4"), np.zeros((2, 3), np.float32)):
        assert npy_array(value).data == Array.from_numpy_ndarray(value).data
    record = numpy_record({"a": a, "b": b})
    assert list(record) == ["a", "b"] and record["b"].numpy().shape == (3, 2)


def test_read_only_values_are_the_records_own_bytes_and_cannot_be_written():
    from fedvls_flwr.app.messages import read_only_dict, to_numpy_dict

    record = ArrayRecord({name: Array(value) for name, value in CASES.items()})
    views, copies = read_only_dict(record), to_numpy_dict(record)
    assert list(views) == list(record)
    for name, value in views.items():
        np.testing.assert_array_equal(value, copies[name])
        assert value.dtype == copies[name].dtype and value.shape == copies[name].shape
        if value.flags.writeable:  # not an npy payload read in place (Fortran order): a copy of its own
            before = record[name].data
            value[...] = 0
            assert record[name].data == before
    large = ArrayRecord({"w": Array(np.arange(100_000, dtype=np.float32))})
    view = read_only_dict(large)["w"]
    assert np.shares_memory(view, np.frombuffer(large["w"].data, np.uint8))  # not a copy
    with pytest.raises(ValueError):  # a reader that writes raises: the message stays as sent
        view += 1


def test_a_view_over_an_arrays_whole_payload_is_encoded_as_those_very_bytes():
    """The server's round state is read as views over a record's bytes; putting an unchanged one
    into the next record reuses those bytes (no copy), which are what encoding it would give. A
    view over part of the payload, another shape, or a buffer that is not an npy payload is
    encoded as usual."""
    from fedvls_flwr.app.messages import npy_array, read_only_dict

    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    npy_array(value)  # the header for (float32, (4, 6)) is kept
    record = ArrayRecord({"w": Array(value), "s": Array(np.array(3, dtype=np.int64))})
    views = read_only_dict(record)
    for name, view in views.items():
        npy_array(view)  # headers kept
        again = npy_array(view)
        assert again.data is record[name].data and again.data == Array.from_numpy_ndarray(np.asarray(view)).data
        assert (again.dtype, again.shape, again.stype) == (record[name].dtype, record[name].shape, record[name].stype)
    flat = views["w"].reshape(-1)
    from_the_start = np.frombuffer(record["w"].data, dtype=np.uint8)[:value.nbytes].view(np.float32).reshape(4, 6)
    for other in (np.ascontiguousarray(views["w"][1:]), flat[6:].reshape(3, 6), views["w"].reshape(6, 4),
                  flat[:12].reshape(2, 6), from_the_start):
        npy_array(other)
        got = npy_array(other)
        assert got.data is not record["w"].data and got.data == Array.from_numpy_ndarray(np.asarray(other)).data
    raw = np.frombuffer(value.tobytes(), dtype=np.float32).reshape(4, 6)  # bytes, but no npy header
    assert npy_array(raw).data == Array.from_numpy_ndarray(value).data
