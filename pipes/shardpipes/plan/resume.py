"""Resuming an indexed epoch by seeking: which samples a reader still has to read, in what order.

Pure functions of integers (no I/O), used by ``sharding_by_index`` when the loader restores a
state. An epoch with an index is a sequence of ``total`` sample *positions* (the shards laid
end to end in the epoch's order). An epoch may be run in *segments*, one per topology it ran
under: the first with the partition of :mod:`shardpipes.plan.partition`, each later one (after an
elastic resume) with the samples the earlier ones did not yield, split again among the new
readers. A :class:`Segment` records the topology and how many items each rank yielded in it.

What a reader yielded follows from that count alone, because everything else is determined:

1. The ranks' items are batches (or samples) made by ``batch(B)`` from a reader's samples;
   with workers, the loader takes batches from them in round-robin order, skipping a worker
   once it has none left (:func:`worker_batches`).
2. So each reader yielded its first ``o`` shuffle outputs, and the shuffle's state after ``o``
   outputs (which inputs sit in its buffer, how many it read) is computed by
   :func:`shardpipes.plan.seeds.shuffle_position` in about ``buffer * ln(buffer)`` steps.

A reader continuing its own stretch (same topology) re-reads its buffer's samples, then the
rest of its range, and restarts its shuffle at draw ``o``: it yields exactly what it would have.
After an elastic resume, the samples not yet yielded (the buffers and the rests of all readers)
are split into equal contiguous pieces for the new readers, which read them with fresh seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from shardpipes.plan.readers import batches, per_reader, reader_count, reader_path, split_reader
from shardpipes.plan.seeds import derive_seed, shuffle_position

__all__ = [
    "ReaderPlan",
    "Runs",
    "Segment",
    "Shape",
    "lease_start",
    "next_worker",
    "reader_plan",
    "segment_seed",
    "worker_batches",
]


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch run under one topology, and the items each rank yielded in it."""

    world_size: int
    num_workers: int
    distributed: bool
    consumed: int

    @property
    def readers(self) -> int:
        """``world_size * max(num_workers, 1)``."""
        return reader_count(self.world_size, self.num_workers)

    def path(self, reader: int) -> tuple[int, ...]:
        """The seed path of ``reader``: ``(rank, worker)``, without the parts a service did not add."""
        rank, worker = split_reader(reader, self.num_workers)
        return reader_path(rank, worker, distributed=self.distributed, num_workers=self.num_workers)

    def as_list(self) -> list[int]:
        """``[world_size, num_workers, distributed, consumed]``, as states store it."""
        return [self.world_size, self.num_workers, int(self.distributed), self.consumed]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> Segment:
        """The inverse of :meth:`as_list`."""
        world, workers, distributed, consumed = (int(v) for v in values)
        return cls(world, workers, bool(distributed), consumed)


@dataclass(frozen=True)
class Shape:
    """What the graph does between ``sharding_by_index`` and the ranks' items.

    ``batch_size`` is ``None`` without a ``batch()``; ``buffer_size`` is ``None`` without a
    sample-level ``shuffle()``; ``shuffle_stage`` numbers that shuffle among the random stages
    (:func:`shardpipes.dataloader2.graph.random_stages`).
    """

    batch_size: int | None
    drop_last: bool
    buffer_size: int | None
    shuffle_stage: int | None

    def batches(self, samples: int) -> int:
        """Items a reader with ``samples`` samples yields."""
        return batches(samples, self.batch_size, self.drop_last)

    def samples(self, batches: int, limit: int) -> int:
        """Samples in a reader's first ``batches`` items (of ``limit`` samples)."""
        return min(batches * (self.batch_size or 1), limit)


