"""Stream the members of tar archives (functional name: ``load_from_tar``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.errors import ShardFormatError, ShardReadError
from shardpipes.formats.stream import StreamBytes
from shardpipes.formats.tarparse import Run, Span, TarEntry, entries_of, iter_tar_parts
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler
from shardpipes.storage.ranges import ShardRange

__all__ = ["TarArchiveLoaderIterDataPipe", "TarMember"]


class TarMember(StreamBytes):
    """One tar member: its bytes, readable as a stream, that also know where they came from.

    As :class:`~shardpipes.formats.stream.StreamBytes` (a binary file object): ``read()``,
    ``close()``, ``file_obj``,
    iteration over lines.

    Attributes:
        url: URL of the shard.
        name: Member path inside the archive.
        offset: Byte offset of the member's first header in the shard.
        data_offset: Byte offset of the member's data in the shard.
    """

    __slots__ = ("data_offset", "name", "offset", "url")

    url: str
    name: str
    offset: int
    data_offset: int

    def __init__(self, data: Any, url: str, name: str, offset: int, data_offset: int) -> None:
        super().__init__(data)
        self.url = url
        self.name = name
        self.offset = offset
        self.data_offset = data_offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (TarMember, (self.getvalue(), self.url, self.name, self.offset, self.data_offset))


@register("load_from_tar")
class TarArchiveLoaderIterDataPipe(StageIterDataPipe[tuple[str, TarMember]]):
    """Stream the regular files of tar archives as ``(path, stream)`` pairs (functional name: ``load_from_tar``).

    A local shard is memory-mapped and each member copied straight out of the page cache;
    any other stream (S3, GCS, HTTP, a byte range, a compressed file) is read sequentially in
    large chunks. Nothing is extracted to disk and only one chunk (or a few pages of the map)
    plus the current member is held in memory. ``path`` is the shard URL joined with the
    member name, as in torchdata 0.9; the member is an in-memory file, as 0.9's stream was,
    that also answers like ``bytes`` (:class:`~shardpipes.formats.stream.StreamBytes`), and
    carries ``url``, ``name`` and byte
    offsets. A gzip, bzip2 or xz compressed archive (``.tar.gz``, ``.tgz``, ``.tar.bz2``,
    ``.tar.xz``, recognised by its first bytes) is decompressed as it streams. The source
    stream is closed when its archive ends, on error, or when iteration stops.

    Args:
        datapipe: ``(url, stream)`` pairs, as ``open_files_by_fsspec`` yields.
        mode: torchdata 0.9's ``tarfile`` mode: ``"r:*"``/``"r|*"`` (any compression, the
            default), ``"r"``, ``"r:"``/``"r|"``, ``"r:gz"``, ``"r|gz"``, ``"r:bz2"``,
            ``"r|bz2"``, ``"r:xz"``, ``"r|xz"``; the compression is recognised from the data
            in every case.
        length: What ``len()`` reports (0.9's nominal length); ``-1``: no length.
        chunk_size: Bytes read at a time from a stream; a mapped shard's headers are
            verified four chunks ahead. Default: ``1 MiB``.
        handler: What to do with a corrupt or truncated archive, or a read error mid-shard
            (:class:`~shardpipes.errors.ShardReadError`): ``"raise"`` (default),
            ``"warn_and_skip"``/``"skip"`` (drop the rest of that shard and count it),
            ``"stop"``, or a callable. See :mod:`shardpipes.handlers`.

    Yields:
        tuple[str, TarMember]: ``("<url>/<member name>", stream)``.

    Raises:
        ShardFormatError: Empty, truncated or corrupt archive, naming the URL and byte offset.
        ShardReadError: Reading the stream failed (raised by the stream, naming the URL).

    Examples:
        >>> import io, tarfile, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "shard.tar")
        >>> with tarfile.open(path, "w") as t:
        ...     info = tarfile.TarInfo("s0.txt"); info.size = 2
        ...     t.addfile(info, io.BytesIO(b"hi"))
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([path]).open_files_by_fsspec().load_from_tar()
        >>> [(p.endswith("shard.tar/s0.txt"), s.read()) for p, s in dp]
        [(True, b'hi')]
    """

    range_to_samples = ("streams", "members")
    places = False  # large members of mapped files by their place (enable_placed_output)

    def __init__(
        self,
        datapipe: Iterable[tuple[str, IO[bytes]]],
        mode: str = "r:*",
        length: int = -1,
        *,
        chunk_size: int = 1 << 20,
        handler: HandlerLike = "raise",
    ) -> None:
        if mode not in _MODES:
            raise ValueError(
                f"mode {mode!r} is not supported; load_from_tar reads: {', '.join(_MODES)}"
            )
        if chunk_size < 512:
            raise ValueError(f"chunk_size ({chunk_size}) should be at least 512")
        self.source_datapipe = datapipe
        self.mode = mode
        self.length = length
        self.chunk_size = chunk_size
        self.handler = resolve_handler(handler)
        self.skipped = SkipStats()

    def enable_placed_output(self) -> None:
        """Make large members of mapped local files by their place (``formats/placed.py``).

        A worker whose batches cross through shared memory asks (``SupportsPlacedOutput``).
        """
        self.places = True

    def members(self) -> Iterator[tuple[str, TarEntry]]:
        """Yield ``(url, entry)`` for every member."""
        for url, entries in self.member_lists():
            for entry in entries:
                yield url, entry

    def member_lists(self) -> Iterator[tuple[str, list[TarEntry]]]:
        """Yield ``(url, entries)``: the members in archive order, in lists of one shard each."""
        for url, part, source, base in self.member_parts():
            yield url, entries_of(part, source, base)

    def member_parts(self) -> Iterator[tuple[str, list[Span] | Run, memoryview, int]]:
        """Yield ``(url, spans, source, base)`` as :func:`~shardpipes.formats.tarparse.iter_tar_parts` does.

        The lean path that ``webdataset`` uses: members taken straight from the tar parser,
        many at a time, their data copied only where they are kept; members parsed in bulk come
        as a :class:`~shardpipes.formats.tarblocks.Run` (``runs=True``). ``source`` is valid
        until the next item is asked for.
        """
        policy = self.handler
        for source_url, stream in self.source_datapipe:
            # A ShardRange (from sharding_by_index) is a byte span of the shard: members only,
            # no end-of-archive blocks, offsets counted from the span's start in the shard.
            span = source_url if isinstance(source_url, ShardRange) else None
            url = str(source_url)
            try:
                for part, source, base in iter_tar_parts(
                    stream,
                    url,
                    chunk_size=self.chunk_size,
                    require_end=span is None,
                    start_offset=span.offset if span is not None else 0,
                    runs=True,
                    places=self.places,
                ):
                    yield url, part, source, base
            except (ShardFormatError, ShardReadError) as exc:
                # A corrupt archive, or a read that failed past the opener's retries (a
                # network error mid-shard): the handler decides for both, as DESIGN.md says.
                if policy.raises:
                    raise
                # Either way the rest of this shard is dropped: count it as a shard.
                if not policy(exc, url, self.skipped, shard=True):
                    return
            finally:
                stream.close()

    def __iter__(self) -> Iterator[tuple[str, TarMember]]:
        for url, e in self.members():
            yield (
                f"{url}/{e.name}",
                TarMember(e.data.getvalue(), url, e.name, e.offset, e.data_offset),
            )

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


# torchdata 0.9's: the tarfile mode strings 0.9 code passes. They are accepted and change
# nothing (the core recognises compression from the data); kept in the core stage, not the
# td09 adapter, because load_from_tar is one functional name for both.
_MODES = ("r:*", "r|*", "r", "r:", "r|", "r:gz", "r|gz", "r:bz2", "r|bz2", "r:xz", "r|xz")
