"""Properties of the seeded client sample over random node ids, partitions, fractions, seeds and
rounds: max(1, floor(n * fraction)) distinct nodes of the federation, sorted; the same nodes
again for the same (seed, round); other nodes from round to round; and the same partitions
whatever node ids Flower gave the nodes, in whatever order it lists them."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from fedvls_flwr.algorithms.sampling import clients_per_round, sample_nodes
from tests.hypothesis_profiles import examples

FAST = examples(60)

# Flower's node ids: random unsigned 64-bit integers
NODE_ID = st.integers(1, 2**63 - 1)


@st.composite
def federations(draw, min_nodes=1, max_nodes=40):
    """(node ids, node id -> partition id): each node holds its own partition 0..n-1."""
    ids = draw(st.lists(NODE_ID, min_size=min_nodes, max_size=max_nodes, unique=True))
    partitions = list(range(len(ids)))
    random.Random(draw(st.integers(0, 1000))).shuffle(partitions)
    return ids, dict(zip(ids, partitions))


# fraction-train as written in a run config: 0.01 .. 1.00
PERCENT = st.integers(1, 100)


def test_clients_per_round_is_the_floor_of_the_fraction_and_at_least_one():
    # every fraction-train of up to three decimals, every federation of up to 120 nodes: the
    # floor of n * fraction in exact integers (0.29 * 100 is 28.999999999999996 in floats)
    for permille in range(1, 1001):
        for nodes in range(1, 121):
            assert clients_per_round(permille / 1000, nodes) == max(1, nodes * permille // 1000), (permille, nodes)


@FAST
@given(federation=federations(), percent=PERCENT, seed=st.integers(0, 2**31), server_round=st.integers(1, 5000))
def test_a_sample_is_the_right_number_of_distinct_nodes_sorted_and_repeatable(federation, percent, seed,
                                                                             server_round):
    ids, partitions = federation
    got = sample_nodes(ids, partitions, percent / 100, seed, server_round)
    assert len(got) == max(1, len(ids) * percent // 100)
    assert len(set(got)) == len(got) and set(got) <= set(ids)
    assert got == sorted(got)
    assert got == sample_nodes(list(reversed(ids)), dict(partitions), percent / 100, seed, server_round)


@FAST
@given(federation=federations(min_nodes=2), percent=st.integers(1, 99), seed=st.integers(0, 2**31),
       relabel_seed=st.integers(0, 1000), server_round=st.integers(1, 5000), data=st.data())
def test_the_sampled_partitions_do_not_depend_on_flowers_node_ids(federation, percent, seed, relabel_seed,
                                                                  server_round, data):
    ids, partitions = federation
    # the same federation in another run: every node another random id, listed in another order
    new_ids = data.draw(st.lists(NODE_ID, min_size=len(ids), max_size=len(ids), unique=True), label="new ids")
    rename = dict(zip(ids, new_ids))
    listed = list(new_ids)
    random.Random(relabel_seed).shuffle(listed)
    renamed_partitions = {rename[n]: p for n, p in partitions.items()}

    first = sample_nodes(ids, partitions, percent / 100, seed, server_round)
    second = sample_nodes(listed, renamed_partitions, percent / 100, seed, server_round)
    assert sorted(partitions[n] for n in first) == sorted(renamed_partitions[n] for n in second)


@FAST
@given(federation=federations(min_nodes=2), percent=st.integers(1, 99), seed=st.integers(0, 2**31))
def test_the_sample_changes_from_round_to_round_and_seed_to_seed(federation, percent, seed):
    ids, partitions = federation
    k = max(1, len(ids) * percent // 100)
    if k >= len(ids):
        return  # everyone trains: nothing to draw
    by_round = {tuple(sample_nodes(ids, partitions, percent / 100, seed, r)) for r in range(1, 41)}
    assert len(by_round) > 1, "every round trained the same clients"
    by_seed = {tuple(sample_nodes(ids, partitions, percent / 100, s, 7)) for s in range(seed, seed + 40)}
    assert len(by_seed) > 1, "every seed trained the same clients"


@FAST
@given(federation=federations(min_nodes=2), percent=st.integers(1, 100), seed=st.integers(0, 2**31),
       server_round=st.integers(1, 500), unknown=st.lists(NODE_ID, max_size=5, unique=True))
def test_nodes_without_a_known_partition_are_sampled_too(federation, percent, seed, server_round, unknown):
    ids, partitions = federation
    everyone = ids + [n for n in unknown if n not in partitions]
    got = sample_nodes(everyone, partitions, percent / 100, seed, server_round)
    assert len(got) == max(1, len(everyone) * percent // 100)
    assert set(got) <= set(everyone) and got == sorted(got)
