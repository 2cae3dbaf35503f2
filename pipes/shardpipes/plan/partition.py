"""Exact sample-level partitions of an indexed dataset across ranks and workers.

Pure functions of integers (no I/O, no global state): given the sample count of every shard,
the topology (``world_size`` ranks x ``num_workers`` workers) and ``(seed, epoch)``, they say
which contiguous sample ranges each reader reads in that epoch.

How a partition is made:

1. The shard order of the epoch is the one the loader's shard-level ``shuffle()`` gives,
   seeded from ``numpy.random.SeedSequence([seed, epoch, 0, 0])``: identical on every rank,
   new every epoch (``shuffle=False`` keeps the given order).
2. The shards' samples are concatenated in that order into one sequence of ``total`` samples.
3. The sequence is cut into ``readers = world_size * max(num_workers, 1)`` equal contiguous
   pieces, reader ``rank * max(num_workers, 1) + worker`` taking piece number ``reader``
   (rank-major, worker-minor: the mixed radix of torch's ``sharding_filter``).

So a reader reads a few contiguous runs (one per shard its piece touches), every rank gets the
same number of samples, and every sample appears exactly once per epoch, up to the policy:

- ``"drop"``: each reader gets ``total // readers`` samples; the last ``total % readers``
  samples of the epoch's sequence (fewer than ``readers``, and other ones every epoch since
  the shard order changes) are dropped and reported in :attr:`Partition.dropped`.
- ``"pad"``: each reader gets ``ceil(total / readers)`` samples; the sequence is read
  circularly, so the shortfall (fewer than ``readers`` samples) repeats the first samples of
  the epoch's sequence, as ``torch.utils.data.DistributedSampler`` pads.

Shards with fewer samples than readers, or fewer shards than readers, are fine: a shard is
simply split between readers.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shardpipes.plan.readers import POLICIES, check_int, per_reader, reader_count, reader_index
from shardpipes.plan.seeds import DEFAULT_SHUFFLE_BUFFER, derive_seed, shuffle_draws

__all__ = [
    "POLICIES",
    "EpochLayout",
    "Partition",
    "PartitionSummary",
    "SampleRange",
    "assign_shards",
    "partition_samples",
    "positions_to_ranges",
    "reader_index",
    "reader_ranges",
    "shard_order",
    "summarize",
]


class SampleRange(NamedTuple):
    """Samples ``start`` (inclusive) to ``stop`` (exclusive) of shard number ``shard``.

    ``shard`` indexes the list of sample counts the partition was made from (for example
    :attr:`shardpipes.index.ShardIndex.shards`), not the shuffled order.
    """

    shard: int
    start: int
    stop: int

    @property
    def num_samples(self) -> int:
        """``stop - start``."""
        return self.stop - self.start


def _check_counts(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """``counts`` as an int64 array, after the checks of ``check_int`` (vectorized when it can)."""
    arr = None
    if isinstance(counts, np.ndarray) or not any(type(c) is bool for c in counts):
        try:
            arr = np.asarray(counts)
        except (TypeError, ValueError):
            arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu" and len(arr) == len(counts):
        bad = np.flatnonzero(arr < 0)
        if not bad.size:
            return arr.astype(np.int64, copy=False)
        i = int(bad[0])
        check_int(f"counts[{i}]", int(arr[i]), 0)
    # Something else in there (bools make an int array too: find them the slow way).
    return np.asarray(
        [check_int(f"counts[{i}]", c, 0) for i, c in enumerate(counts)], dtype=np.int64
    )


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Return the order of the shards in epoch ``epoch``: a permutation of ``range(num_shards)``.

    Exactly the order the loader reads when the graph's shard-level shuffle is its first random
    stage from the source side, as in ``IterableWrapper(urls).shuffle().sharding_filter()``
    (with ``shuffle()``'s default buffer): that stage is seeded with
    ``SeedSequence([seed, epoch, 0, 0])`` on every rank and worker. ``shuffle=False`` returns
    ``range(num_shards)``.

    Raises:
        ValueError: A negative ``num_shards``, ``seed`` or ``epoch``.

    Examples:
        >>> sorted(shard_order(5, seed=0, epoch=3))
        [0, 1, 2, 3, 4]
        >>> shard_order(3, seed=0, epoch=0, shuffle=False)
        [0, 1, 2]
    """
    num_shards = check_int("num_shards", num_shards, 0)
    seed = check_int("seed", seed, 0)
    epoch = check_int("epoch", epoch, 0)
    if not shuffle:
        return list(range(num_shards))
    return _shuffled_range(num_shards, derive_seed([seed, epoch, 0, 0]), DEFAULT_SHUFFLE_BUFFER)


