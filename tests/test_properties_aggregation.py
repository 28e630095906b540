"""Properties of server-side aggregation over random model layouts (shapes, 0-d included, and
dtypes: floats, signed and unsigned integers, booleans) and random replies: the weighted average
equals an exact rational reference computed here, whatever the order of the replies and the
scale of the weights, and keeps every array's shape and dtype (integer buffers rounded to the
nearest integer); replies that all hold the same model give it back; the metric average is the
sample-weighted mean of the metrics every reply has; check_reply refuses every malformed reply
(a NaN or inf anywhere in any floating array, another shape or dtype, a missing or extra key,
a count that is not a positive finite number, a non-finite metric) and accepts a good one."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedvls_flwr.algorithms.aggregation import Reply, average_metrics, check_reply, weighted_average
from tests.hypothesis_profiles import examples

FAST = examples(60)

DTYPES = [np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32", "uint8", "bool")]
KEYS = st.sampled_from(["conv.weight", "fc.bias", "bn.running_mean", "bn.num_batches_tracked", "head.w", "flag"])


@st.composite
def layouts(draw):
    """A model's arrays: name -> zero array of some shape (0-d to 3-d) and dtype."""
    names = draw(st.lists(KEYS, min_size=1, max_size=4, unique=True))
    return {name: np.zeros(draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)), draw(st.sampled_from(DTYPES)))
            for name in names}


def values_for(dtype: np.dtype):
    if dtype.kind == "f":
        limit = 1000.0 if dtype.itemsize > 2 else 100.0
        return st.floats(-limit, limit, allow_nan=False, allow_infinity=False, width=8 * dtype.itemsize)
    if dtype.kind == "b":
        return st.booleans()
    info = np.iinfo(dtype)
    return st.integers(max(info.min, -1000), min(info.max, 1000))


def arrays_like(layout):
    return st.fixed_dictionaries({k: hnp.arrays(ref.dtype, ref.shape, elements=values_for(ref.dtype))
                                  for k, ref in layout.items()})


@st.composite
def rounds(draw, min_replies=1, max_replies=6):
    """(reference layout, replies) with positive integer sample counts."""
    layout = draw(layouts())
    replies = [Reply(f"c{i}", draw(arrays_like(layout)), draw(st.integers(1, 500)), {})
               for i in range(draw(st.integers(min_replies, max_replies)))]
    return layout, replies


def exact_average(replies: list[Reply], key: str) -> list[Fraction]:
    """sum_i n_i w_i / sum_i n_i per element, in exact rationals."""
    total = sum(Fraction(r.num_examples) for r in replies)
    flat = [np.asarray(r.arrays[key]).reshape(-1) for r in replies]
    size = flat[0].size
    return [sum(Fraction(r.num_examples) * Fraction(float(f[j])) for r, f in zip(replies, flat)) / total
            for j in range(size)]


def nearest_integers(x: Fraction) -> set[int]:
    """The integer nearest to x; both neighbours at an exact .5 (float sums may land either side)."""
    floor = math.floor(x)
    if x - floor == Fraction(1, 2):
        return {floor, floor + 1}
    return {round(x)}


def assert_matches_exact(out: dict, layout: dict, replies: list[Reply]) -> None:
    assert set(out) == set(layout)
    for key, ref in layout.items():
        got = out[key]
        assert isinstance(got, np.ndarray) and got.shape == ref.shape and got.dtype == ref.dtype, key
        exact = exact_average(replies, key)
        for value, x in zip(got.reshape(-1).tolist(), exact):
            if ref.dtype.kind == "b":
                assert value in {n != 0 for n in nearest_integers(x)}, (key, value, float(x))
            elif ref.dtype.kind in "iu":
                assert value in nearest_integers(x), (key, value, float(x))
            else:
                scale = max(abs(float(np.asarray(r.arrays[key]).astype(np.float64).max(initial=0))) +
                            abs(float(np.asarray(r.arrays[key]).astype(np.float64).min(initial=0))) for r in replies)
                # one unit in the last place of the dtype at x (subnormals included), and the
                # float64 sum's own rounding
                ulp = float(np.spacing(np.abs(np.asarray(float(x), dtype=ref.dtype))))
                assert abs(value - float(x)) <= ulp + 1e-12 * scale, (key, value, float(x))


@FAST
@given(case=rounds(), order_seed=st.integers(0, 1000))
def test_the_weighted_average_is_the_exact_one_in_any_reply_order(case, order_seed):
    layout, replies = case
    assert_matches_exact(weighted_average(replies, layout), layout, replies)
    shuffled = list(replies)
    np.random.default_rng(order_seed).shuffle(shuffled)
    assert_matches_exact(weighted_average(shuffled, layout), layout, replies)


@FAST
@given(case=rounds(), factor=st.sampled_from([0.25, 3.0, 1000.0]))
def test_scaling_every_weight_by_one_factor_changes_nothing(case, factor):
    layout, replies = case
    scaled = [Reply(r.client, r.arrays, r.num_examples * factor, r.metrics) for r in replies]
    assert_matches_exact(weighted_average(scaled, layout), layout, replies)