def _merged(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-empty runs, each joined to the previous one where it continues it."""
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if starts.size:
        new = np.flatnonzero(starts[1:] != stops[:-1]) + 1  # a run that does not continue
        starts = starts[np.r_[0, new]]
        stops = stops[np.r_[new - 1, stops.size - 1]]
    return starts, stops


class Runs:
    """A sequence of sample positions stored as runs ``[start, stop)``, in order.

    Held as arrays (starts, stops, and the running count at each run's end): an elastic
    resume gathers millions of runs, one per sample that sat in a shuffle buffer.
    """

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        arr = np.asarray([(a, b) for a, b in runs], dtype=np.int64).reshape(-1, 2)
        self._set(*_merged(arr[:, 0], arr[:, 1]))

    def _set(self, starts: np.ndarray, stops: np.ndarray) -> None:
        self.starts = starts
        self.stops = stops
        self.cum = np.cumsum(stops - starts)  # ordinals after each run

    @classmethod
    def of_arrays(cls, starts: np.ndarray, stops: np.ndarray) -> Runs:
        """Runs ``[starts[k], stops[k])`` in that order, merged as ``Runs(...)`` merges them."""
        out = cls.__new__(cls)
        out._set(*_merged(np.asarray(starts, np.int64), np.asarray(stops, np.int64)))
        return out

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The runs as ``(start, stop)`` pairs."""
        return list(zip(self.starts.tolist(), self.stops.tolist(), strict=True))

    @property
    def ends(self) -> list[int]:
        """The number of positions up to the end of each run."""
        return self.cum.tolist()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return int(self.cum[-1]) if self.cum.size else 0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Runs)
            and np.array_equal(self.starts, other.starts)
            and np.array_equal(self.stops, other.stops)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Runs({self.runs})"

    def slice(self, lo: int, hi: int) -> Runs:
        """The positions at ordinals ``[lo, hi)``."""
        hi = min(hi, len(self))
        if lo >= hi:
            return Runs()
        i = int(np.searchsorted(self.cum, lo, side="right"))
        j = int(np.searchsorted(self.cum, hi - 1, side="right"))
        starts = self.starts[i : j + 1].copy()
        stops = self.stops[i : j + 1].copy()
        # Ordinal of each end run's first position: cum minus its length.
        starts[0] += lo - int(self.cum[i] - (self.stops[i] - self.starts[i]))
        stops[-1] = self.starts[j] + (hi - int(self.cum[j] - (self.stops[j] - self.starts[j])))
        out = Runs.__new__(Runs)
        out._set(starts, stops)
        return out

    def at(self, ordinals: Iterable[int]) -> list[int]:
        """The positions at ``ordinals``, in that order."""
        return self.at_array(np.asarray(list(ordinals), dtype=np.int64)).tolist()  # type: ignore[no-any-return]

    def at_array(self, ordinals: np.ndarray) -> np.ndarray:
        """The positions at ``ordinals`` (an int64 array), as an array."""
        if not ordinals.size:
            return np.zeros(0, np.int64)
        i = np.searchsorted(self.cum, ordinals, side="right")
        first = self.cum - (self.stops - self.starts)  # the ordinal of each run's start
        return self.starts[i] + ordinals - first[i]  # type: ignore[no-any-return]

    def __add__(self, other: Runs) -> Runs:
        return Runs.of_arrays(
            np.concatenate([self.starts, other.starts]), np.concatenate([self.stops, other.stops])
        )

    def sorted(self) -> Runs:
        """The same positions in increasing order."""
        order = np.lexsort((self.stops, self.starts))
        return Runs.of_arrays(self.starts[order], self.stops[order])

    def circular(self, lo: int, hi: int) -> Runs:
        """Ordinals ``[lo, hi)`` of this sequence repeated end to end (for padding)."""
        return _circular(self, lo, hi)


def _circular(seq: Runs | _Left, lo: int, hi: int) -> Runs:
    n = len(seq)
    out = Runs()
    while lo < hi and n:
        start = lo % n
        stop = min(n, start + hi - lo)
        out = out + seq.slice(start, stop)
        lo += stop - start
    return out


@dataclass(frozen=True)
class ReaderPlan:
    """What one reader reads in a resumed epoch.

    ``buffer``: the positions that sat in its shuffle buffer, in buffer order; ``rest``: the
    rest of its range, read after them; ``seed`` and ``first_draw``: where its shuffle
    continues; ``dropped``/``padded``: samples the last elastic split left out or repeated to
    keep the ranks' lengths equal (the loader's policy decides which).
    """

    buffer: list[int]
    rest: Runs
    seed: int
    first_draw: int
    dropped: int = 0
    padded: int = 0

    @property
    def samples(self) -> int:
        """Samples the reader reads: ``len(buffer) + len(rest)``."""
        return len(self.buffer) + len(self.rest)

    def read_order(self) -> tuple[list[int], list[int]]:
        """``(positions, slots)``: the buffer's positions sorted, and the slot of each.

        Sorted, they are read shard by shard in file order; the shuffle puts each back into
        its slot.
        """
        pairs = sorted((p, slot) for slot, p in enumerate(self.buffer))
        return [p for p, _ in pairs], [slot for _, slot in pairs]

    @property
    def runs(self) -> Runs:
        """All positions it reads, in buffer order then the rest (for checks and previews)."""
        return Runs((p, p + 1) for p in self.buffer) + self.rest


def worker_batches(consumed: int, counts: Sequence[int]) -> list[int]:
    """How many of a rank's first ``consumed`` items came from each worker.

    Workers that have ``counts[w]`` items each are read round-robin (worker 0, 1, ...), a worker
    dropping out of the rotation when it has none left: torch's in-order ``DataLoader``.

    Raises:
        ValueError: ``consumed`` is more than the workers have.

    Examples:
        >>> worker_batches(5, [3, 1, 3])
        [2, 1, 2]
    """
    if consumed > sum(counts):
        raise ValueError(
            f"the state says {consumed} items were consumed, but the readers have {sum(counts)}"
        )
    lo, hi = 0, max(counts, default=0)
    while lo < hi:  # the most rounds whose items all fit in `consumed`
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in counts) <= consumed:
            lo = mid
        else:
            hi = mid - 1
    out = [min(c, lo) for c in counts]
    left = consumed - sum(out)
    for w, c in enumerate(counts):
        if left and c > lo:
            out[w] += 1
            left -= 1
    return out