def _shuffled_range(n: int, seed: int, size: int) -> list[int]:
    """``list(buffered_shuffle(range(n), seed, size))``, with the draws made in one numpy call.

    The same draws in the same order as :func:`shardpipes.plan.seeds.buffered_shuffle`: the
    steady phase (one draw per input after the buffer fills), then the drain.
    """
    steady: list[int] = []
    if n <= size:
        buffer = list(range(n))
    else:
        buffer = list(range(size))
        slots = (shuffle_draws(seed, 0, n - size) * size).astype(np.int64).tolist()
        append = steady.append
        for x, idx in zip(range(size, n), slots, strict=True):
            append(buffer[idx])
            buffer[idx] = x
    drain = shuffle_draws(seed, len(steady), len(buffer)).tolist()
    steady.extend(buffer.pop(int(f * len(buffer))) for f in drain)
    return steady


class EpochLayout:
    """The samples of an epoch laid end to end: shards ``order[0]``, ``order[1]``, ... .

    Prefix sums over the shard order, made once per epoch in ``O(shards)``; then any stretch
    of positions maps to its per-shard ranges in ``O(log shards + ranges)`` (a bisection), so
    a reader's ranges never need every reader's.

    Examples:
        >>> layout = EpochLayout([3, 0, 4], [2, 1, 0])
        >>> layout.total, layout.ranges(2, 6)
        (7, [SampleRange(shard=2, start=2, stop=4), SampleRange(shard=0, start=0, stop=2)])
    """

    def __init__(
        self, counts: Sequence[int] | np.ndarray, order: Sequence[int] | np.ndarray | None = None
    ) -> None:
        counts_arr = _check_counts(counts)
        n = len(counts_arr)
        if order is None:
            order_arr = np.arange(n, dtype=np.int64)
        else:
            order_arr = np.asarray(order, dtype=np.int64)
            if (
                order_arr.shape != (n,)
                or (n and (order_arr.min() < 0 or order_arr.max() >= n))
                or (np.bincount(order_arr, minlength=n) != 1).any()
            ):
                raise ValueError(f"order {list(order)!r} is not a permutation of range({n})")
        self.counts = counts_arr
        self.order = order_arr
        #: ``ends[k]``: the position after the last sample of shard ``order[k]``.
        self.ends = np.cumsum(counts_arr[order_arr], dtype=np.int64)
        self.total = int(self.ends[-1]) if n else 0

    def shard_at(self, position: int) -> tuple[int, int]:
        """``(shard, sample)`` at ``position`` (``0 <= position < total``)."""
        k = int(np.searchsorted(self.ends, position, side="right"))
        shard = int(self.order[k])
        return shard, position - int(self.ends[k] - self.counts[shard])

    def ranges(self, start: int, stop: int) -> list[SampleRange]:
        """Positions ``[start, stop)`` (read circularly) as per-shard ranges, in reading order."""
        start = check_int("start", start, 0)
        stop = check_int("stop", stop, 0)
        if stop < start:
            raise ValueError(f"stop ({stop}) should be >= start ({start})")
        if stop == start:
            return []
        total = self.total
        if total == 0:
            raise ValueError(f"positions [{start}, {stop}) asked of a dataset with no samples")
        out: list[SampleRange] = []
        pos = start
        while pos < stop:
            lo = pos % total  # one lap of the circular sequence at a time
            hi = min(total, lo + (stop - pos))
            # Shards order[k0 .. k1] hold positions lo .. hi - 1 (empty shards skipped).
            k0, k1 = np.searchsorted(self.ends, [lo, hi - 1], side="right").tolist()
            shards = self.order[k0 : k1 + 1]
            ends = self.ends[k0 : k1 + 1].tolist()
            for shard, end, n in zip(
                shards.tolist(), ends, self.counts[shards].tolist(), strict=True
            ):
                if n:
                    first = end - n
                    out.append(SampleRange(shard, max(lo, first) - first, min(hi, end) - first))
            pos += hi - lo
        return _merge(out)


