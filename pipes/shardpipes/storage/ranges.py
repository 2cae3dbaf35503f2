"""Byte ranges of shards: the ``ShardRange`` value and opening a range with one request.

``sharding_by_index`` yields :class:`ShardRange` items (a shard URL plus a sample range and its
bytes, as the index gives them); ``open_files_by_fsspec`` opens them with :func:`open_range`:
one seek locally (the tar reader maps the range: RangeFile.map_local), one ranged request (or a
streamed range) remotely.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import stat
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any, cast

from shardpipes.errors import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    ShardFormatError,
    ShardReadError,
)
from shardpipes.storage.counters import COUNTERS
from shardpipes.storage.pool import ReopeningFile, process_pool
from shardpipes.storage.remote import open_remote, with_retries
from shardpipes.storage.retry import Redactor, RetryPolicy
from shardpipes.storage.source import ReadOptions, Source, resolve

__all__ = ["RangeFile", "ShardRange", "open_range", "read_range"]


class ShardRange(str):
    """A shard URL (the string itself) with a range of its samples and their byte span.

    Every stage that takes URLs takes a ``ShardRange``; ``open_files_by_fsspec`` reads only
    ``[offset, offset + size)`` of the shard, and ``load_from_tar`` parses that span.

    Attributes:
        start: First sample (index within the shard).
        stop: One past the last sample.
        offset: Byte offset of the first sample's first member header.
        size: Bytes up to the end of the last sample's last member (for a sparse range: the
            bytes of its spans).
        spans: For a *sparse* range (some samples of ``[start, stop)``, as a resumed epoch
            reads what sat in a shuffle buffer): the ``(offset, size)`` byte spans to read, in
            order; empty for a contiguous range.
    """

    start: int
    stop: int
    offset: int
    size: int
    spans: tuple[tuple[int, int], ...]

    def __new__(
        cls,
        url: str,
        start: int,
        stop: int,
        offset: int,
        size: int,
        spans: tuple[tuple[int, int], ...] = (),
    ) -> ShardRange:
        """Make the range ``[start, stop)`` of ``url``, spanning bytes ``[offset, offset + size)``."""
        obj = super().__new__(cls, url)
        obj.start, obj.stop, obj.offset, obj.size = start, stop, offset, size
        obj.spans = tuple(spans)
        return obj

    def relocated(self, url: str) -> ShardRange:
        """The same samples and bytes in another copy of the shard (``on_disk_cache``'s)."""
        return ShardRange(url, self.start, self.stop, self.offset, self.size, self.spans)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardRange, (str(self), self.start, self.stop, self.offset, self.size, self.spans))

    def __repr__(self) -> str:
        sparse = f", {len(self.spans)} spans" if self.spans else ""
        return (
            f"ShardRange({str(self)!r}, samples [{self.start}, {self.stop}), "
            f"bytes {self.offset}+{self.size}{sparse})"
        )


_SPAN_GAP = 256 << 10  # spans closer than this are fetched with one request


