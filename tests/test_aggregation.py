"""Aggregation against hand-computed values; malformed and non-finite replies rejected."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from fedvls_flwr.algorithms.aggregation import (
    SPAN,
    Reply,
    average_metrics,
    check_reply,
    drift_diversity,
    in_spans,
    weighted_average,
)

REF = {"w": np.zeros((2, 2), np.float32), "steps": np.array(0, np.int64)}


def reply(name, w, n, steps=0, **metrics):
    return Reply(name, {"w": np.asarray(w, np.float32), "steps": np.array(steps, np.int64)}, n, metrics)


def test_weighted_average_matches_hand_computation():
    a = reply("a", [[1, 2], [3, 4]], 10, steps=4)
    b = reply("b", [[5, 6], [7, 8]], 30, steps=8)
    out = weighted_average([a, b], REF)
    expected = np.array([[4, 5], [6, 7]], np.float32)  # 0.25 * a + 0.75 * b
    np.testing.assert_allclose(out["w"], expected, rtol=1e-6)
    assert out["w"].dtype == np.float32
    assert out["steps"].dtype == np.int64 and int(out["steps"]) == 7


def test_average_metrics_is_sample_weighted():
    a = reply("a", np.zeros((2, 2)), 1, loss=1.0, only_a=3.0)
    b = reply("b", np.zeros((2, 2)), 3, loss=3.0)
    assert average_metrics([a, b]) == {"loss": pytest.approx(2.5)}


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (Reply("x", {"w": np.zeros((2, 2), np.float32)}, 5, {}), "missing ['steps']"),
        (Reply("x", {**REF, "extra": np.zeros(1)}, 5, {}), "unexpected ['extra']"),
        (Reply("x", {**REF, "w": np.zeros((2, 3), np.float32)}, 5, {}), "shape (2, 3)"),
        (Reply("x", {**REF, "w": np.zeros((2, 2), np.float64)}, 5, {}), "dtype float64"),
        (Reply("x", {**REF, "w": np.array([[np.nan, 0], [0, 0]], np.float32)}, 5, {}), "NaN or inf"),
        (Reply("x", {**REF, "w": np.array([[np.inf, 0], [0, 0]], np.float32)}, 5, {}), "NaN or inf"),
        (Reply("x", dict(REF), 0, {}), "num-examples"),
        (Reply("x", dict(REF), 5, {"loss": float("nan")}), "metric 'loss'"),
    ],
)
def test_check_reply_rejects(bad, fragment):
    reason = check_reply(bad, REF)
    assert reason is not None and fragment in reason


def test_check_reply_accepts_a_good_reply():
    assert check_reply(reply("ok", [[1, 2], [3, 4]], 3), REF) is None


@pytest.mark.parametrize("threads", [1, 3])
def test_check_reply_names_the_first_array_that_is_not_finite_among_many_spans(threads):
    """The values are checked span by span on the aggregation threads: the reason names the
    first array, in the reference's order, with a NaN or inf anywhere in it (its last span
    included), as the check array by array did; an array of other layout after it does not
    hide it, one before it is named instead; complex, 0-d and empty arrays are checked too."""
    ref = {"a": np.zeros(3 * SPAN + 5, np.float32), "b": np.zeros((SPAN, 3), np.float64),
           "c": np.zeros(4, np.complex64), "d": np.array(0.5, np.float16), "e": np.zeros(0, np.float32),
           "n": np.zeros(7, np.int64)}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert check_reply(Reply("ok", {k: v.copy() for k, v in ref.items()}, 1, {}), ref) is None
        for key, where, value in (("a", -1, np.nan), ("a", SPAN, np.inf), ("b", -1, -np.inf),
                                  ("c", 2, complex(0, np.inf)), ("d", 0, np.inf)):
            arrays = {k: v.copy() for k, v in ref.items()}
            arrays[key][np.unravel_index(where % arrays[key].size, arrays[key].shape)] = value
            assert check_reply(Reply("x", arrays, 1, {}), ref) == f"array '{key}' contains NaN or inf", (key, where)
            later = {**arrays, "n": np.zeros(8, np.int64)}  # a wrong shape after it
            assert check_reply(Reply("x", later, 1, {}), ref) == f"array '{key}' contains NaN or inf"
            if key != "a":
                earlier = {**arrays, "a": np.zeros(3 * SPAN + 5, np.float64)}  # a wrong dtype before it
                assert check_reply(Reply("x", earlier, 1, {}), ref) == "array 'a' has dtype float64, expected float32"
    finally:
        torch.set_num_threads(saved)


def test_drift_diversity_hand_values():
    ref = {"w": np.zeros(2, np.float32)}
    # identical updates: sum ||m||^2 = 2, ||sum m||^2 = 4 -> 0.5
    same = [{"w": np.array([1.0, 0.0], np.float32)}] * 2
    assert drift_diversity(same, ref) == pytest.approx(0.5)
    # orthogonal updates: 2 / 2 = 1
    ortho = [{"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([0.0, 1.0], np.float32)}]
    assert drift_diversity(ortho, ref) == pytest.approx(1.0)


def test_weighted_average_keeps_shape_and_dtype_of_every_array_0d_included():
    """BatchNorm's num_batches_tracked is a 0-d int64: it must stay 0-d int64 (round 2 of
    every conv model failed when it came back as a numpy scalar / shape (1,))."""
    ref = {
        "count": np.array(0, np.int64),
        "flag": np.array(0, np.uint8),
        "scalar": np.array(0.0, np.float32),
        "w": np.zeros((3,), np.float64),
    }
    replies = [
        Reply(str(i), {"count": np.array(c, np.int64), "flag": np.array(1, np.uint8),
                       "scalar": np.array(s, np.float32), "w": np.full(3, s)}, n, {})
        for i, (c, s, n) in enumerate([(10, 1.0, 1), (20, 3.0, 3)])
    ]
    out = weighted_average(replies, ref)
    for key, value in ref.items():
        assert isinstance(out[key], np.ndarray), key
        assert out[key].shape == value.shape and out[key].dtype == value.dtype, key
    assert int(out["count"]) == 18  # rint(0.25 * 10 + 0.75 * 20) = rint(17.5) = 18 (half to even)
    assert float(out["scalar"]) == pytest.approx(2.5)
    # the aggregate is a valid reference for the next round: replies of the same layout pass
    assert all(check_reply(r, out) is None for r in replies)


def _plain_average(replies, reference):
    """The textbook form: every reply's float64 copy scaled and added in reply order."""
    total = float(sum(r.num_examples for r in replies))
    out = {}
    for key, ref in reference.items():
        acc = np.zeros(ref.shape, dtype=np.float64)
        for r in replies:
            acc += (r.num_examples / total) * r.arrays[key].astype(np.float64)
        if ref.dtype.kind in "iub":
            acc = np.rint(acc)
        out[key] = acc.astype(ref.dtype)
    return out