def reader_ranges(
    counts: Sequence[int] | np.ndarray,
    order: Sequence[int] | np.ndarray | None,
    reader: int,
    readers: int,
    policy: str = "drop",
) -> list[SampleRange]:
    """The ranges of reader ``reader`` of ``readers`` alone: piece ``reader`` of the epoch.

    The same as ``partition_samples(...).readers[reader]`` for that epoch's ``order``
    (``None``: the given order), in ``O(shards + its ranges)``.

    Examples:
        >>> reader_ranges([4, 3], None, 1, 2)
        [SampleRange(shard=0, start=3, stop=4), SampleRange(shard=1, start=0, stop=2)]
    """
    readers = check_int("readers", readers, 1)
    reader = check_int("reader", reader, 0)
    if reader >= readers:
        raise ValueError(f"reader ({reader}) should be smaller than readers ({readers})")
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not known; must be one of {', '.join(POLICIES)}")
    layout = EpochLayout(counts, order)
    per = per_reader(layout.total, readers, policy)
    return layout.ranges(reader * per, (reader + 1) * per)


def positions_to_ranges(
    counts: Sequence[int], order: Sequence[int], start: int, stop: int
) -> list[SampleRange]:
    """Map positions ``[start, stop)`` of the epoch's sample sequence to per-shard ranges.

    The sequence is the samples of ``counts[order[0]]``, then ``counts[order[1]]``, ... and is
    read circularly: position ``p`` is sample ``p % total``. Ranges come in reading order;
    empty shards never appear.

    Raises:
        ValueError: ``stop < start``, or positions asked of an empty dataset.

    Examples:
        >>> positions_to_ranges([3, 0, 4], [2, 1, 0], 2, 6)
        [SampleRange(shard=2, start=2, stop=4), SampleRange(shard=0, start=0, stop=2)]
        >>> positions_to_ranges([3], [0], 2, 5)  # past the end: wraps around
        [SampleRange(shard=0, start=2, stop=3), SampleRange(shard=0, start=0, stop=2)]
    """
    return EpochLayout(counts, order).ranges(start, stop)


def _merge(ranges: list[SampleRange]) -> list[SampleRange]:
    """Join ranges that continue each other in the same shard (only across a lap boundary)."""
    out: list[SampleRange] = []
    for r in ranges:
        if out and out[-1].shard == r.shard and out[-1].stop == r.start:
            out[-1] = SampleRange(r.shard, out[-1].start, r.stop)
        else:
            out.append(r)
    return out


@dataclass(frozen=True)
class Partition:
    """Who reads what in one epoch: the result of :func:`partition_samples`.

    Attributes:
        readers: For each reader (rank-major, worker-minor), its sample ranges in reading order.
        world_size: Ranks.
        num_workers: Workers per rank (``0``: one reader per rank).
        policy: ``"drop"`` or ``"pad"``.
        order: The epoch's shard order.
        total: Samples in the dataset.
        per_reader: Samples every reader reads.
        dropped: Samples no reader reads this epoch (``"drop"``; always ``< len(readers)``).
        padded: Repeated samples read this epoch (``"pad"``; always ``< len(readers)``).

    Examples:
        >>> p = partition_samples([5, 5], world_size=2, num_workers=0, shuffle=False)
        >>> p.reader(1, 0)
        (SampleRange(shard=1, start=0, stop=5),)
    """

    readers: tuple[tuple[SampleRange, ...], ...]
    world_size: int
    num_workers: int
    policy: str
    order: tuple[int, ...]
    total: int
    per_reader: int
    dropped: int
    padded: int

    def reader(self, rank: int, worker: int = 0) -> tuple[SampleRange, ...]:
        """Return the ranges of ``(rank, worker)``."""
        i = reader_index(rank, worker, world_size=self.world_size, num_workers=self.num_workers)
        return self.readers[i]

    def summary(self) -> PartitionSummary:
        """Return :func:`summarize` of this partition."""
        return summarize(self.readers, world_size=self.world_size, num_workers=self.num_workers)


