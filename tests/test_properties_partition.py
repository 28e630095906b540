"""Properties of every partition scheme over random label vectors, client counts and seeds,
each checked against a plain computation here: every sample in exactly one client, every
client's indices sorted int64, the same split for the same seed, the sizes each scheme
promises (iid: near-equal; shards: whole shards; dirichlet: min_size), and the label skew it
promises (shards: contiguous runs of the stably label-sorted pool, at most shards-per-client
classes when shards align with classes; noniid-labeldir: the documented class-to-client
assignment; dirichlet: the NIID-Bench cap)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from fedvls_flwr.data.partition import PartitionError, partition_indices
from tests.hypothesis_profiles import examples

FAST = examples(40)


@st.composite
def label_vectors(draw, min_size=1, max_size=120, max_classes=12):
    """Integer class ids, possibly unbalanced and with classes missing from the range."""
    classes = draw(st.integers(1, max_classes))
    return np.asarray(draw(st.lists(st.integers(0, classes - 1), min_size=min_size, max_size=max_size)),
                      dtype=np.int64)


def assert_exact_cover(parts: list[np.ndarray], n: int, num_partitions: int) -> None:
    """N sorted int64 arrays; every index 0..n-1 in exactly one of them."""
    assert len(parts) == num_partitions
    seen = np.zeros(n, dtype=np.int64)
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert all(int(a) < int(b) for a, b in zip(p[:-1], p[1:])), "indices not strictly increasing"
        for i in p.tolist():
            assert 0 <= i < n
            seen[i] += 1
    assert seen.tolist() == [1] * n, "a sample is missing or held twice"


def assert_same_split(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))


# ---------------------------------------------------------------------------------------- iid
@FAST
@given(labels=label_vectors(), data=st.data(), seed=st.integers(0, 2**31))
def test_iid_is_an_exact_cover_of_near_equal_parts_and_repeats_per_seed(labels, data, seed):
    n = labels.size
    clients = data.draw(st.integers(1, n), label="clients")
    parts = partition_indices(labels, clients, "iid", seed)
    assert_exact_cover(parts, n, clients)
    sizes = sorted(len(p) for p in parts)
    # n = q * clients + r: r clients hold q + 1 samples, the others q (every client >= 1)
    q, r = divmod(n, clients)
    assert sizes == [q] * (clients - r) + [q + 1] * r
    assert_same_split(parts, partition_indices(labels.tolist(), clients, "iid", seed))


# ------------------------------------------------------------------------------------- shards
def stable_rank(labels: np.ndarray) -> np.ndarray:
    """Position of every sample in the pool sorted by label, ties kept in pool order."""
    order = sorted(range(labels.size), key=lambda i: (int(labels[i]), i))
    rank = np.empty(labels.size, dtype=np.int64)
    for pos, i in enumerate(order):
        rank[i] = pos
    return rank


def runs(positions: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive integers in a sorted list."""
    out: list[list[int]] = []
    for p in positions:
        if out and p == out[-1][-1] + 1:
            out[-1].append(p)
        else:
            out.append([p])
    return out