@FAST
@given(data=st.data(), counts=st.lists(st.integers(1, 500), min_size=1, max_size=6))
def test_replies_that_all_hold_one_model_give_it_back(data, counts):
    layout = data.draw(layouts(), label="layout")
    model = data.draw(arrays_like(layout), label="model")
    replies = [Reply(f"c{i}", {k: v.copy() for k, v in model.items()}, n, {}) for i, n in enumerate(counts)]
    out = weighted_average(replies, layout)
    for key, value in model.items():
        assert out[key].dtype == value.dtype and out[key].shape == value.shape
        if value.dtype.kind == "f" and value.dtype.itemsize == 8:
            np.testing.assert_allclose(out[key], value, rtol=4 * np.finfo(np.float64).eps, atol=1e-12)
        else:  # float32/16, integers and booleans come back bit for bit
            np.testing.assert_array_equal(out[key], value)


METRIC = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@FAST
@given(replies=st.lists(st.tuples(st.integers(1, 500),
                                  st.dictionaries(st.sampled_from(["loss", "acc", "ce", "dis"]), METRIC, max_size=4)),
                        min_size=1, max_size=6))
def test_the_metric_average_is_sample_weighted_over_the_metrics_every_reply_has(replies):
    shared = set.intersection(*(set(m) for _, m in replies))
    got = average_metrics([Reply(f"c{i}", {}, n, m) for i, (n, m) in enumerate(replies)])
    assert set(got) == shared
    total = sum(n for n, _ in replies)
    for name in shared:
        exact = sum(Fraction(n) * Fraction(m[name]) for n, m in replies) / total
        assert math.isclose(got[name], float(exact), rel_tol=1e-12, abs_tol=1e-9)


# ------------------------------------------------------------------------------- check_reply
@st.composite
def good_replies(draw):
    layout = draw(layouts())
    return layout, Reply("c", draw(arrays_like(layout)), draw(st.integers(1, 500)), {"loss": draw(METRIC)})


@FAST
@given(case=good_replies())
def test_a_reply_of_the_models_layout_is_accepted(case):
    layout, reply = case
    assert check_reply(reply, layout) is None


@FAST
@given(case=good_replies(), data=st.data())
def test_a_nan_or_inf_anywhere_in_any_floating_array_is_refused(case, data):
    layout, reply = case
    arrays = dict(reply.arrays)
    if not any(ref.dtype.kind == "f" for ref in layout.values()):  # give the model a floating array
        dtype = data.draw(st.sampled_from([d for d in DTYPES if d.kind == "f"]), label="dtype")
        layout, arrays = {**layout, "w": np.zeros(3, dtype)}, {**arrays, "w": np.zeros(3, dtype)}
    key = data.draw(st.sampled_from(sorted(k for k, ref in layout.items() if ref.dtype.kind == "f")), label="key")
    arr = arrays[key].copy()
    position = data.draw(st.integers(0, max(arr.size - 1, 0)), label="position")
    arr.reshape(-1)[position] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), label="bad value")
    reason = check_reply(Reply(reply.client, {**arrays, key: arr}, reply.num_examples, reply.metrics), layout)
    assert reason is not None and key in reason


@FAST
@given(case=good_replies(), data=st.data())
def test_another_shape_or_dtype_is_refused(case, data):
    layout, reply = case
    key = data.draw(st.sampled_from(sorted(layout)), label="key")
    ref = layout[key]
    if data.draw(st.booleans(), label="change the shape"):
        shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, max_side=4).filter(lambda s: s != ref.shape))
        bad = np.zeros(shape, ref.dtype)
        fragment = "shape"
    else:
        bad = np.zeros(ref.shape, data.draw(st.sampled_from([d for d in DTYPES if d != ref.dtype])))
        fragment = "dtype"
    reason = check_reply(Reply(reply.client, {**reply.arrays, key: bad}, reply.num_examples, reply.metrics), layout)
    assert reason is not None and fragment in reason and key in reason


@FAST
@given(case=good_replies(), data=st.data())
def test_a_missing_or_an_extra_array_is_refused(case, data):
    layout, reply = case
    arrays = dict(reply.arrays)
    if len(arrays) > 1 and data.draw(st.booleans(), label="drop one"):
        del arrays[data.draw(st.sampled_from(sorted(arrays)), label="dropped")]
    else:
        arrays[data.draw(st.sampled_from(["extra", "proj.weight"]), label="added")] = np.zeros(2, np.float32)
    assert check_reply(Reply(reply.client, arrays, reply.num_examples, reply.metrics), layout) is not None


@FAST
@given(case=good_replies(), count=st.sampled_from([0, -1, -250.5, math.inf, -math.inf, math.nan]))
def test_a_count_that_is_not_a_positive_finite_number_is_refused(case, count):
    layout, reply = case
    reason = check_reply(Reply(reply.client, reply.arrays, count, reply.metrics), layout)
    assert reason is not None and "num-examples" in reason


@FAST
@given(case=good_replies(), bad=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_metric_is_refused(case, bad):
    layout, reply = case
    reason = check_reply(Reply(reply.client, reply.arrays, reply.num_examples, {**reply.metrics, "ce": bad}), layout)
    assert reason is not None and "ce" in reason