def partition_samples(
    counts: Sequence[int],
    *,
    world_size: int,
    num_workers: int,
    seed: int = 0,
    epoch: int = 0,
    policy: str = "drop",
    shuffle: bool = True,
) -> Partition:
    """Split the samples of shards with ``counts`` samples into equal contiguous pieces, one per reader.

    See the module docstring for the method and the two policies.

    Args:
        counts: Samples in each shard (as :attr:`shardpipes.index.ShardIndex.counts` gives).
        world_size: Ranks, ``>= 1``.
        num_workers: Worker processes per rank; ``0`` means the rank reads in its main process.
        seed: Loader seed, ``>= 0``. Default: ``0``.
        epoch: Epoch number, ``>= 0``. Default: ``0``.
        policy: ``"drop"`` or ``"pad"``. Default: ``"drop"``.
        shuffle: Shuffle the shard order per ``(seed, epoch)``. Default: ``True``.

    Returns:
        Partition: The ranges of every reader, with the counts of dropped and padded samples.

    Raises:
        ValueError: A negative count, ``world_size < 1``, or an unknown policy.
        TypeError: A count or topology value that is not an int.

    Examples:
        >>> p = partition_samples([4, 3], world_size=2, num_workers=0, shuffle=False)
        >>> [list(r) for r in p.readers], p.dropped
        ([[SampleRange(shard=0, start=0, stop=3)], [SampleRange(shard=0, start=3, stop=4), SampleRange(shard=1, start=0, stop=2)]], 1)
        >>> partition_samples([4, 3], world_size=2, num_workers=0, shuffle=False, policy="pad").padded
        1
    """
    counts_arr = _check_counts(counts)
    world_size = check_int("world_size", world_size, 1)
    num_workers = check_int("num_workers", num_workers, 0)
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not known; must be one of {', '.join(POLICIES)}")
    order = shard_order(len(counts_arr), seed=seed, epoch=epoch, shuffle=shuffle)
    readers = reader_count(world_size, num_workers)
    layout = EpochLayout(counts_arr, order)  # O(shards) once; each reader's piece by bisection
    total = layout.total
    per = per_reader(total, readers, policy)
    # Millions of small acyclic tuples: the cycle collector would rescan them again and again.
    paused = gc.isenabled()
    gc.disable()
    try:
        pieces = tuple(tuple(layout.ranges(r * per, (r + 1) * per)) for r in range(readers))
    finally:
        if paused:
            gc.enable()
    used = per * readers
    return Partition(
        readers=pieces,
        world_size=world_size,
        num_workers=num_workers,
        policy=policy,
        order=tuple(order),
        total=total,
        per_reader=per,
        dropped=max(total - used, 0),
        padded=max(used - total, 0),
    )


