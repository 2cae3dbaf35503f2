"""Sample identities and the digests of the ids a reader yields: pure functions, no I/O.

A sample's identity is its shard and its key in that shard (``__url__``, ``__key__``, which the
``webdataset()`` stage already puts in every sample). :func:`sample_id` packs them into one
64-bit integer: the high 32 bits a CRC of the shard URL (made absolute for local files, so a
relative and an absolute spelling of one shard agree), the low 32 bits a CRC of the key.
Keys are unique within a shard (the WebDataset rule), so two samples share an id only if two
shard URLs *and* two keys collide at once.

A digest folds samples order-independently (a sum of 64-bit terms modulo 2**64, one term per
sample, :func:`term`: the id spread over 64 bits by SplitMix64's finaliser, so a digest is a
function of the ids alone and batches that carry only their ids, :class:`SampleIds`, fold the
same as samples that carry their URL and key): a window of batches has the same digest whatever
order the sample shuffle chose, two readers that yield the same samples have the same digest,
and the digest of a run is the sum of the digests of its parts.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable

__all__ = ["MASK", "SampleIds", "digest", "id_term", "mix", "sample_id", "shard_hash", "term"]

MASK = (1 << 64) - 1
_SHARDS: dict[str, int] = {}  # URL -> its 32-bit hash; shards are few, samples many


def shard_hash(url: str) -> int:
    """The 32-bit hash of a shard URL (local paths made absolute, ``file://`` dropped)."""
    found = _SHARDS.get(url)
    if found is None:
        name = url[7:] if url.startswith("file://") else url
        if "://" not in name:
            name = os.path.abspath(name)
        found = zlib.crc32(name.encode())
        if len(_SHARDS) < 1 << 16:
            _SHARDS[url] = found
    return found


def sample_id(url: str, key: str) -> int:
    """The 64-bit identity of the sample ``key`` of the shard ``url``."""
    return (shard_hash(url) << 32) | zlib.crc32(key.encode())


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