def next_worker(consumed: int, counts: Sequence[int]) -> int:
    """The worker whose turn it is after a rank's first ``consumed`` items (see :func:`worker_batches`).

    A resumed pool starts its rotation at worker 0 again, so the resumed epoch gives worker
    ``w`` the part of reader ``(w + next_worker) % W``: the rotation then goes on exactly as
    it would have.

    Examples:
        >>> next_worker(5, [3, 1, 3]), next_worker(3, [3, 1, 3]), next_worker(4, [3, 1, 3])
        (0, 0, 1)
    """
    done = worker_batches(consumed, counts)
    rounds = min((b for b, c in zip(done, counts, strict=True) if b < c), default=0)
    # Workers served in the round in progress are those with one more than `rounds`.
    served = [w for w, b in enumerate(done) if b > rounds and counts[w] > rounds]
    return (served[-1] + 1) % len(counts) if served else 0


def lease_start(
    consumed: int, counts: Sequence[int], worker: int, after: int = 0
) -> tuple[int, int]:
    """Logical reader ``worker`` of a rank, after its own first ``after`` items of this run.

    Returns ``(role, done)``: the part of the segment it runs (``worker`` takes over the part
    of reader ``role`` when the run resumed a state, :func:`next_worker`) and how many items
    of that part were yielded before it starts: those the state's ``consumed`` items took
    from it, plus ``after``. A run's items of a logical reader are the same whoever makes
    them, so a reader moved to another process starts there (a Ray reader under a lease).

    Examples:
        >>> lease_start(0, [3, 3], 1, after=2)
        (1, 2)
        >>> lease_start(5, [3, 1, 3], 0, after=1)  # worker 0 runs reader 0's part, 2 were yielded
        (0, 3)
    """
    if not counts:
        raise ValueError("lease_start needs the item counts of at least one reader")
    if not 0 <= worker < len(counts) or after < 0:
        raise ValueError(
            f"worker {worker} should be in [0, {len(counts)}) and after ({after}) >= 0"
        )
    role = (worker + next_worker(consumed, counts)) % len(counts)
    return role, min(worker_batches(consumed, counts)[role] + after, counts[role])


