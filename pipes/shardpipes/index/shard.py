"""One shard of the index (:class:`ShardInfo`), the index's error, and the span checks.

A ``ShardInfo`` holds its samples' keys, offsets and sizes itself (a built index, or one read
from a version-1 file), or gets them on demand from its index's per-shard sample file
(version 2): then only its URL, sample count and size are in memory until a byte range is
asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from shardpipes.errors import ShardpipesError
from shardpipes.formats.tarheaders import BLOCK

__all__ = ["IndexFormatError", "ShardInfo", "check_layout"]


class IndexFormatError(ShardpipesError, ValueError):
    """An index file is not a valid shardpipes index; the message names the file and the field.

    Attributes:
        url: The index file.
        field: The bad field, e.g. ``"shards[3].offsets[7]"``.
    """

    def __init__(self, message: str, *, url: str = "", field: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_index_error, (self.args[0], self.url, self.field))


def _rebuild_index_error(message: str, url: str, field: str) -> IndexFormatError:
    return IndexFormatError(message, url=url, field=field)


def fail(url: str, fld: str, what: str) -> IndexFormatError:
    """The error for field ``fld`` of the index file ``url``."""
    return IndexFormatError(f"{url}: {fld} {what}", url=url, field=fld)


def check_layout(offsets: np.ndarray, sizes: np.ndarray, total: int, url: str, where: str) -> None:
    """Offsets and sizes are block-aligned, positive, in order, non-overlapping, inside the file."""
    checks: list[tuple[str, np.ndarray, str]] = [
        (
            "offsets",
            (offsets < 0) | (offsets % BLOCK != 0),
            f"should be a multiple of {BLOCK} >= 0",
        ),
        ("sizes", (sizes <= 0) | (sizes % BLOCK != 0), f"should be a positive multiple of {BLOCK}"),
        (
            "offsets",
            np.r_[False, offsets[1:] < offsets[:-1] + sizes[:-1]],
            "overlaps the previous sample",
        ),
        ("sizes", offsets + sizes > total, f"runs past total_bytes ({total})"),
    ]
    for name, bad, what in checks:
        hits = np.flatnonzero(bad)
        if hits.size:
            j = int(hits[0])
            value = int(offsets[j] if name == "offsets" else sizes[j])
            raise fail(url, f"{where}{name}[{j}]", f"= {value} {what}")


class SpanSource(Protocol):
    """Where a lazy :class:`ShardInfo` gets its spans and keys (its index's sample files)."""

    def spans(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, sizes)`` of shard ``position``, cached."""

    def keys(self, position: int) -> list[str]:
        """The keys of shard ``position`` (read each time: diagnostics only)."""

    def held(self, position: int) -> int:
        """Bytes of spans of shard ``position`` in the cache now."""


class ShardInfo:
    """The index of one shard.

    Attributes:
        url: Absolute shard URL (a local path, or ``scheme://...``).
        total_bytes: Size of the shard file in bytes.
        etag: The shard's ETag or checksum when the index recorded one, else ``None``.
        keys: Sample keys, in archive order (read from the sample file when lazy).
        offsets: Byte offset of each sample's first member header.
        sizes: Bytes from that offset to the end of the sample's last member's padded data.

    Examples:
        >>> s = ShardInfo("/d/a.tar", 10240, ["x", "y"], [0, 2048], [2048, 1024])
        >>> s.num_samples, s.byte_range(0, 2)
        (2, (0, 3072))
    """

    __slots__ = ("_keys", "_num", "_offsets", "_sizes", "_source", "etag", "total_bytes", "url")

    def __init__(
        self,
        url: str,
        total_bytes: int,
        keys: Sequence[str] | None = None,
        offsets: Sequence[int] | None = None,
        sizes: Sequence[int] | None = None,
        *,
        num_samples: int | None = None,
        etag: str | None = None,
        source: tuple[SpanSource, int] | None = None,
    ) -> None:
        self.url = url
        self.total_bytes = total_bytes
        self.etag = etag
        self._source = source
        self._num = num_samples
        if source is None:
            self._keys: list[str] | None = list(keys) if keys is not None else []
            self._offsets: list[int] | None = list(offsets) if offsets is not None else []
            self._sizes: list[int] | None = list(sizes) if sizes is not None else []
        else:
            self._keys = self._offsets = self._sizes = None

    @property
    def num_samples(self) -> int:
        """Samples in the shard."""
        if self._keys is not None:
            return len(self._keys)
        return int(self._num or 0)

    @property
    def keys(self) -> list[str]:
        """Sample keys (a lazy shard reads them from its sample file, every time)."""
        if self._keys is not None:
            return self._keys
        src, i = self._source  # type: ignore[misc]
        return src.keys(i)

    @property
    def offsets(self) -> list[int]:
        """Byte offset of each sample."""
        if self._offsets is not None:
            return self._offsets
        return self.spans()[0].tolist()  # type: ignore[no-any-return]

    @property
    def sizes(self) -> list[int]:
        """Byte size of each sample."""
        if self._sizes is not None:
            return self._sizes
        return self.spans()[1].tolist()  # type: ignore[no-any-return]

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, sizes)`` as int64 arrays (a lazy shard loads and caches them)."""
        if self._source is None:
            return np.asarray(self._offsets, np.int64), np.asarray(self._sizes, np.int64)
        src, i = self._source
        return src.spans(i)

    @property
    def loaded_bytes(self) -> int:
        """Bytes of per-sample spans this shard holds in memory now (its cache entry if lazy)."""
        if self._source is None:
            return 16 * self.num_samples
        src, i = self._source
        return src.held(i)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Return ``(offset, size)`` of samples ``start`` to ``stop`` (exclusive): one read.

        The bytes parse on their own with ``iter_tar(..., require_end=False)`` (members only,
        no end-of-archive blocks).

        Raises:
            ValueError: An empty or out-of-bounds sample range, naming it and the shard.
        """
        if not 0 <= start < stop <= self.num_samples:
            raise ValueError(
                f"{self.url}: sample range [{start}, {stop}) is empty or outside [0, {self.num_samples})"
            )
        offsets: Sequence[int] | np.ndarray
        sizes: Sequence[int] | np.ndarray
        if self._offsets is not None and self._sizes is not None:
            offsets, sizes = self._offsets, self._sizes
        else:
            offsets, sizes = self.spans()
        offset = int(offsets[start])
        return offset, int(offsets[stop - 1]) + int(sizes[stop - 1]) - offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardInfo):
            return NotImplemented
        if (self.url, self.total_bytes, self.num_samples) != (
            other.url,
            other.total_bytes,
            other.num_samples,
        ):
            return False
        a, b = self.spans(), other.spans()
        return (
            bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
            and self.keys == other.keys
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardInfo(url={self.url!r}, total_bytes={self.total_bytes}, num_samples={self.num_samples})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A lazy shard travels with its spans and keys (not with its whole index).
        return (
            _rebuild_shard,
            (self.url, self.total_bytes, self.keys, self.offsets, self.sizes, self.etag),
        )


def _rebuild_shard(
    url: str, total: int, keys: list[str], offsets: list[int], sizes: list[int], etag: str | None
) -> ShardInfo:
    return ShardInfo(url, total, keys, offsets, sizes, etag=etag)
