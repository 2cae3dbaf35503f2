"""The epoch plan in O(shards + readers): one reader's ranges alone, the fast shard order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardpipes.plan.partition import (
    EpochLayout,
    SampleRange,
    partition_samples,
    reader_ranges,
    shard_order,
)
from shardpipes.plan.seeds import DEFAULT_SHUFFLE_BUFFER, buffered_shuffle, derive_seed


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 60), min_size=1, max_size=40),
    world=st.integers(1, 6),
    workers=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["drop", "pad"]),
)
def test_one_readers_ranges_are_its_piece_of_the_partition(counts, world, workers, seed, policy):
    p = partition_samples(
        counts, world_size=world, num_workers=workers, seed=seed, epoch=3, policy=policy
    )
    order = shard_order(len(counts), seed=seed, epoch=3)
    for reader in range(len(p.readers)):
        got = reader_ranges(counts, order, reader, len(p.readers), policy)
        assert tuple(got) == p.readers[reader]
        assert (
            tuple(
                reader_ranges(np.asarray(counts), np.asarray(order), reader, len(p.readers), policy)
            )
            == p.readers[reader]
        )


@pytest.mark.parametrize(
    ("n", "size"),
    [(0, 5), (3, 5), (5, 5), (6, 5), (50, 8), (1000, 10), (25_000, DEFAULT_SHUFFLE_BUFFER)],
    ids=str,
)
def test_shard_order_is_the_buffered_shuffle(n, size):
    from shardpipes.plan.partition import _shuffled_range

    for seed in (0, 7, derive_seed([1, 2, 0, 0])):
        assert _shuffled_range(n, seed, size) == list(buffered_shuffle(range(n), seed, size))


def test_shard_order_of_a_million_shards_is_a_permutation():
    order = shard_order(1_000_000, seed=3, epoch=1)
    assert np.array_equal(np.sort(np.asarray(order)), np.arange(1_000_000))


def test_layout_skips_empty_shards_and_wraps():
    layout = EpochLayout([0, 2, 0, 3, 0], [4, 3, 2, 1, 0])
    assert layout.total == 5
    assert layout.ranges(1, 7) == [SampleRange(3, 1, 3), SampleRange(1, 0, 2), SampleRange(3, 0, 2)]
    assert layout.shard_at(3) == (1, 0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([3, 1], [0, 1], 2, 2, "drop"), r"reader \(2\) should be smaller than readers \(2\)"),
        (([3, 1], [0, 1], 0, 2, "even"), r"policy 'even' is not known"),
        (([3, True], None, 0, 2, "drop"), r"counts\[1\] should be an int, got bool"),
        (([3, 1], [0, 0], 0, 2, "drop"), r"not a permutation of range\(2\)"),
    ],
    ids=["reader", "policy", "bool-count", "order"],
)
def test_reader_ranges_rejects_bad_arguments(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        reader_ranges(*args)


def test_elastic_resume_at_a_billion_samples_plans_one_reader():
    # From 4096x8 readers to 2048x8 with a shuffle buffer of 1000: the unread samples of the
    # 32768 old readers are about 33M positions; a new reader's piece needs only the few old
    # readers it covers (this took 12 s and 3 GB when every old reader was planned).
    from shardpipes.plan.resume import Segment, Shape, reader_plan

    shape = Shape(batch_size=32, drop_last=False, buffer_size=1000, shuffle_stage=1)
    segs = [Segment(4096, 8, True, 200), Segment(2048, 8, True, 0)]
    plans = [
        reader_plan(10**9, "drop", segs, r, shape, lambda path: derive_seed([1, *path]))
        for r in (0, 1, 16383)
    ]
    unread = 10**9 // 32768 * 32768 - 4096 * 200 * 32  # minus 200 batches of 32 per old rank
    per = plans[0].samples
    assert {p.samples for p in plans} == {per} and per * 16384 <= unread < (per + 1) * 16384
    assert all(len(p.buffer) == 0 and p.first_draw == 0 for p in plans)  # a fresh segment
    first = plans[0].rest.runs
    assert first[0][0] < plans[1].rest.runs[0][0] < plans[2].rest.runs[0][0]