def segment_seed(reader_seed: int, segment: int) -> int:
    """The shuffle seed of a reader in ``segment``: its epoch seed, then mixed per later segment."""
    return reader_seed if segment == 0 else derive_seed([reader_seed, segment])


class _Pieces:
    """The pieces of one segment's readers: their lengths known, each piece made when asked.

    ``ordered``: the pieces are disjoint and in position order (piece ``k`` ends before piece
    ``k + 1`` starts), so the segment's unread positions in order are its readers' in turn.
    """

    def __init__(self, lengths: list[int], make: Callable[[int], Runs], ordered: bool) -> None:
        self.lengths = lengths
        self.ordered = ordered
        self._make = make
        self._made: dict[int, Runs] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Runs:
        piece = self._made.get(i)
        if piece is None:
            piece = self._made[i] = self._make(i)
        return piece


class _Left:
    """The positions a segment's readers did not yield, in position order, made on demand.

    With ordered pieces, reader ``r``'s unread positions come before reader ``r + 1``'s: a
    stretch of ordinals needs the shuffle positions of the few readers it covers only, so a
    new reader's piece costs O(readers) and not O(readers x shuffle buffer).
    """

    def __init__(
        self, pieces: _Pieces, yielded: list[int], seed: Callable[[int], int], shape: Shape
    ) -> None:
        self.pieces = pieces
        self.yielded = yielded
        self.seed = seed
        self.shape = shape
        self.counts = np.asarray(pieces.lengths, np.int64) - np.asarray(yielded, np.int64)
        self.cum = np.cumsum(self.counts)
        self._unread: dict[int, Runs] = {}

    def __len__(self) -> int:
        return int(self.cum[-1]) if self.cum.size else 0

    def unread(self, r: int) -> Runs:
        """Reader ``r``'s unread positions, sorted."""
        runs = self._unread.get(r)
        if runs is None:
            buffer, rest = _unread(self.pieces[r], self.yielded[r], self.seed(r), self.shape)
            starts = np.concatenate([buffer, rest.starts])
            stops = np.concatenate([buffer + 1, rest.stops])
            order = np.lexsort((stops, starts))
            runs = self._unread[r] = Runs.of_arrays(starts[order], stops[order])
        return runs

    def slice(self, lo: int, hi: int) -> Runs:
        """The positions at ordinals ``[lo, hi)``."""
        hi = min(hi, len(self))
        out = Runs()
        if lo >= hi:
            return out
        first = int(np.searchsorted(self.cum, lo, side="right"))
        last = int(np.searchsorted(self.cum, hi - 1, side="right"))
        for r in range(first, last + 1):
            base = int(self.cum[r] - self.counts[r])
            out = out + self.unread(r).slice(max(lo, base) - base, min(hi, int(self.cum[r])) - base)
        return out

    def circular(self, lo: int, hi: int) -> Runs:
        """Ordinals ``[lo, hi)`` of this sequence repeated end to end (for padding)."""
        return _circular(self, lo, hi)


def _first_split(total: int, readers: int, policy: str) -> _Pieces:
    per = per_reader(total, readers, policy) if total else 0
    whole = Runs([(0, total)])
    return _Pieces(
        [per] * readers,
        lambda i: whole.circular(i * per, (i + 1) * per),
        ordered=per * readers <= total,
    )


def _split_again(
    left: Runs | _Left, seg: Segment, shape: Shape, policy: str
) -> tuple[_Pieces, int, int]:
    """Split ``left`` into contiguous pieces for ``seg``'s readers; return (pieces, dropped, padded).

    As equal as possible, the extra samples spread over the ranks first; when that would give
    the ranks different numbers of items (which would hang a DDP job), the policy drops the
    extra (fewer than the readers) or pads every reader to one more.
    """
    n, workers = seg.readers, max(seg.num_workers, 1)
    base, extra = divmod(len(left), n)
    sizes = [base] * n
    for k in range(extra):  # worker 0 of every rank, then worker 1 of every rank, ...
        worker, rank = divmod(k, seg.world_size)
        sizes[rank * workers + worker] += 1
    per_rank = {
        sum(shape.batches(sizes[r * workers + w]) for w in range(workers))
        for r in range(seg.world_size)
    }
    dropped = padded = 0
    if len(per_rank) > 1:
        if policy == "drop":
            sizes, dropped = [base] * n, extra
        else:
            sizes, padded = [base + 1] * n, n - extra
    starts = np.cumsum([0, *sizes]).tolist()
    pieces = _Pieces(
        sizes,
        lambda k: left.circular(starts[k], starts[k] + sizes[k]),
        ordered=starts[-1] <= len(left),
    )
    return pieces, dropped, padded


