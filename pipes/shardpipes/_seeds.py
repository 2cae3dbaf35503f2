"""Seeds from structured parts, and the buffered shuffle they drive (shared by loader and previews)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["DEFAULT_SHUFFLE_BUFFER", "buffered_shuffle", "derive_seed"]

T = TypeVar("T")

_MASK63 = (1 << 63) - 1

#: torch's ``shuffle()`` default buffer size.
DEFAULT_SHUFFLE_BUFFER = 10_000


def derive_seed(parts: Sequence[int]) -> int:
    """A 63-bit seed from ``parts`` via ``numpy.random.SeedSequence`` (never by adding them).

    Examples:
        >>> derive_seed([0, 1, 2]) == derive_seed([0, 1, 2]) != derive_seed([0, 2, 1])
        True
    """
    words = np.random.SeedSequence([p & _MASK63 for p in parts]).generate_state(2, np.uint32)
    return (int(words[0]) << 31 | int(words[1])) & _MASK63


def buffered_shuffle(items: Iterable[T], rng: random.Random, buffer_size: int) -> Iterator[T]:
    """Torch's ``shuffle()`` algorithm: a buffer of ``buffer_size``, ``randint`` draws from ``rng``.

    The same ``rng`` state and buffer size give exactly the order torch's ``Shuffler`` gives.
    """
    below = rng._randbelow  # type: ignore[attr-defined]  # what randint(0, n - 1) calls: the same draws, less overhead
    buffer: list[T] = []
    for x in items:
        if len(buffer) == buffer_size:
            idx = below(buffer_size)
            val, buffer[idx] = buffer[idx], x
            yield val
        else:
            buffer.append(x)
    while buffer:
        yield buffer.pop(below(len(buffer)))
