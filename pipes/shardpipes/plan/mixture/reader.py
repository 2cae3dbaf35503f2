"""What a reader of a (possibly resumed) mixture epoch reads: derived from the loader's segments, for any topology."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardpipes.plan.mixture.declaration import Mixture
from shardpipes.plan.mixture.order import interleave, reader_seeds, round_robin
from shardpipes.plan.mixture.split import MixSplit
from shardpipes.plan.resume import (
    Runs,
    Segment,
    Shape,
    lease_start,
    segment_seed,
    worker_batches,
)
from shardpipes.plan.seeds import derive_seed, shuffle_position

__all__ = ["MixReader", "mix_reader"]

_MIX_TAG = 0x4D495854  # "MIXT": the mixture's seed part, apart from the stages' numbers


def _ranks_in_source(seq: np.ndarray, sources: int) -> np.ndarray:
    """For each position of ``seq``, how many earlier positions hold the same source."""
    out = np.zeros(len(seq), np.int64)
    for i in range(sources):
        at = np.flatnonzero(seq == i)
        out[at] = np.arange(at.size)
    return out


@dataclass(frozen=True)
class MixReader:
    """What one reader reads of a (possibly resumed) mixture epoch.

    ``pieces[i]``: source ``i``'s positions still to read, in order; ``sequence``: the source
    of each sample still to yield; ``dropped``: positions the last split left out.
    """

    pieces: list[Runs]
    sequence: np.ndarray
    dropped: int
    #: ``(seed, first draw, slots)`` where the sample shuffle after the mix continues (a
    #: resumed epoch with one), else ``None``.
    shuffle: tuple[int, int, list[int]] | None = None

    @property
    def samples(self) -> int:
        """Samples still to yield."""
        return len(self.sequence)


def _sequence(
    mix: Mixture, split: MixSplit, reader: int, seed: int, start: int, first: int | None = None
) -> tuple[list[Runs], np.ndarray]:
    pieces = split.piece(reader)
    quotas = [len(p) for p in pieces]
    if mix.even and mix.until == "last":
        return pieces, round_robin(quotas)[:first]
    span = split.per_reader * split.readers
    profile = mix.profile(start, span, quotas)
    return pieces, interleave(quotas, seed, profile, even=mix.even, first=first)


def mix_reader(
    mix: Mixture,
    counts: Sequence[int],
    *,
    seed: int,
    epoch: int,
    segments: Sequence[Segment],
    reader: int,
    shape: Shape,
    epoch_start: int = 0,
    shuffle_seed: Callable[[tuple[int, ...]], int] | None = None,
    after: int = 0,
) -> MixReader:
    """What ``reader`` of the last segment reads of the epoch whose sources contribute ``counts``.

    ``segments`` are the epoch's stretches so far (one, not resumed: ``consumed == 0``);
    ``shape`` says how a reader's samples become a rank's items; ``epoch_start`` is the global
    sample where the epoch starts (for a schedule). Work: the reader's own share, plus, after
    an elastic resume, the sequences of the earlier stretches' readers up to what they yielded.
    ``after``: the reader starts after its own first ``after`` items of this run
    (:func:`~shardpipes.plan.resume.lease_start`).

    Raises:
        ValueError: A segment says more items were consumed than its readers had.
    """
    order = sorted(range(len(counts)), key=lambda i: (mix.exact_once()[i], i))
    order.reverse()  # exact-once sources first in the remainders: the end is left out first
    left = [Runs([(0, n)]) if n else Runs() for n in counts]
    mixed = derive_seed([seed, epoch, _MIX_TAG])
    start = epoch_start
    buffer = shape.buffer_size if shuffle_seed is not None else None
    for s, seg in enumerate(segments):
        split = MixSplit(left, seg.readers, order, mix.exact_once())
        workers = max(seg.num_workers, 1)
        lengths = [split.per_reader] * seg.readers
        batches = [shape.batches(n) for n in lengths[:workers]]
        done = worker_batches(seg.consumed, batches)  # equal readers: every rank the same
        yielded = [shape.samples(b, split.per_reader) for b in done]

        def seq_of(
            r: int,
            s: int = s,
            split: MixSplit = split,
            start: int = start,
            first: int | None = None,
        ) -> tuple[list[Runs], np.ndarray]:
            return _sequence(
                mix, split, r, int(reader_seeds(mixed, s, np.asarray([r]))[0]), start, first
            )

        def shuffled(
            r: int, o: int, s: int = s, seg: Segment = seg, split: MixSplit = split
        ) -> tuple[int, list[int], int]:
            """The shuffle after the mix of reader ``r`` that yielded ``o``: (seed, buffer, taken)."""
            assert shuffle_seed is not None and buffer is not None
            seed_r = segment_seed(shuffle_seed(seg.path(r)), s)
            if not o:
                return seed_r, [], 0
            held, taken = shuffle_position(seed_r, buffer, split.per_reader, o)
            return seed_r, held, taken

        if s == len(segments) - 1:
            rank, worker = divmod(reader, workers)
            turn, done_role = lease_start(seg.consumed, batches, worker, after)
            role = rank * workers + turn
            pieces, seq = seq_of(role)
            o = shape.samples(done_role, split.per_reader)
            if buffer is None:
                used = np.bincount(seq[:o], minlength=len(counts))
                rest = [p.slice(int(c), len(p)) for p, c in zip(pieces, used, strict=True)]
                return MixReader(rest, seq[o:], split.dropped)
            seed_r, kept, taken = shuffled(role, o)
            pairs = sorted((k, slot) for slot, k in enumerate(kept))
            ords = np.asarray([k for k, _ in pairs], np.int64)
            rank_in = _ranks_in_source(seq[:taken], len(counts))
            rest = []
            for i, p in enumerate(pieces):
                again = p.at_array(rank_in[ords[seq[ords] == i]]) if ords.size else ords
                tail = p.slice(int(np.count_nonzero(seq[:taken] == i)), len(p))
                rest.append(
                    Runs.of_arrays(
                        np.concatenate([again, tail.starts]),
                        np.concatenate([again + 1, tail.stops]),
                    )
                )
            sequence = np.concatenate([seq[ords], seq[taken:]]).astype(np.int32)
            return MixReader(rest, sequence, split.dropped, (seed_r, o, [t for _, t in pairs]))
        used = np.zeros((seg.readers, len(counts)), np.int64)
        seeds = reader_seeds(mixed, s, np.arange(seg.readers, dtype=np.uint64))
        span = split.per_reader * split.readers
        table = split.quota_table().tolist()
        held_r: list[np.ndarray] = []
        held_s: list[np.ndarray] = []
        held_t: list[np.ndarray] = []
        for r in range(seg.readers):  # what each reader took of each source
            o = yielded[r % workers]
            held: list[int] = []
            if buffer is not None:
                _, held, o = shuffled(r, o)
            if o:
                quotas = table[r]
                if mix.even and mix.until == "last":
                    seq = round_robin(quotas)[:o]
                else:
                    profile = mix.profile(start, span, quotas)
                    seq = interleave(quotas, int(seeds[r]), profile, even=mix.even, first=o)
                used[r] = np.bincount(seq, minlength=len(counts))
                if held:
                    ords = np.asarray(held, np.int64)
                    held_r.append(np.full(ords.size, r, np.int64))
                    held_s.append(seq[ords].astype(np.int64))
                    held_t.append(_ranks_in_source(seq, len(counts))[ords])
        if held_r:
            hr, hs, ht = np.concatenate(held_r), np.concatenate(held_s), np.concatenate(held_t)
            left = [
                split.unread(i, used[:, i], (hr[hs == i], ht[hs == i])) for i in range(len(counts))
            ]
        else:
            left = [split.unread(i, used[:, i]) for i in range(len(counts))]
        start += sum(yielded) * seg.world_size
    raise ValueError("mix_reader needs at least one segment")
