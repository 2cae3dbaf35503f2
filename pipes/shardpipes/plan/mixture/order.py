"""The sample order of one reader: which source fills each of its positions (counter-based, so any prefix is cheap)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["interleave", "reader_seeds", "round_robin"]


def round_robin(quotas: Sequence[int]) -> np.ndarray:
    """Sources in turn, a source leaving the turn when its quota is read (webdataset's ``round_robin_longest``).

    Examples:
        >>> round_robin([3, 1, 2]).tolist()
        [0, 1, 2, 0, 2, 0]
    """
    left = np.asarray(quotas, np.int64)
    out = []
    while (left > 0).any():
        live = np.flatnonzero(left > 0)
        rounds = int(left[live].min())
        out.append(np.tile(live.astype(np.int32), rounds))
        left[live] -= rounds
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def interleave(
    quotas: Sequence[int],
    seed: int,
    profile: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
    *,
    even: bool = False,
    first: int | None = None,
) -> np.ndarray:
    """The source of each of a reader's ``sum(quotas)`` positions, in order (``first``: only the first ones).

    With ``first``, only the arrivals before a time that holds at least ``first`` of them are
    made (every source's arrival ``j`` comes after ``j / q`` of its share of the time), so
    the cost follows ``first``, not the quotas.

    Examples:
        >>> interleave([2, 2], 0, even=True).tolist()
        [0, 1, 0, 1]
        >>> np.bincount(interleave([5, 3, 2], 7)).tolist()
        [5, 3, 2]
    """
    total = sum(quotas)
    if first is not None and first < total:
        time = min(1.0, (first + 2 * len(quotas) + 16) / max(total, 1))
        while True:
            got = _arrivals(quotas, seed, profile, even, time)
            if time >= 1.0 or len(got) >= first:
                return got[:first]
            time = min(1.0, time * 2)
    return _arrivals(quotas, seed, profile, even, None)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise (uint64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def _hash(seed: int | np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Counter-based 64-bit values: SplitMix64 of ``seed + (counter + 1) * golden`` (elementwise)."""
    with np.errstate(over="ignore"):
        base = (
            np.asarray(seed).astype(np.uint64)
            if isinstance(seed, np.ndarray)
            else np.uint64(seed & (2**64 - 1))
        )
        return _mix64(base + (counter.astype(np.uint64) + np.uint64(1)) * _GOLDEN)


def reader_seeds(mixed: int, segment: int, readers: np.ndarray) -> np.ndarray:
    """The interleave seed of each reader of ``segment`` (uint64)."""
    return _hash(int(_hash(mixed, np.asarray([segment]))[0]), readers)


def _arrivals(
    quotas: Sequence[int],
    seed: int,
    profile: Sequence[tuple[np.ndarray, np.ndarray]] | None,
    even: bool,
    before: float | None,
) -> np.ndarray:
    """Sources of the arrivals in order; with ``before``, only those that arrive before that time.

    Arrival ``j`` of source ``i`` (of ``q``) is at share ``(j + u) / q`` of the time, ``u`` the
    top 53 bits of ``_hash(_hash(seed, i), j)`` as a fraction (0 with ``even``), through the
    source's profile when there is one.
    """
    q = np.asarray(quotas, np.int64)
    n = q.copy()
    if before is not None:  # arrival j is at or after share j / q: later ones cannot count
        if profile is None:
            share = np.full(len(q), before)
        else:
            share = np.asarray([float(np.interp(before, xs, ys)) for xs, ys in profile])
        n = np.minimum(q, np.floor(share * q).astype(np.int64) + 2)
    total = int(n.sum())
    if not total:
        return np.zeros(0, np.int32)
    src = np.repeat(np.arange(len(q), dtype=np.int32), n)
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    if even:
        y = j / q[src]
    else:
        seeds = _hash(seed, np.arange(len(q), dtype=np.uint64))
        u = (_hash(seeds[src], j) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        y = (j + u) / q[src]
    if profile is not None:
        ends = np.cumsum(n)
        for i, (xs, ys) in enumerate(profile):
            if n[i]:
                y[ends[i] - n[i] : ends[i]] = np.interp(y[ends[i] - n[i] : ends[i]], ys, xs)
    order = np.lexsort((src, y))
    if before is not None:
        order = order[y[order] < before]
    return src[order]
