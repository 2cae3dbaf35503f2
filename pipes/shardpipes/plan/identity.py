"""Sample identities and the digests of the ids a reader yields: pure functions, no I/O.

A sample's identity is its shard and its key in that shard (``__url__``, ``__key__``, which the
``webdataset()`` stage already puts in every sample). :func:`sample_id` hashes them together
into one 64-bit integer (BLAKE2b, 8 bytes, over the shard URL made absolute for local files, so a
relative and an absolute spelling of one shard agree, a NUL, and the key). Two different samples
share an id with probability about n**2 / 2**65 for n samples in all: about 3% for a billion
samples, 3e-8 for a million. (Packing 32-bit CRCs of the URL and of the key, as this module did
first, collides far sooner: two keys of one 10,000-sample shard with probability about 1%, and
two of a million shard URLs almost surely.)

A digest folds samples order-independently (a sum of 64-bit terms modulo 2**64, one term per
sample, :func:`term`: the id spread over 64 bits by SplitMix64's finaliser, so a digest is a
function of the ids alone and batches that carry only their ids, :class:`SampleIds`, fold the
same as samples that carry their URL and key): a window of batches has the same digest whatever
order the sample shuffle chose, two readers that yield the same samples have the same digest,
and the digest of a run is the sum of the digests of its parts.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["MASK", "SampleIds", "digest", "id_term", "mix", "sample_id", "term"]

MASK = (1 << 64) - 1
_SHARDS: dict[
    str, Any
] = {}  # URL -> a BLAKE2b state that has read it; shards are few, samples many


def _shard_state(url: str) -> Any:
    """A BLAKE2b (8 bytes) state that has read the shard's name (local paths made absolute)."""
    found = _SHARDS.get(url)
    if found is None:
        name = url[7:] if url.startswith("file://") else url
        if "://" not in name:
            name = os.path.abspath(name)
        found = hashlib.blake2b(name.encode() + b"\0", digest_size=8)
        if len(_SHARDS) < 1 << 16:
            _SHARDS[url] = found
    return found


def sample_id(url: str, key: str) -> int:
    """The 64-bit identity of the sample ``key`` of the shard ``url``."""
    h = _shard_state(url).copy()
    h.update(key.encode())
    return int.from_bytes(h.digest(), "little")


def mix(value: int) -> int:
    """SplitMix64's finaliser: spreads an id over 64 bits before it is summed."""
    z = (value + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def id_term(value: int) -> int:
    """The digest term of the sample whose id is ``value``."""
    return mix(value)


def term(url: str, key: str) -> int:
    """The digest term of the sample ``key`` of the shard ``url``: ``id_term(sample_id(url, key))``."""
    return mix(sample_id(url, key))


class SampleIds(tuple[int, ...]):
    """The ids of a batch's samples, in the batch's order (``batch.ids``, set by the loader's graph)."""

    __slots__ = ()


def digest(samples: Iterable[tuple[str, str]]) -> int:
    """The digest of ``(url, key)`` pairs: the sum of their terms modulo 2**64."""
    return sum(term(url, key) for url, key in samples) & MASK