@FAST
@given(labels=label_vectors(min_size=2), data=st.data(), seed=st.integers(0, 2**31))
def test_shards_are_whole_runs_of_the_label_sorted_pool(labels, data, seed):
    n = labels.size
    shards_per_client = data.draw(st.integers(1, 4), label="shards_per_client")
    assume(shards_per_client <= n)
    clients = data.draw(st.integers(1, n // shards_per_client), label="clients")
    parts = partition_indices(labels, clients, "shards", seed, shards_per_client=shards_per_client)
    assert_exact_cover(parts, n, clients)
    num_shards = clients * shards_per_client
    small, large = n // num_shards, -(-n // num_shards)  # shard sizes differ by at most one
    rank = stable_rank(labels)
    for p in parts:
        assert shards_per_client * small <= len(p) <= shards_per_client * large
        pieces = runs(sorted(int(rank[i]) for i in p))
        # s shards, each a contiguous slice of the sorted pool (neighbouring shards may join)
        assert 1 <= len(pieces) <= shards_per_client
        assert all(len(run) >= small for run in pieces)
    assert_same_split(parts, partition_indices(labels, clients, "shards", seed, shards_per_client=shards_per_client))


@FAST
@given(shard=st.integers(1, 6), clients=st.integers(1, 6), shards_per_client=st.integers(1, 3), data=st.data(),
       seed=st.integers(0, 2**31), shuffle_seed=st.integers(0, 100))
def test_aligned_shards_give_each_client_at_most_shards_per_client_classes(shard, clients, shards_per_client, data,
                                                                          seed, shuffle_seed):
    # the clients * s shards of `shard` samples each, grouped into classes of whole shards
    num_shards = clients * shards_per_client
    cuts = sorted(data.draw(st.sets(st.integers(1, num_shards - 1), max_size=num_shards - 1), label="cuts")) \
        if num_shards > 1 else []
    blocks = [b - a for a, b in zip([0, *cuts], [*cuts, num_shards])]
    labels = np.repeat(np.arange(len(blocks)), [b * shard for b in blocks])
    labels = labels[np.random.default_rng(shuffle_seed).permutation(labels.size)]
    parts = partition_indices(labels, clients, "shards", seed, shards_per_client=shards_per_client)
    assert_exact_cover(parts, labels.size, clients)
    for p in parts:
        assert len(p) == shards_per_client * shard
        assert len(set(labels[p].tolist())) <= shards_per_client


# ---------------------------------------------------------------------------- noniid-labeldir
def documented_holders(num_partitions: int, num_classes: int, s: int) -> list[list[int]] | None:
    """The module's rule, written out: class c goes to the first int(N / C * s) clients that
    still have room (each takes s classes); None where the rule cannot place a class."""
    per_class = int(num_partitions / num_classes * s)
    if per_class < 1:
        return None
    room = [s] * num_partitions
    holders = []
    for _ in range(num_classes):
        chosen = [j for j in range(num_partitions) if room[j] > 0][:per_class]
        if not chosen:
            return None
        for j in chosen:
            room[j] -= 1
        holders.append(chosen)
    return holders


@st.composite
def every_class_present(draw):
    """Class ids 0..C-1, each present at least once, in a shuffled pool."""
    counts = draw(st.lists(st.integers(1, 25), min_size=1, max_size=14))
    labels = np.repeat(np.arange(len(counts)), counts)
    return labels[np.random.default_rng(draw(st.integers(0, 100))).permutation(labels.size)]


@FAST
@given(labels=st.one_of(every_class_present(), label_vectors(max_classes=12)), data=st.data(),
       seed=st.integers(0, 2**31))
def test_noniid_labeldir_follows_the_documented_class_assignment(labels, data, seed):
    n, num_classes = labels.size, int(labels.max()) + 1
    most = min(n, 24)
    s = data.draw(st.integers(1, 4), label="classes_per_client")
    # steered: two times in three, the clients for int(N / C * s) = 2 holders per class, where the
    # sizes are drawn and a class is cut among several clients (with 3 or more holders of a 10-class
    # set the authors' draw mostly fails), where the pool allows it
    two, three = -(-2 * num_classes // s), -(-3 * num_classes // s)
    if two <= most and data.draw(st.sampled_from([True, True, False]), label="two holders"):
        clients = data.draw(st.integers(two, max(two, min(most, three - 1))), label="clients")
    else:
        clients = data.draw(st.one_of(st.integers(1, most), st.integers(min(num_classes, most), most)), label="clients")
    check_labeldir(labels, clients, s, seed)


@FAST
@given(counts=st.lists(st.integers(2, 30), min_size=11, max_size=20), s=st.integers(1, 3),
       extra=st.integers(0, 6), seed=st.integers(0, 2**31))
def test_noniid_labeldir_beyond_ten_classes_cuts_sizes_below_the_even_share(counts, s, extra, seed):
    # more than 10 classes, two or more holders per class: the non-last holders' sizes are
    # drawn below n_c / k
    labels = np.repeat(np.arange(len(counts)), counts)
    labels = labels[np.random.default_rng(seed % 1000).permutation(labels.size)]
    clients = min(labels.size, -(-2 * len(counts) // s) + extra)
    check_labeldir(labels, clients, s, seed)


def check_labeldir(labels: np.ndarray, clients: int, s: int, seed: int) -> None:
    n, num_classes = labels.size, int(labels.max()) + 1
    holders = documented_holders(clients, num_classes, s)
    if holders is None:
        event("no room for every class: refused")
        with pytest.raises(PartitionError):
            partition_indices(labels, clients, "noniid-labeldir", seed, shards_per_client=s)
        return
    try:
        parts = partition_indices(labels, clients, "noniid-labeldir", seed, shards_per_client=s)
    except PartitionError as err:  # the authors' draw can fail for > 2 holders of a 10-class set
        assert "could not be cut" in str(err)
        assume(False)
    event(f"{max(len(h) for h in holders)} holder(s) per class")
    assert_exact_cover(parts, n, clients)
    owner = np.empty(n, dtype=np.int64)
    for j, p in enumerate(parts):
        owner[p] = j
        assert len(set(labels[p].tolist())) <= s
    for c in range(num_classes):
        # in pool order, class c's samples go to its holders one after the other
        in_pool_order = owner[labels == c].tolist()
        assert set(in_pool_order) <= set(holders[c]), f"class {c} went to {set(in_pool_order)}, not {holders[c]}"
        positions = [holders[c].index(j) for j in in_pool_order]
        assert positions == sorted(positions), f"class {c}'s pieces are not consecutive slices in pool order"
        # all but the last holder draw a size in [max(n_c / k / 10, 10 / C), n_c) (C <= 10) or
        # [.., n_c / k) (C > 10), each bound cut to an integer; the last holder takes the rest
        n_c, k = len(in_pool_order), len(holders[c])
        low = int(max(n_c / k / 10, 10 / num_classes))
        high = max(int(n_c if num_classes <= 10 else n_c / k), low + 1)
        for j in holders[c][:-1]:
            assert low <= in_pool_order.count(j) < high
    assert_same_split(parts, partition_indices(labels, clients, "noniid-labeldir", seed, shards_per_client=s))


# ---------------------------------------------------------------------------------- dirichlet
@FAST
@given(labels=label_vectors(min_size=10, max_size=150, max_classes=8), data=st.data(), seed=st.integers(0, 2**31))
def test_dirichlet_honours_min_size_and_the_cap_and_repeats_per_seed(labels, data, seed):
    n = labels.size
    clients = data.draw(st.integers(1, min(10, n)), label="clients")
    min_size = data.draw(st.integers(0, n // (3 * clients)), label="min_size")
    beta = data.draw(st.sampled_from([0.1, 0.5, 1.0, 5.0]), label="beta")
    try:
        parts = partition_indices(labels, clients, "dirichlet", seed, dirichlet_beta=beta, min_size=min_size,
                                  max_redraws=200)
    except PartitionError as err:
        assert "min_size" in str(err)
        assume(False)
    assert_exact_cover(parts, n, clients)
    assert min(len(p) for p in parts) >= min_size
    cap = n / clients
    classes = sorted(set(labels.tolist()))
    for j, p in enumerate(parts):
        # classes are dealt in ascending order; a client already at >= n / N gets proportion 0.
        # The cut at floor(cumsum(p) * n_c) (NIID-Bench's) can still hand the last client one
        # sample when the float sum of the open proportions falls just short of 1.
        allowed = 1 if j == clients - 1 else 0
        held = 0
        for c in classes:
            count = int(np.sum(labels[p] == c))
            if held >= cap:
                assert count <= allowed, f"client {j} at {held} >= cap {cap} received {count} of class {c}"
            held += count
    again = partition_indices(labels, clients, "dirichlet", seed, dirichlet_beta=beta, min_size=min_size,
                              max_redraws=200)
    assert_same_split(parts, again)


@FAST
@given(labels=label_vectors(min_size=20, max_size=100, max_classes=6), seed=st.integers(0, 2**31))
def test_seeds_give_different_splits(labels, seed):
    """A seed that is ignored would pass every property above: two seeds, four clients."""
    for kind in ("iid", "shards", "dirichlet"):
        kwargs = {"min_size": 0} if kind == "dirichlet" else {}
        splits = [partition_indices(labels, 4, kind, s, **kwargs) for s in (seed, seed + 1, seed + 2)]
        assert not (all(np.array_equal(p, q) for p, q in zip(splits[0], splits[1]))
                    and all(np.array_equal(p, q) for p, q in zip(splits[0], splits[2]))), kind


def test_noniid_labeldir_leaves_the_clients_past_every_class_slot_empty():
    # 12 clients, 10 classes, s = 2: int(12 / 10 * 2) = 2 holders per class fill clients 0..9
    labels = np.repeat(np.arange(10), 30)
    parts = partition_indices(labels, 12, "noniid-labeldir", 0, shards_per_client=2)
    assert [len(p) for p in parts[10:]] == [0, 0]
    assert all(len(set(labels[p].tolist())) == 2 for p in parts[:10])