@dataclass(frozen=True)
class PartitionSummary:
    """Totals of a partition, and whether some readers would idle.

    Attributes:
        per_reader: Samples of each reader (rank-major, worker-minor).
        per_rank: Samples of each rank (the sum over its workers).
        total: Samples read, repeats included.
        distinct: Distinct samples read.
        idle: Readers with no samples at all.
        repeat_only: The number of readers beyond ``distinct``: with fewer distinct samples
            than readers, that many readers (at least) read nothing new.
    """

    per_reader: tuple[int, ...]
    per_rank: tuple[int, ...]
    total: int
    distinct: int
    idle: tuple[int, ...]
    repeat_only: int

    @property
    def warning(self) -> str | None:
        """A sentence on readers that would idle or read only repeats, else ``None``."""
        readers = len(self.per_reader)
        if self.idle:
            return (
                f"{len(self.idle)} of {readers} readers would idle (no samples); only "
                f"{self.distinct} distinct samples for {readers} readers: use fewer ranks or "
                "workers, or the 'pad' policy"
            )
        if self.repeat_only:
            return (
                f"only {self.distinct} distinct samples for {readers} readers: {self.repeat_only} "
                "readers read nothing but repeated samples; use fewer ranks or workers"
            )
        if len(set(self.per_rank)) > 1:
            return f"ranks read unequal sample counts {list(self.per_rank)}: DDP would hang"
        return None


def summarize(
    readers: Sequence[Sequence[SampleRange | tuple[int, int, int]]],
    *,
    world_size: int,
    num_workers: int,
) -> PartitionSummary:
    """Count the samples of each reader and rank in ``readers`` and detect idle readers.

    Args:
        readers: For each reader (rank-major, worker-minor), its ranges ``(shard, start, stop)``.
        world_size: Ranks.
        num_workers: Workers per rank (``0``: one reader per rank).

    Raises:
        ValueError: ``len(readers)`` is not ``world_size * max(num_workers, 1)``, or a range
            with ``stop < start``.

    Examples:
        >>> s = summarize([[(0, 0, 2)], [(0, 2, 3)], [], []], world_size=2, num_workers=2)
        >>> s.per_rank, s.idle
        ((3, 0), (2, 3))
    """
    world_size = check_int("world_size", world_size, 1)
    workers = max(check_int("num_workers", num_workers, 0), 1)
    if len(readers) != world_size * workers:
        raise ValueError(
            f"got ranges for {len(readers)} readers; world_size ({world_size}) x "
            f"max(num_workers, 1) ({workers}) = {world_size * workers}"
        )
    per_reader = []
    spans: dict[int, list[tuple[int, int]]] = {}
    for i, ranges in enumerate(readers):
        n = 0
        for shard, start, stop in ranges:
            if stop < start:
                raise ValueError(f"reader {i}: range ({shard}, {start}, {stop}) has stop < start")
            n += stop - start
            spans.setdefault(shard, []).append((start, stop))
        per_reader.append(n)
    distinct = 0
    for intervals in spans.values():
        end = -1
        for start, stop in sorted(intervals):
            if stop > end:
                distinct += stop - max(start, end)
                end = stop
    per_rank = tuple(sum(per_reader[r * workers : (r + 1) * workers]) for r in range(world_size))
    idle = tuple(i for i, n in enumerate(per_reader) if n == 0)
    return PartitionSummary(
        per_reader=tuple(per_reader),
        per_rank=per_rank,
        total=sum(per_reader),
        distinct=distinct,
        idle=idle,
        repeat_only=max(len(readers) - distinct, 0),
    )


def assign_shards(
    num_shards: int,
    *,
    world_size: int,
    num_workers: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Shard-level assignment, for datasets without an index: whole shards, round-robin.

    After the epoch's shard order (:func:`shard_order`), the shard at position ``i`` goes to
    reader ``i % readers``, as a ``sharding_filter`` placed after a shard shuffle does. Sample
    counts per reader are then only as equal as the shards are.

    Returns:
        list[list[int]]: For each reader (rank-major, worker-minor), its shard numbers in
        reading order.

    Examples:
        >>> assign_shards(5, world_size=2, num_workers=0, shuffle=False)
        [[0, 2, 4], [1, 3]]
    """
    world_size = check_int("world_size", world_size, 1)
    readers = world_size * max(check_int("num_workers", num_workers, 0), 1)
    order = shard_order(num_shards, seed=seed, epoch=epoch, shuffle=shuffle)
    return [order[r::readers] for r in range(readers)]
