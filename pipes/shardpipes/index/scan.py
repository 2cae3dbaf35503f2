"""Scanning a tar shard into samples for the index: each sample's key, byte span and fields.

The grouping rule (members -> samples) is :mod:`shardpipes.formats.samples`'s, the same one the
``webdataset`` stage applies; this scanner keeps positions instead of data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, NamedTuple

from shardpipes.formats.samples import duplicate_field, key_again, no_extension, split_key
from shardpipes.formats.tarparse import BLOCK, iter_tar

__all__ = ["CHUNK", "SampleSpan", "scan_samples"]

CHUNK = 1 << 20


class SampleSpan(NamedTuple):
    """One sample found by :func:`scan_samples`: its key, byte range and fields.

    ``fields`` holds ``(extension, data size)`` per member, in archive order.
    """

    key: str
    offset: int
    size: int
    fields: tuple[tuple[str, int], ...]


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def scan_samples(stream: IO[bytes], url: str, *, chunk_size: int = CHUNK) -> Iterator[SampleSpan]:
    """Group the members of the tar read from ``stream`` into samples, as ``webdataset`` does.

    Consecutive members with the same key (:func:`~shardpipes.formats.samples.split_key`)
    form one sample; member data is not kept.

    Raises:
        ShardFormatError: Truncated or corrupt tar, naming ``url`` and the byte offset.
        SampleFormatError: A member without an extension, a key that comes back after other
            keys, or a sample with two members of one extension; naming ``url``, key and offset.

    Examples:
        >>> import io, tarfile
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as t:
        ...     for name in ("a.cls", "a.txt", "b.cls"):
        ...         info = tarfile.TarInfo(name); info.size = 1
        ...         t.addfile(info, io.BytesIO(b"x"))
        >>> [(s.key, s.offset, s.size) for s in scan_samples(io.BytesIO(buf.getvalue()), "t.tar")]
        [('a', 0, 2048), ('b', 2048, 1024)]
    """
    key: str | None = None
    start = end = 0
    fields: list[tuple[str, int]] = []
    seen: set[str] = set()
    for entry in iter_tar(stream, url, chunk_size=chunk_size):
        member_key, ext = split_key(entry.name)
        if not ext:
            raise no_extension(url, entry.name, entry.offset)
        if member_key != key:
            if key is not None:
                yield SampleSpan(key, start, end - start, tuple(fields))
            if member_key in seen:
                raise key_again(url, member_key, f"byte offset {entry.offset}")
            seen.add(member_key)
            key, start, fields = member_key, entry.offset, []
        elif any(ext == e for e, _ in fields):
            raise duplicate_field(url, member_key, ext, entry.offset)
        fields.append((ext, len(entry.data)))
        end = entry.data_offset + _padded(len(entry.data))
    if key is not None:
        yield SampleSpan(key, start, end - start, tuple(fields))