class _LocalSpans(io.RawIOBase):
    """The bytes of several spans of one local file, one after the other."""

    def __init__(self, path: str, spans: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        self._f = ReopeningFile(path)  # a handle only while it has a place (storage/pool.py)
        self._spans = list(spans)
        self._i = 0
        self._left = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        want = sum(s for _, s in self._spans[self._i :]) + self._left if n is None or n < 0 else n
        parts = []
        while want > 0:
            if not self._left:
                if self._i == len(self._spans):
                    break
                off, self._left = self._spans[self._i]
                self._i += 1
                self._f.seek(off)
            data = self._f.read(min(want, self._left))
            if not data:
                break  # RangeFile reports the short read
            parts.append(data)
            want -= len(data)
            self._left -= len(data)
        return b"".join(parts)

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_spans(
    source: Source,
    spans: Sequence[tuple[int, int]],
    redactor: Redactor,
    retry: RetryPolicy,
) -> IO[bytes]:
    fs, path = source.fs, source.path
    if source.local:
        return cast(IO[bytes], _LocalSpans(path, spans))
    groups: list[list[int]] = []  # [start, end] of each request
    for off, size in sorted(spans):
        if groups and off - groups[-1][1] <= _SPAN_GAP:
            groups[-1][1] = max(groups[-1][1], off + size)
        else:
            groups.append([off, off + size])
    starts = [g[0] for g in groups]

    def fetch() -> list[bytes]:
        blobs = fs.cat_ranges([path] * len(groups), starts, [g[1] for g in groups])
        for blob in blobs:
            if isinstance(blob, BaseException):  # async filesystems return errors in place
                raise blob
        return list(blobs)

    blobs = with_retries(fetch, redactor, retry, "sparse range read", starts[0])
    parts = []
    for off, size in spans:
        i = bisect.bisect_right(starts, off) - 1
        parts.append(blobs[i][off - starts[i] : off - starts[i] + size])
    return io.BytesIO(b"".join(parts))


class RangeFile(io.RawIOBase):
    """A read-only stream of bytes ``[offset, offset + size)`` of a shard, returned by :func:`open_range`.

    ``read(n)`` returns exactly ``n`` bytes until the range ends (then fewer, then ``b""``).

    Attributes:
        url: The shard.
        offset: Where the range starts in the shard.
        size: Bytes in the range.
    """

    def __init__(self, raw: IO[bytes], url: str, offset: int, size: int) -> None:
        super().__init__()
        self._raw = raw
        self.url = url
        self.offset = offset
        self.size = size
        self._pos = 0
        self._map: _MapPlace | None = None

    def readable(self) -> bool:
        """``True``."""
        return True

    def tell(self) -> int:
        """Bytes read so far, from the start of the range."""
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        """Read up to ``n`` bytes (all that is left of the range for ``n < 0``)."""
        left = self.size - self._pos
        want = left if n is None or n < 0 else min(n, left)
        parts = []
        got = 0
        while got < want:
            data = self._raw.read(want - got)
            if not data:
                at = self.offset + self._pos + got
                raise ShardFormatError(
                    f"{self.url}: the shard ends at byte offset {at}, inside the indexed range "
                    f"[{self.offset}, {self.offset + self.size}): is the index out of date?",
                    url=self.url,
                    offset=at,
                )
            parts.append(data)
            got += len(data)
        self._pos += got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def map_local(self) -> tuple[mmap.mmap, int, int, tuple[str, os.stat_result]] | None:
        """Map the range of a local file, nothing read yet: ``(map, lead, offset, (path, stat))``.

        The tar reader then copies members once, straight out of the page cache, instead of
        reading the range in chunks (``formats/tarparse.py``); ``map[lead:]`` is the range, whose
        first byte is at ``offset`` in the shard. The map takes this range's place among the
        process's open streams (``storage/pool.py``) and keeps it until the range is closed; at
        most half the places are maps, so streams that can give their place up always have
        the other half. ``None`` (then read the range): not local, already read from, maps at
        their bound, or the file shorter than the range (the read names the stale index).
        """
        if self._pos or not isinstance(self._raw, ReopeningFile) or self._map is not None:
            return None
        with _MAPS_LOCK:
            global _MAPS
            pool = process_pool()
            if pool.limits.streams // 2 <= _MAPS:  # (1 place: no maps)
                return None
            found = _map_range(self._raw.name, self.offset, self.size)
            if found is None:
                return None
            _MAPS += 1
        self._map = _MapPlace()
        self._pos = self.size  # the map is the range: nothing is left to read() after it
        if self._raw.try_release():  # its handle is not needed while the map is read
            pool.leave(self._raw)
        pool.take_place(self._map)
        return found[0], found[1], self.offset, (self._raw.name, found[2])

    def readall(self) -> bytes:
        """Read the rest of the range."""
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer``; return the number of bytes read."""
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        """Close the underlying file (and give up the place of a map, :meth:`map_local`)."""
        if not self.closed:
            self._raw.close()
            if self._map is not None:
                global _MAPS
                process_pool().leave(self._map)
                with _MAPS_LOCK:
                    _MAPS -= 1
                self._map = None
        super().close()


_MAPS_LOCK = threading.Lock()
_MAPS = 0  # ranges of local files mapped now in this process (RangeFile.map_local)


def _forked() -> None:
    global _MAPS, _MAPS_LOCK
    _MAPS, _MAPS_LOCK = 0, threading.Lock()  # a forked child holds none of its parent's maps


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class _MapPlace:
    """The place among the process's open streams that a mapped range holds until closed."""

    def try_release(self) -> bool:
        return False  # the reader holds views of the map; the place is given up at close


def _map_range(path: str, offset: int, size: int) -> tuple[mmap.mmap, int, os.stat_result] | None:
    """Map bytes ``[offset, offset + size)`` of a local file, from the boundary before ``offset``.

    Returns the map, where the range starts in it and the file's ``os.fstat`` when mapped;
    ``None`` for an empty range or a file shorter than the range.
    """
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    if size <= 0:
        return None
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size < offset + size:
                return None
            mapped = mmap.mmap(
                f.fileno(), offset + size - start, access=mmap.ACCESS_READ, offset=start
            )
    except (OSError, ValueError):
        return None
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead as read() would on a cold cache
    return mapped, offset - start, info


def open_range(
    url: str,
    offset: int,
    size: int,
    storage_options: Mapping[str, Any] | None = None,
    *,
    max_fetch: int = 8 << 20,
    block_size: int = 8 << 20,
    spans: Sequence[tuple[int, int]] = (),
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float | None = 60.0,
) -> RangeFile:
    """Open bytes ``[offset, offset + size)`` of a shard, e.g. a run of samples from the index.

    With ``spans`` (``(offset, size)`` pairs, ``size`` their total), the stream is those spans
    one after the other: a *sparse* range, as a resumed epoch reads the samples that sat in a
    shuffle buffer. Local files: one ``open``, a ``seek`` per span. Other filesystems: one
    ``fs.cat_ranges`` call (concurrent requests on s3fs, gcsfs and HTTP), spans closer than
    256 KiB fetched together.

    Remote reads are retried as ``open_files_by_fsspec``'s are: a fetched range is fetched again
    whole after a transient error (a connection reset, a 5xx, a time-out), a streamed one
    resumes at the byte offset it had reached; permanent errors (no such key, 403) fail at once.

    Local files: one ``open`` and one ``seek``. Other filesystems: a range of at most
    ``max_fetch`` bytes is fetched whole with one ranged request (``fs.cat_file(path, start,
    end)``); a longer one is streamed from one ``fs.open`` + ``seek``, ``block_size`` bytes per
    request. ``iter_tar(stream, url, require_end=False)`` parses the stream on its own (a range
    has no end-of-archive blocks); its offsets are then relative to ``offset``.

    Args:
        url: Shard URL.
        offset: First byte, a member header (``ShardInfo.byte_range`` gives it).
        size: Bytes to read.
        storage_options: Passed to fsspec.
        max_fetch: Largest range fetched in one request. Default: ``8 MiB``.
        block_size: Request size for longer ranges. Default: ``8 MiB``.
        spans: ``(offset, size)`` byte spans for a sparse range (then ``size`` is their total).
        retries: Retries of a transient error. Default: ``5``.
        backoff: First retry delay in seconds, doubled each time. Default: ``0.5``.
        timeout: Seconds a remote request may take. Default: ``60``.

    Raises:
        ValueError: Negative ``offset`` or ``size``.
        ShardReadError: The shard cannot be opened, naming the URL.
        ShardFormatError: (on read) the shard ends inside the range: a stale index.

    Examples:
        >>> import tempfile
        >>> from shardpipes.formats.tarparse import iter_tar
        >>> from shardpipes.synthetic import write_synthetic
        >>> [path] = write_synthetic(tempfile.mkdtemp(), shards=1, samples=3)
        >>> from shardpipes.index import index_shard
        >>> shard = index_shard(path)
        >>> offset, size = shard.byte_range(1, 2)
        >>> with open_range(path, offset, size) as f:
        ...     [e.name for e in iter_tar(f, path, require_end=False)]
        ['000000_000001.cls', '000000_000001.json', '000000_000001.bin']
    """
    options = ReadOptions(retries=retries, backoff=backoff, timeout=timeout)
    return read_range(
        resolve(url, storage_options),
        offset,
        size,
        options=options,
        max_fetch=max_fetch,
        block_size=block_size,
        spans=spans,
    )


def read_range(
    source: Source,
    offset: int,
    size: int,
    *,
    options: ReadOptions = ReadOptions(),  # noqa: B008  # frozen: one shared default is fine
    max_fetch: int = 8 << 20,
    block_size: int = 8 << 20,
    spans: Sequence[tuple[int, int]] = (),
) -> RangeFile:
    """Open bytes ``[offset, offset + size)`` of a resolved :class:`Source`, as :func:`open_range`.

    Only the retry options of ``options`` apply: a range is fetched whole, or streamed with
    ``block_size`` requests and two blocks ahead.
    """
    for name, value in (("offset", offset), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} should be an int >= 0, got {value!r}")
    url, fs, path = source.url, source.fs, source.path
    raw: IO[bytes]
    retry = options.retry
    redactor = source.redactor
    try:
        if spans:
            raw = _open_spans(source, spans, redactor, retry)
        elif source.local:
            # Closed by RangeFile.close; holds a handle only while it has a place (storage/pool.py).
            raw = cast(IO[bytes], ReopeningFile(path, offset))
            COUNTERS.read(size)
        elif size <= max_fetch:
            data = with_retries(
                lambda: fs.cat_file(path, start=offset, end=offset + size), redactor, retry,
                "range read", offset,
            )  # fmt: skip
            COUNTERS.read(len(data))
            raw = io.BytesIO(data)
        else:
            stream = open_remote(
                source, options=ReadOptions(block_size, 2, *_retry_fields(options)), start=offset
            )
            raw = cast(IO[bytes], stream)
    except ShardReadError:
        raise  # already names the URL (without credentials) and the offset
    except FileNotFoundError as exc:
        raise MissingShardError(f"{url}: no such file", url=url, offset=offset) from exc
    except PermissionError as exc:
        raise ForbiddenShardError(f"{url}: permission denied", url=url, offset=offset) from exc
    except IsADirectoryError as exc:
        raise NotAFileError(f"{url}: is a directory, not a file", url=url, offset=offset) from exc
    return RangeFile(raw, url, offset, size)


def _retry_fields(options: ReadOptions) -> tuple[int, float, float | None]:
    return options.retries, options.backoff, options.timeout