def _yielded(lengths: list[int], seg: Segment, shape: Shape) -> list[int]:
    """Samples each reader of ``seg`` had yielded (through its shuffle) when ranks stopped."""
    workers = max(seg.num_workers, 1)
    out = []
    for rank in range(seg.world_size):
        mine = lengths[rank * workers : (rank + 1) * workers]
        counts = [shape.batches(n) for n in mine]
        for n, b in zip(mine, worker_batches(seg.consumed, counts), strict=True):
            out.append(shape.samples(b, n))
    return out


def _unread(piece: Runs, outputs: int, seed: int, shape: Shape) -> tuple[np.ndarray, Runs]:
    """A reader's positions not yielded after ``outputs``: (its shuffle buffer, the rest)."""
    if shape.buffer_size is None:
        return np.zeros(0, np.int64), piece.slice(outputs, len(piece))
    buffer, consumed = shuffle_position(seed, shape.buffer_size, len(piece), outputs)
    return piece.at_array(np.asarray(buffer, np.int64)), piece.slice(consumed, len(piece))


def reader_plan(
    total: int,
    policy: str,
    segments: Sequence[Segment],
    reader: int,
    shape: Shape,
    reader_seed: Callable[[tuple[int, ...]], int],
    after: int = 0,
) -> ReaderPlan:
    """What ``reader`` of the last segment reads, for an epoch of ``total`` samples.

    ``reader`` is ``rank * max(num_workers, 1) + worker``; after a same-topology resume the
    worker takes over the part of another reader of its rank (:func:`next_worker`).

    ``reader_seed(path)`` is the epoch seed of the sample shuffle of the reader at ``path``.
    The last segment's ``consumed`` is how far its own readers got (``0`` right after an
    elastic resume); ``after``: the reader starts after its own first ``after`` items of this
    run (:func:`lease_start`).

    Raises:
        ValueError: A segment's count is more than its readers had (another graph or data).
    """
    pieces = _first_split(total, segments[0].readers, policy)
    left: Runs | _Left = Runs()
    dropped = padded = 0
    for s, seg in enumerate(segments):
        if s:
            pieces, dropped, padded = _split_again(left, seg, shape, policy)
        yielded = _yielded(pieces.lengths, seg, shape)
        if s == len(segments) - 1:
            workers = max(seg.num_workers, 1)
            rank, worker = divmod(reader, workers)
            mine = pieces.lengths[rank * workers : (rank + 1) * workers]
            turn, done = lease_start(seg.consumed, [shape.batches(n) for n in mine], worker, after)
            role = rank * workers + turn
            out = shape.samples(done, pieces.lengths[role])
            seed = segment_seed(reader_seed(seg.path(role)), s)
            buffer, rest = _unread(pieces[role], out, seed, shape)
            return ReaderPlan(buffer.tolist(), rest, seed, out, dropped, padded)

        def seed_of(i: int, s: int = s, seg: Segment = seg) -> int:
            return segment_seed(reader_seed(seg.path(i)), s)

        if pieces.ordered:
            left = _Left(pieces, yielded, seed_of, shape)
            continue
        # Pieces that wrap around (padding): every reader's buffer and rest, sorted, as arrays.
        parts = [_unread(pieces[i], o, seed_of(i), shape) for i, o in enumerate(yielded)]
        buffers = np.concatenate([buffer for buffer, _ in parts])
        starts = np.concatenate([buffers, *(rest.starts for _, rest in parts)])
        stops = np.concatenate([buffers + 1, *(rest.stops for _, rest in parts)])
        order = np.lexsort((stops, starts))
        left = Runs.of_arrays(starts[order], stops[order])
    raise ValueError("reader_plan needs at least one segment")