def _plain_drift(updates, reference):
    num, summed = 0.0, {}
    for w in updates:
        for key, ref in reference.items():
            if ref.dtype.kind in "fc":
                m = w[key].astype(np.float64) - ref.astype(np.float64)
                num += float(np.sum(m * m))
                summed[key] = summed.get(key, 0.0) + m
    den = float(sum(np.sum(v * v) for v in summed.values()))
    return num / den if den > 0 else float("nan")


BIG = 2 * SPAN + 12_345  # three spans, the last a short one


def _random_model(rng, scale=1.0):
    """Arrays of the kinds a state dict holds, of sizes that are not multiples of a vector width."""
    return {
        "conv": (rng.standard_normal((7, 3, 5, 5)) * scale).astype(np.float32),
        "bias": (rng.standard_normal(13) * scale).astype(np.float32),
        # values over many orders of magnitude: their differences' squares do not all fall on one
        # grid of float64 values, so another summation order shows in the last bits
        "big": (rng.standard_normal(BIG) * np.exp(rng.uniform(-7, 7, BIG)) * scale).astype(np.float32),
        "double": (rng.standard_normal((9, 11)) * scale).astype(np.float64),
        "half": (rng.standard_normal(17) * scale).astype(np.float16),
        "scalar": np.array(rng.standard_normal() * scale, np.float32),
        "tracked": np.array(int(rng.integers(0, 1000)), np.int64),
        "counts": rng.integers(0, 50, size=6).astype(np.int32),
    }


