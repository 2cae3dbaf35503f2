"""Seeds from structured parts, and the buffered shuffle they drive (shared by loader and previews).

The buffered shuffle is torch's algorithm (a buffer of ``buffer_size``; once it is full, each
new item replaces a random slot whose item is yielded; at the end the rest is yielded in random
order), but its random numbers are *counter-based*: draw number ``d`` is a pure function of
``(seed, d)`` (a SplitMix64 hash), not the next output of a stateful generator. So the state of
a shuffle after any number of outputs can be computed without replaying it:
:func:`shuffle_position` finds which inputs are in the buffer by scanning the draws backwards
from that point, which takes about ``buffer_size * ln(buffer_size)`` draws however long the
shuffle ran. That is what lets the loader resume an epoch by seeking instead of replaying
(docs/checkpointing.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, count
from typing import TypeVar

import numpy as np
from numpy.random import SeedSequence  # at import: a first use mid-epoch costs a full GC

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "buffered_shuffle",
    "derive_seed",
    "reader_stage_seed",
    "shuffle_draws",
    "shuffle_position",
]

T = TypeVar("T")

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_BLOCK = 4096  # draws made at a time (numpy), then handed out one by one

#: torch's ``shuffle()`` default buffer size.
DEFAULT_SHUFFLE_BUFFER = 10_000


def derive_seed(parts: Sequence[int]) -> int:
    """A 63-bit seed from ``parts`` via ``numpy.random.SeedSequence`` (never by adding them).

    Examples:
        >>> derive_seed([0, 1, 2]) == derive_seed([0, 1, 2]) != derive_seed([0, 2, 1])
        True
    """
    words = SeedSequence([p & _MASK63 for p in parts]).generate_state(2, np.uint32)
    return (int(words[0]) << 31 | int(words[1])) & _MASK63


def reader_stage_seed(seed: int, epoch: int, stage: int, path: Sequence[int]) -> int:
    """Seed of random stage ``stage`` after the sharding stage, for the reader at ``path`` (rank, worker)."""
    return derive_seed([seed, epoch, stage, 1, *path])


def shuffle_draws(seed: int, start: int, count: int) -> np.ndarray:
    """Draws ``start .. start + count - 1`` of the shuffle seeded ``seed``: floats in ``[0, 1)``.

    Draw ``d`` is SplitMix64 of ``seed + (d + 1) * golden``, top 53 bits.

    Examples:
        >>> a = shuffle_draws(7, 0, 10)
        >>> bool(((a >= 0) & (a < 1)).all()), bool((shuffle_draws(7, 4, 3) == a[4:7]).all())
        (True, True)
    """
    d = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _MASK64) + d * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _slots(seed: int, start: int, size: int) -> Iterator[int]:
    """``int(d * size)`` for draws ``d`` number ``start, start + 1, ...``, without end."""

    def block(d: int) -> list[int]:
        return (shuffle_draws(seed, d, _BLOCK) * size).astype(np.int64).tolist()  # type: ignore[no-any-return]

    return chain.from_iterable(map(block, count(start, _BLOCK)))


def _stream(seed: int, start: int) -> Iterator[float]:
    d = start
    while True:
        yield from shuffle_draws(seed, d, _BLOCK).tolist()
        d += _BLOCK


def buffered_shuffle(
    items: Iterable[T],
    seed: int | Callable[[], tuple[int, int] | tuple[int, int, Sequence[int]]],
    buffer_size: int,
) -> Iterator[T]:
    """Shuffle ``items`` through a buffer of ``buffer_size`` with counter-based draws.

    ``seed`` is the seed (draws start at 0), or a function called once the buffer has filled
    (before the first draw) that returns ``(seed, first_draw)`` or ``(seed, first_draw,
    slots)``: a resumed shuffle starts its draws where the interrupted one stopped, and its
    first ``len(slots)`` items (the interrupted buffer, read in file order) go to buffer slots
    ``slots``.
    """
    it = iter(items)
    buffer: list[T] = []
    for x in it:
        buffer.append(x)
        if len(buffer) == buffer_size:
            break
    seed_, start, *placed = seed() if callable(seed) else (seed, 0)
    if placed and placed[0]:
        slots = placed[0]
        restored = list(buffer)
        for item, slot in zip(buffer[: len(slots)], slots, strict=True):
            restored[slot] = item
        buffer = restored
    # While inputs arrive the buffer is full, so draw d picks slot int(draw * buffer_size):
    # the slots are made a block at a time by numpy (the same float product, truncated) and
    # handed out by C iterators; ``taken`` counts the draws used, for the tail's draws.
    taken = count()
    for x, idx, _ in zip(it, _slots(seed_, start, buffer_size), taken, strict=False):
        val, buffer[idx] = buffer[idx], x
        yield val
    draw = _stream(seed_, start + next(taken)).__next__
    while buffer:
        yield buffer.pop(int(draw() * len(buffer)))


def shuffle_position(
    seed: int, buffer_size: int, num_inputs: int, outputs: int
) -> tuple[list[int], int]:
    """The state of :func:`buffered_shuffle` over ``num_inputs`` items after ``outputs`` outputs.

    Returns ``(buffer, consumed)``: the input ordinals in the buffer, in buffer order, and how
    many inputs were read. Feeding ``buffer`` and then inputs ``consumed ..`` to a new shuffle
    whose draws start at ``outputs`` yields exactly the rest of the interrupted one. Costs about
    ``buffer_size * ln(buffer_size)`` draws (numpy), not ``outputs``.

    Raises:
        ValueError: ``outputs`` is more than ``num_inputs``.

    Examples:
        >>> full = list(buffered_shuffle(range(50), 3, 8))
        >>> buffer, consumed = shuffle_position(3, 8, 50, 20)
        >>> rest = buffered_shuffle([*buffer, *range(consumed, 50)], lambda: (3, 20), 8)
        >>> full[20:] == list(rest)
        True
    """
    if not 0 <= outputs <= num_inputs:
        raise ValueError(f"outputs ({outputs}) should be in [0, num_inputs ({num_inputs})]")
    if outputs == 0:
        return [], 0
    size = buffer_size
    steady = max(num_inputs - size, 0)  # outputs made while inputs still arrive
    done = min(outputs, steady)
    if num_inputs <= size:
        buffer = list(range(num_inputs))
    else:
        # Slot s holds input size + d for the last draw d < done that chose s, else input s.
        last = np.full(size, -1, dtype=np.int64)
        hi, chunk = done, 4 * size
        while hi > 0:
            lo = max(0, hi - chunk)
            slots = (shuffle_draws(seed, lo, hi - lo) * size).astype(np.int64)
            rev = slots[::-1]
            uniq, first = np.unique(rev, return_index=True)
            new = last[uniq] < 0
            last[uniq[new]] = hi - 1 - first[new]
            if (last >= 0).all():
                break
            hi, chunk = lo, chunk * 2
        buffer = np.where(last >= 0, size + last, np.arange(size)).tolist()
    if outputs <= steady:
        return buffer, size + outputs
    for f in shuffle_draws(seed, steady, outputs - steady).tolist():
        buffer.pop(int(f * len(buffer)))
    return buffer, num_inputs
