"""Sample-level partitions: exact coverage, equal lengths, determinism (shardpipes.plan.partition)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

from _hyp import budget
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.plan.partition import (
    SampleRange,
    assign_shards,
    partition_samples,
    positions_to_ranges,
    reader_index,
    shard_order,
    summarize,
)

counts_st = st.lists(st.integers(0, 200), min_size=1, max_size=50)
topology_st = st.tuples(st.integers(1, 8), st.integers(0, 4))
seed_st = st.integers(0, 2**32 - 1)
epoch_st = st.integers(0, 1000)


def _reads(counts: list[int], readers) -> list[np.ndarray]:
    """How many times each sample of each shard is read."""
    hits = [np.zeros(n, dtype=np.int64) for n in counts]
    for ranges in readers:
        for shard, start, stop in ranges:
            hits[shard][start:stop] += 1
    return hits


@settings(max_examples=budget(400), deadline=None)
@given(
    counts=counts_st,
    topology=topology_st,
    seed=seed_st,
    epoch=epoch_st,
    policy=st.sampled_from(["drop", "pad"]),
)
def test_partition_covers_every_sample_once_with_equal_lengths(
    counts, topology, seed, epoch, policy
):
    world, workers = topology
    readers = world * max(workers, 1)
    total = sum(counts)
    p = partition_samples(
        counts, world_size=world, num_workers=workers, seed=seed, epoch=epoch, policy=policy
    )

    assert len(p.readers) == readers
    assert p.total == total
    # Ranges are non-empty and inside their shard.
    for ranges in p.readers:
        for r in ranges:
            assert 0 <= r.start < r.stop <= counts[r.shard]
    # Every reader, and so every rank, reads the same number of samples.
    per = total // readers if policy == "drop" else math.ceil(total / readers)
    assert p.per_reader == per
    assert [sum(r.num_samples for r in ranges) for ranges in p.readers] == [per] * readers
    summary = p.summary()
    assert summary.per_rank == (per * max(workers, 1),) * world
    # Coverage.
    hits = np.concatenate(_reads(counts, p.readers)) if total else np.zeros(0, np.int64)
    if policy == "drop":
        assert p.dropped == total % readers and p.padded == 0
        assert hits.max(initial=0) <= 1
        assert int(hits.sum()) == total - p.dropped
        assert summary.distinct == total - p.dropped
    else:
        assert p.padded == per * readers - total and p.padded < readers and p.dropped == 0
        assert total == 0 or hits.min() >= 1
        assert int(hits.sum()) == total + p.padded
        assert summary.distinct == total


@settings(max_examples=budget(300), deadline=None)
@given(
    counts=counts_st,
    topology=topology_st,
    seed=seed_st,
    epoch=epoch_st,
    policy=st.sampled_from(["drop", "pad"]),
)
def test_each_reader_reads_one_contiguous_piece_of_the_epoch_sequence(
    counts, topology, seed, epoch, policy
):
    world, workers = topology
    p = partition_samples(
        counts, world_size=world, num_workers=workers, seed=seed, epoch=epoch, policy=policy
    )
    total = sum(counts)
    start_of = {}  # position of each shard's first sample in the epoch's concatenated sequence
    pos = 0
    for shard in p.order:
        start_of[shard] = pos
        pos += counts[shard]
    for i, ranges in enumerate(p.readers):
        positions = [start_of[s] + k for s, a, b in ranges for k in range(a, b)]
        assert positions == [(i * p.per_reader + k) % total for k in range(p.per_reader)]
        # Contiguous pieces: at most one range per shard, plus one where the sequence wraps.
        assert len(ranges) <= sum(1 for c in counts if c) + 1


@settings(max_examples=budget(60), deadline=None)
@given(counts=counts_st, topology=topology_st, seed=seed_st, epoch=epoch_st)
def test_same_seed_and_epoch_give_the_same_partition(counts, topology, seed, epoch):
    world, workers = topology
    a = partition_samples(counts, world_size=world, num_workers=workers, seed=seed, epoch=epoch)
    b = partition_samples(
        list(counts), world_size=world, num_workers=workers, seed=seed, epoch=epoch
    )
    assert a == b
    assert sorted(a.order) == list(range(len(counts)))


@settings(max_examples=budget(60), deadline=None)
@given(
    counts=st.lists(st.integers(1, 200), min_size=3, max_size=50),
    topology=topology_st,
    seed=seed_st,
)
# Found by a random run: 3 samples, 4 readers, "drop": every reader is empty in every epoch.
@example(counts=[1, 1, 1], topology=(1, 4), seed=0)
def test_shard_order_changes_across_epochs(counts, topology, seed):
    world, workers = topology
    parts = [
        partition_samples(counts, world_size=world, num_workers=workers, seed=seed, epoch=e)
        for e in range(10)
    ]
    # With >= 3 shards two epochs share an order with probability <= 1/6; all ten with ~1e-7.
    assert len({p.order for p in parts}) > 1
    if parts[0].per_reader == 0:
        # Fewer samples than readers under "drop": nobody reads anything, in any epoch, so
        # there is nothing that could change. Whenever a reader reads, the readings must move.
        assert all(not ranges for p in parts for ranges in p.readers)
    else:
        assert len({p.readers for p in parts}) > 1


def test_consecutive_epochs_rarely_repeat_the_order():
    same = sum(
        shard_order(5, seed=7, epoch=e) == shard_order(5, seed=7, epoch=e + 1) for e in range(600)
    )
    assert same < 25  # expected 600 / 5! = 5


def test_other_seed_gives_another_order():
    assert shard_order(20, seed=1, epoch=0) != shard_order(20, seed=2, epoch=0)


def test_no_shuffle_keeps_the_shard_order():
    p = partition_samples([2, 3, 4], world_size=1, num_workers=2, seed=5, epoch=9, shuffle=False)
    assert p.order == (0, 1, 2)
    assert p.readers == (
        (SampleRange(0, 0, 2), SampleRange(1, 0, 2)),
        (SampleRange(1, 2, 3), SampleRange(2, 0, 3)),
    )
    assert p.dropped == 1


def test_one_shard_split_between_more_readers_than_shards():
    p = partition_samples([10], world_size=4, num_workers=2, shuffle=False)
    assert [list(r) for r in p.readers] == [[SampleRange(0, i, i + 1)] for i in range(8)]
    assert p.dropped == 2
    assert p.reader(3, 1) == (SampleRange(0, 7, 8),)


def test_pad_repeats_the_first_samples_of_the_epoch():
    p = partition_samples([3, 4], world_size=3, num_workers=0, shuffle=False, policy="pad")
    assert p.readers[-1] == (SampleRange(1, 3, 4), SampleRange(0, 0, 2))
    assert p.padded == 2


def test_summary_warns_when_readers_would_idle():
    p = partition_samples([1, 2], world_size=2, num_workers=2, policy="drop")
    s = p.summary()
    assert s.idle == (0, 1, 2, 3) and p.dropped == 3
    assert s.warning is not None and "4 of 4 readers would idle" in s.warning


def test_summary_warns_when_padded_readers_read_only_repeats():
    s = partition_samples([3], world_size=4, num_workers=0, policy="pad").summary()
    assert s.idle == () and s.repeat_only == 1
    assert s.warning is not None and "only 3 distinct samples for 4 readers" in s.warning


def test_summary_of_a_balanced_partition_has_no_warning():
    s = partition_samples([50, 50], world_size=2, num_workers=2).summary()
    assert s.per_rank == (50, 50) and s.warning is None


def test_summarize_takes_plain_tuples_and_flags_unequal_ranks():
    s = summarize([[(0, 0, 3)], [(1, 0, 1)]], world_size=2, num_workers=0)
    assert s.per_rank == (3, 1)
    assert s.warning is not None and "unequal" in s.warning


def test_summarize_checks_the_reader_count():
    with pytest.raises(
        ValueError,
        match=r"ranges for 3 readers; world_size \(2\) x max\(num_workers, 1\) \(2\) = 4",
    ):
        summarize([[], [], []], world_size=2, num_workers=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 0}, ValueError, r"world_size \(0\) should be >= 1"),
        ({"num_workers": -1}, ValueError, r"num_workers \(-1\) should be >= 0"),
        ({"policy": "even"}, ValueError, r"policy 'even' is not known; must be one of drop, pad"),
        ({"counts": [3, -1]}, ValueError, r"counts\[1\] \(-1\) should be >= 0"),
        ({"counts": [3, 1.5]}, TypeError, r"counts\[1\] should be an int, got float"),
        ({"seed": -2}, ValueError, r"seed \(-2\) should be >= 0"),
        ({"world_size": True}, TypeError, r"world_size should be an int, got bool"),
    ],
    ids=["world0", "workers-neg", "policy", "count-neg", "count-float", "seed-neg", "world-bool"],
)
def test_partition_rejects_bad_arguments(kwargs, error, match):
    args = {"counts": [3, 4], "world_size": 2, "num_workers": 1, **kwargs}
    counts = args.pop("counts")
    with pytest.raises(error, match=match):
        partition_samples(counts, **args)


def test_positions_to_ranges_wraps_around():
    assert positions_to_ranges([2, 3], [1, 0], 4, 8) == [SampleRange(0, 1, 2), SampleRange(1, 0, 3)]
    with pytest.raises(ValueError, match=r"not a permutation of range\(2\)"):
        positions_to_ranges([2, 3], [1, 1], 0, 1)


@pytest.mark.parametrize("world,workers", [(1, 0), (1, 3), (2, 0), (3, 4)], ids=str)
def test_reader_index_matches_torch_sharding_filter(world, workers):
    for rank in range(world):
        for worker in range(max(workers, 1)):
            dp = IterableWrapper(range(100)).sharding_filter()
            dp.apply_sharding(world, rank, SHARDING_PRIORITIES.DISTRIBUTED)
            if workers:
                dp.apply_sharding(workers, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
            first = next(iter(dp))  # item i goes to instance i % readers
            assert reader_index(rank, worker, world_size=world, num_workers=workers) == first


def test_reader_index_rejects_out_of_range():
    with pytest.raises(ValueError, match=r"rank \(2\) should be smaller than world_size \(2\)"):
        reader_index(2, 0, world_size=2, num_workers=1)


@settings(max_examples=budget(60), deadline=None)
@given(num_shards=st.integers(0, 50), topology=topology_st, seed=seed_st, epoch=epoch_st)
def test_assign_shards_gives_every_shard_to_one_reader_round_robin(
    num_shards, topology, seed, epoch
):
    world, workers = topology
    readers = world * max(workers, 1)
    a = assign_shards(num_shards, world_size=world, num_workers=workers, seed=seed, epoch=epoch)
    assert len(a) == readers
    assert sorted(s for shards in a for s in shards) == list(range(num_shards))
    order = shard_order(num_shards, seed=seed, epoch=epoch)
    for r, shards in enumerate(a):
        assert shards == [order[i] for i in range(r, num_shards, readers)]