@pytest.mark.parametrize("clients", [1, 2, 7])
def test_average_and_drift_equal_their_textbook_forms_bit_for_bit(clients):
    """The server's blocked average gives every bit the plain formula gives (a run's history does
    not depend on how the server walks its memory, and is the one earlier versions wrote); the
    drift diagnostic, a ratio of dot products, agrees to its last digits."""
    rng = np.random.default_rng(clients)
    reference = _random_model(rng)
    replies = [Reply(str(i), {k: (v + _random_model(rng, 0.01)[k]).astype(v.dtype) for k, v in reference.items()},
                     float(rng.integers(1, 500)), {}) for i in range(clients)]
    fast, plain = weighted_average(replies, reference), _plain_average(replies, reference)
    assert list(fast) == list(plain)
    for key in plain:
        assert fast[key].dtype == plain[key].dtype and fast[key].shape == plain[key].shape, key
        assert fast[key].tobytes() == plain[key].tobytes(), key
    updates = [r.arrays for r in replies]
    assert drift_diversity(updates, reference) == pytest.approx(_plain_drift(updates, reference), rel=1e-12)


def test_the_thread_count_changes_no_bit_of_the_average_or_the_drift():
    """The spans are the same whatever the thread count and their results are added in span
    order: a server on 1 thread and one on 3 write the same round (the engines' histories are
    compared across different server thread counts)."""
    rng = np.random.default_rng(5)
    reference = _random_model(rng)
    replies = [Reply(str(i), {k: (v + _random_model(rng, 0.01)[k]).astype(v.dtype) for k, v in reference.items()},
                     float(i + 1), {}) for i in range(4)]
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append((weighted_average(replies, reference), drift_diversity([r.arrays for r in replies], reference)))
    finally:
        torch.set_num_threads(threads)
    (one, drift_one), (three, drift_three) = results
    assert drift_one == drift_three
    assert all(one[key].tobytes() == three[key].tobytes() for key in reference)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_averages_on_threads_of_its_own():
    """The aggregation threads are a process's own: a child forked after the parent used them
    (a user's multiprocessing with fork) averages a model large enough for threads, not waits
    forever on threads that exist only in its parent."""
    rng = np.random.default_rng(7)
    reference = _random_model(rng)
    replies = [Reply(str(i), {k: v.copy() for k, v in reference.items()}, 1.0, {}) for i in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        weighted_average(replies, reference)  # the parent's threads started
        pid = os.fork()
        if pid == 0:  # the child: exit 0 when its average is right
            torch.set_num_threads(2)
            out = weighted_average(replies, reference)
            os._exit(0 if all(out[k].tobytes() == reference[k].tobytes() for k in reference) else 1)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        if done == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's average did not finish in 20 s")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        torch.set_num_threads(threads)


def test_a_reply_of_another_shape_is_refused_not_folded_into_the_sum():
    """The spans copy flattened values, which would take a (2, 2) reply for a (4,) array or
    drop a fifth value: the shapes are compared first, as the plain loop's broadcasting did."""
    ref = {"w": np.zeros(4, np.float32)}
    for wrong in (np.zeros((2, 2), np.float32), np.zeros(5, np.float32)):
        with pytest.raises(ValueError, match=r"array 'w' has shape"):
            weighted_average([Reply("a", {"w": wrong}, 1.0, {})], ref)
        with pytest.raises(ValueError, match=r"array 'w' has shape"):
            drift_diversity([{"w": wrong}], ref)


def _spans_with_threads(work, size=4 * SPAN, threads=2):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return in_spans({"w": np.zeros(size, np.float32)}, work)
    finally:
        torch.set_num_threads(saved)


def test_spans_summed_from_inside_a_span_do_not_wait_forever():
    """A span's work that cuts spans of its own runs them on its thread: waiting there for the
    pool's threads, all busy with the outer spans, would wait forever."""
    outcome = []

    def outer(key, lo, hi):
        return sum(_spans_with_threads(lambda k, a, b: b - a, size=3 * SPAN))

    done = threading.Thread(target=lambda: outcome.append(_spans_with_threads(outer)), daemon=True)
    done.start()
    done.join(30)
    assert outcome == [[3 * SPAN] * 4], "in_spans called from a span's work did not finish in 30 s"


def test_a_failing_span_stops_the_others_and_its_error_is_raised_after_them():
    taken, running = [], []

    def work(key, lo, hi):
        running.append(1)
        try:
            taken.append(lo)
            time.sleep(0.05)
            if lo == 4 * SPAN:  # by then both threads are taking spans
                raise RuntimeError("span 4 broke")
        finally:
            running.pop()

    with pytest.raises(RuntimeError, match="span 4 broke"):
        _spans_with_threads(work, size=40 * SPAN)
    assert running == []  # no thread still working when the error came out
    assert len(taken) < 40  # the others stopped taking spans
