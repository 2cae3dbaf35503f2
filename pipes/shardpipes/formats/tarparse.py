"""Read the members of a tar archive: from a memory-mapped local file, or any stream in chunks.

Python's ``tarfile`` spends most of its time per member building ``TarInfo`` objects and
summing header checksums byte by byte (about 55% of webdataset's time on small samples). Here
the headers are parsed and verified in bulk by :func:`~shardpipes.formats.tarheaders.scan`
over a buffer that is either

- the ``mmap`` of a whole local file: members are copied straight out of the page cache
  into their values, so each byte is copied once, and no read buffer is allocated, filled
  and sliced again; or
- chunks read from any other stream (remote objects, byte ranges, wrappers), holding one
  chunk plus the largest member.

A compressed archive (gzip, bzip2 or xz, recognised by its first bytes, as torchdata 0.9's
``load_from_tar`` with mode ``"r:*"`` did) is decompressed as it streams. Member data is a
:class:`~shardpipes.formats.stream.StreamBytes`: an in-memory file that also answers like ``bytes``.
"""

from __future__ import annotations

import io
import lzma
import mmap
import operator
import os
import stat
import tarfile
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, repeat
from operator import itemgetter
from typing import IO, Any, NamedTuple

import numpy as np

from shardpipes.errors import ShardFormatError
from shardpipes.formats import placed
from shardpipes.formats.compression import MAGIC_LENGTH, by_magic, decompress_stream
from shardpipes.formats.stream import StreamBytes, binary_stream, raw_bytes
from shardpipes.formats.tarblocks import Run, Span, scan
from shardpipes.formats.tarheaders import (
    BLOCK,
    NO_PAX,
    Carry,
    at_end,
    truncated,
)

__all__ = [
    "BLOCK",
    "Run",
    "Span",
    "TarEntry",
    "entries_of",
    "iter_tar",
    "iter_tar_lists",
    "iter_tar_parts",
    "slicer",
]

_DEFAULT_CHUNK = 1 << 20
_AHEAD = 1  # chunks of a mapped file whose headers are scanned at once
_SPARSE_AHEAD = 4  # the same, once a group's members averaged _SPARSE_MEMBER bytes or more
_SPARSE_MEMBER = 16 << 10


class TarEntry(NamedTuple):
    """One regular file of a tar archive.

    ``offset`` is the byte offset of the member's first header (including any GNU long-name or
    pax header before it), so ``[offset, data_offset + size)`` is everything needed to read the
    member alone; ``data_offset`` is where its bytes start.
    """

    name: str
    data: StreamBytes
    offset: int
    data_offset: int


# TarEntry(*fields) without the Python-level __new__ that namedtuple generates: a member is
# made hundreds of thousands of times a second.
_entry: Callable[[type[TarEntry], tuple[str, StreamBytes, int, int]], TarEntry] = tuple.__new__

Part = tuple[list[Span] | Run, memoryview, int]


def iter_tar(
    stream: IO[bytes],
    url: str,
    *,
    chunk_size: int = _DEFAULT_CHUNK,
    require_end: bool = True,
    start_offset: int = 0,
) -> Iterator[TarEntry]:
    """Yield the regular files of the tar archive read from ``stream``, in archive order.

    One by one, as :func:`iter_tar_lists` yields them in lists (same arguments, same errors).
    """
    for entries in iter_tar_lists(
        stream, url, chunk_size=chunk_size, require_end=require_end, start_offset=start_offset
    ):
        yield from entries


def iter_tar_lists(
    stream: IO[bytes],
    url: str,
    *,
    chunk_size: int = _DEFAULT_CHUNK,
    require_end: bool = True,
    start_offset: int = 0,
) -> Iterator[list[TarEntry]]:
    """Yield the regular files of the tar archive read from ``stream``, in archive order, in lists.

    A list holds the members whose headers were parsed together, up to about ``chunk_size``
    bytes of member data (at least one member): consumers that work on many members at once
    take them so, without a generator step per member. Same arguments and errors as
    :func:`iter_tar_parts`, of which each part's members are made here.
    """
    for part, source, base in iter_tar_parts(
        stream, url, chunk_size=chunk_size, require_end=require_end, start_offset=start_offset
    ):
        yield entries_of(part, source, base)


def iter_tar_parts(
    stream: IO[bytes],
    url: str,
    *,
    chunk_size: int = _DEFAULT_CHUNK,
    require_end: bool = True,
    start_offset: int = 0,
    runs: bool = False,
    places: bool = False,
) -> Iterator[tuple[list[Span] | Run, memoryview, int]]:
    """Yield the archive's regular files as ``(spans, source, base)``, without copying their data.

    ``spans`` are ``(name, offset, data position, size)`` of up to about ``chunk_size`` bytes
    of members, their data at ``source[position : position + size]``; ``base`` added to a
    position gives the data's offset in the archive. ``source`` is valid until the next part
    is asked for: copy out what is kept (:func:`entries_of` makes the members).

    A whole local file (a plain file object at offset 0, as ``open()`` or fsspec's local
    filesystem return it) is memory-mapped and its members are copied straight out of the
    page cache: one copy per byte, no read buffers. Anything else (remote streams, byte ranges,
    compressed or wrapped files) is read with ``read(n)`` in chunks.

    Args:
        stream: A binary file object, read sequentially with ``read(n)``.
        url: Named in every error.
        chunk_size: How many bytes to read at a time (for a mapped file: how far headers are
            parsed and verified ahead of the members yielded). Default: ``1 MiB``.
        require_end: Treat a stream that ends on a member boundary without the end-of-archive
            blocks as truncated (a file cut at a multiple of 512 bytes would otherwise lose its
            tail silently). ``False`` reads a byte range of an archive. Default: ``True``.
        start_offset: Where ``stream`` starts in the archive (a byte range read on its own):
            offsets in entries and errors are then those of the whole archive. Default: ``0``.
        runs: Members whose headers were parsed in bulk may come as a
            :class:`~shardpipes.formats.tarblocks.Run` (arrays; ``.spans()`` is the list)
            instead of a list of spans, for consumers that read them in bulk. Default: ``False``.
        places: Register a mapped local file (``formats/placed.py``), so that its large
            members are made by their place; what a stage asked to do so passes
            (``enable_placed_output``). Default: ``False``.

    Raises:
        ShardFormatError: Empty file, truncated member, corrupt header; the message names
            ``url`` and the byte offset.
    """
    stream = binary_stream(stream)
    opened = getattr(stream, "file_obj", stream)
    if isinstance(opened, tarfile.TarFile):  # torchdata 0.9's decompress() of a .tar.gz
        for entries in _iter_tarfile(opened, url):
            for name, data, offset, data_offset in entries:
                yield [(name, offset, 0, len(data))], memoryview(raw_bytes(data)), data_offset
        return
    map_local = getattr(stream, "map_local", None)  # a byte range of a local file (storage/)
    found = map_local() if map_local is not None else None
    if found is not None:  # (the map, where the range starts in it, its offset in the shard)
        ranged, lead, offset, (path, info) = found
        if places:
            _register_range(ranged, path, url, info, offset - lead)
        try:  # offsets counted from start_offset at the range's start, as the stream path does
            yield from _iter_mapped(
                ranged, url, chunk_size, lead, start_offset - lead, require_end, runs
            )
        finally:
            try:
                ranged.close()
            except BufferError:  # a numpy view still held by a traceback: the GC unmaps it
                pass
        return
    mapped = _map(stream, url, places) if require_end and start_offset == 0 else None
    if mapped is not None and by_magic(mapped[:MAGIC_LENGTH]) is not None:
        mapped.close()  # a compressed file: decompress it as a stream (the file is still at 0)
        mapped = None
    if mapped is None:
        if start_offset == 0:
            stream = _maybe_decompressed(stream, url)
        yield from _iter_stream(stream, url, chunk_size, require_end, start_offset, runs)
        return
    try:
        yield from _iter_mapped(mapped, url, chunk_size, runs=runs)
    finally:
        try:
            mapped.close()
        except BufferError:  # a numpy view still held by a traceback: the GC unmaps it
            pass


def _iter_tarfile(tar: tarfile.TarFile, url: str) -> Iterator[list[TarEntry]]:
    """The regular files of an archive that Python's ``tarfile`` has already opened."""
    info = None
    try:
        for info in tar:
            if not info.isfile():
                continue
            member = tar.extractfile(info)
            data = member.read() if member is not None else b""
            yield [_entry(TarEntry, (info.name, StreamBytes(data), info.offset, info.offset_data))]
    except (tarfile.TarError, EOFError, OSError) as exc:
        where = info.offset if info is not None else 0
        raise ShardFormatError(
            f"{url}: corrupt tar archive after byte offset {where}: {exc}",
            url=url,
            offset=where,
            member=info.name if info is not None else None,
        ) from exc


class _Prefixed(io.RawIOBase):
    """``head`` then the rest of ``stream``: the first bytes, read to recognise it, put back."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head = head
        self._stream = stream
        inner = getattr(stream, "take_block", None)
        if inner is not None:  # the head first, then the stream's blocks whole (_iter_stream)
            self._take_inner = inner
            self.take_block = self._take_block

    def _take_block(self) -> tuple[bytes, int]:
        head, self._head = self._head, b""
        return (head, 0) if head else self._take_inner()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        head = self._head
        if head:
            if n is None or n < 0 or n >= len(head):
                self._head = b""
                rest = self._stream.read(-1 if n is None or n < 0 else n - len(head))
                return head + (rest or b"")
            self._head = head[n:]
            return head[:n]
        return self._stream.read(n)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Checked:
    """A decompressing reader whose errors name the shard (a ``ShardFormatError``)."""

    def __init__(self, reader: IO[bytes], url: str, kind: str) -> None:
        self._reader = reader
        self._url = url
        self._kind = kind

    def read(self, n: int = -1) -> bytes:
        try:
            return self._reader.read(n)
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise ShardFormatError(
                f"{self._url}: its {self._kind} compression is corrupt or truncated: {exc}",
                url=self._url,
                offset=0,
            ) from exc

    def close(self) -> None:
        self._reader.close()


def _maybe_decompressed(stream: IO[bytes], url: str) -> IO[bytes]:
    """``stream``, or a reader decompressing it when it starts as gzip, bzip2 or xz does."""
    head = stream.read(MAGIC_LENGTH)
    if not head:
        return stream  # empty: the parser names the problem
    kind = by_magic(head)
    if kind is None:
        return _Prefixed(head, stream)  # type: ignore[return-value]
    prefixed = io.BufferedReader(_Prefixed(head, stream), 1 << 16)
    reader = decompress_stream(kind, prefixed)
    return _Checked(reader, url, kind)  # type: ignore[return-value]


def _map(stream: IO[bytes], url: str, places: bool = False) -> mmap.mmap | None:
    """Map ``stream`` read-only when it is a whole, plain, non-empty regular file; else ``None``.

    Only the exact built-in file types qualify: a compressing wrapper (gzip, fsspec's
    ``compression=``) also has a ``fileno()``, but of the compressed file. A file truncated by
    another process while it is mapped makes reading past the new end fail with ``SIGBUS``;
    shards are written once and then only read, as everywhere else in this package.
    """
    raw = getattr(stream, "file_obj", stream)  # a StreamWrapper (open_files_by_fsspec's)
    raw = getattr(raw, "f", raw)  # fsspec's LocalFileOpener keeps the file object in .f
    if type(raw) not in (io.BufferedReader, io.FileIO) or not hasattr(os, "pread"):
        return None  # (no pread: Windows reads every file as a stream)
    try:
        if raw.tell() != 0:
            return None
        fd = raw.fileno()
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return None  # an empty file goes the stream path, which names the problem
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    if places and isinstance(raw.name, str):  # its large members by their place
        placed.register(mapped, raw.name, url, fd)
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead as read() would on a cold cache
    return mapped


def _register_range(
    ranged: mmap.mmap, path: str, url: str, info: os.stat_result, origin: int
) -> None:
    """Name the file under a map of a byte range (formats/placed.py), if it is still the one."""
    try:
        with open(path, "rb") as f:
            placed.register(ranged, path, url, f.fileno(), origin, mapped_as=info)
    except OSError:
        pass  # not named: its members are copied, as without places


def _iter_mapped(
    buf: mmap.mmap,
    url: str,
    chunk_size: int,
    pos: int = 0,
    base: int = 0,
    require_end: bool = True,
    runs: bool = False,
) -> Iterator[Part]:
    """The members of a map from ``pos`` on; ``base`` is the archive offset of ``buf[0]``.

    A whole file is mapped from 0 and ends with the end-of-archive blocks; a byte range of a
    shard (an indexed read, ``require_end=False``) ends on a member boundary at the map's end.
    """
    view = memoryview(buf)
    try:
        yield from _members_of_map(buf, view, url, chunk_size, pos, base, require_end, runs)
    finally:
        view.release()


def _members_of_map(
    buf: mmap.mmap,
    view: memoryview,
    url: str,
    chunk_size: int,
    pos: int,
    base: int,
    require_end: bool,
    runs: bool,
) -> Iterator[Part]:
    """:func:`_iter_mapped`'s loop, over ``view`` (the whole map)."""
    carry: Carry = [None, NO_PAX, None]
    # Pages of the map that were read stay in this process's resident set (as shared file
    # pages) until unmapped; let go of each group's pages once its members are out, so a
    # mapped shard costs the process a group's worth of pages, not the shard's size.
    release = getattr(buf, "madvise", None)
    released = 0
    ahead = _AHEAD * chunk_size
    while True:
        # Headers are verified a group ahead of the members yielded; a group spans one chunk
        # of the file: the bulk scanner's arrays grow with it (4 chunks held 4 MB more at the
        # peak on 2 KB samples), and a chunk of a few large members goes to the general one.
        entries, at, end, need = scan(buf, pos, pos + ahead, base, url, carry, runs=runs)
        if len(entries):
            name, _, dpos, size = entries[-1]
            if dpos + size > len(view):  # the file was truncated since it was mapped
                truncated(url, base + len(view), f"inside member {name!r}")
            # Large members: a group of 1 MiB has only a few headers, each scan's fixed cost
            # (numpy's, per call) is paid for a few samples; take 4 chunks at a time then
            # (the scan holds only the headers, and the members are not read here).
            sparse = at - pos >= _SPARSE_MEMBER * len(entries)
            ahead = (_SPARSE_AHEAD if sparse else _AHEAD) * chunk_size
        pos = at
        for part in _parts(entries, chunk_size):
            yield part, view, base  # the data is then copied straight out of the page cache
        upto = min(pos, len(buf)) & ~(mmap.PAGESIZE - 1)
        if release is not None and upto > released:
            release(mmap.MADV_DONTNEED, released, upto - released)
            released = upto
        if end:
            return
        if len(buf) - pos < need:  # the file (or the range) ends before the next member does
            at_end(buf, pos, base, url, carry, require_end=require_end)
            return  # a byte range of an archive ends on a member boundary


def _iter_stream(
    stream: IO[bytes],
    url: str,
    chunk_size: int,
    require_end: bool,
    start_offset: int,
    runs: bool = False,
) -> Iterator[Part]:
    read = stream.read
    # A remote stream (storage/remote.py) hands over the block it holds, whole: its members
    # are parsed and copied out of it in place, instead of the block being copied into
    # chunks and each chunk again onto the unparsed tail (two copies of every byte fewer).
    take_block: Callable[[], tuple[bytes, int]] | None = getattr(stream, "take_block", None)
    buf = b""
    base = start_offset  # archive offset of buf[0]; always a multiple of 512
    pos = 0  # next header position in buf
    carry: Carry = [None, NO_PAX, None]
    while True:
        entries, pos, end, need = scan(buf, pos, len(buf), base, url, carry, runs=runs)
        view = memoryview(buf)
        for part in _parts(entries, chunk_size):
            yield part, view, base
        view.release()
        if end:
            if take_block is not None:
                _drain(take_block, chunk_size - (len(buf) - pos))
            return
        # Refill: keep the unparsed tail, read at least what the next member needs.
        if pos > len(buf):  # the last member's padding is not in buf yet
            skip = pos - len(buf)
            base += len(buf)
            buf, pos = b"", 0
            while skip:  # read() may return fewer bytes than asked before the end (sockets)
                skipped = read(skip)
                if not skipped:
                    truncated(url, base, "in the padding after the last member")
                base += len(skipped)
                skip -= len(skipped)
        if take_block is not None and pos == len(buf):
            # Nothing left over: parse the stream's block where it lies (from where the
            # stream is in it; the stream moves to its end).
            block, at = take_block()
            if not block:
                at_end(buf, pos, base, url, carry, require_end=require_end)
                return
            base += len(buf) - at
            buf, pos = block, at
            if at % BLOCK:  # buf[0] must be at a 512-byte boundary of the archive (blocks of
                # any size may not be): start at the one before the stream's position
                buf, pos, base = block[at % BLOCK :], at - at % BLOCK, base + at % BLOCK
            continue
        # A member runs past the end of what was read: with whole blocks, read only what it
        # needs (its copy is a member's size, not a chunk's).
        want = (
            need - (len(buf) - pos)
            if take_block is not None
            else max(chunk_size, need - (len(buf) - pos))
        )
        more = _read_upto(read, want)
        if not more:
            at_end(buf, pos, base, url, carry, require_end=require_end)
            return  # a byte range of an archive ends on a member boundary
        base += pos
        buf = buf[pos:] + more if pos < len(buf) else more
        pos = 0


def _drain(take_block: Callable[[], tuple[bytes, int]], upto: int) -> None:
    """Read on past the end-of-archive blocks, up to ``upto`` bytes, as a chunked read would.

    The record padding after the end marker is read, as reading in chunks read it: a shard's
    requests are the same whichever way it is parsed (every block once).
    """
    while upto > 0:
        block, at = take_block()
        if not block:
            return
        upto -= len(block) - at


_MAX_READ = 64 << 20


def slicer(source: memoryview) -> Callable[[slice], Any]:
    """``source[a:b]``, as ``bytes`` straight from the map or bytes under it where it can.

    Slicing a memoryview makes a view object that the copy into ``bytes`` then discards;
    an ``mmap`` or a ``bytes`` sliced itself copies once (a third of the cost on a small
    member). Anything else under the view (a ``bytearray``, a part of an object) is sliced
    through the view.
    """
    obj: Any = source.obj
    if type(obj) in (bytes, mmap.mmap) and source.nbytes == len(obj):
        return obj.__getitem__  # type: ignore[no-any-return]
    return source.__getitem__


def entries_of(part: list[Span] | Run, source: memoryview, base: int) -> list[TarEntry]:
    """The members of a part of :func:`iter_tar_parts`, their data copied out of ``source``."""
    if isinstance(part, Run):
        part = part.spans()
    if not part:
        return []
    names, starts, at, sizes = zip(*part, strict=True)
    where = placed.place_of(source, sizes)
    data: Iterable[StreamBytes]
    if where is not None:  # large members by their place (formats/placed.py)
        data = placed.values(where, slicer(source), at, sizes)
    else:  # every step a C-level map: no Python frame per member
        data = map(StreamBytes, map(slicer(source), map(slice, at, map(operator.add, at, sizes))))
    offsets = map(operator.add, at, repeat(base)) if base else at
    return list(
        map(tuple.__new__, repeat(TarEntry), zip(names, data, starts, offsets, strict=True))
    )


_PART = 512  # members per list at most


def _parts(entries: list[Span] | Run, budget: int) -> Iterator[list[Span] | Run]:
    """``entries`` cut into runs of about ``budget`` bytes of data (and ``_PART`` members) each.

    What a list of members holds in memory at once stays near one chunk, as when members were
    made one at a time. Each run has at least one member. A :class:`Run` is cut into Runs by
    data bytes only: its members are not objects until a consumer makes them.
    """
    if isinstance(entries, Run):
        yield from _run_parts(entries, budget)
        return
    n = len(entries)
    ends = list(accumulate(map(itemgetter(3), entries)))  # data bytes up to each member
    start = 0
    while start < n:
        held = ends[start - 1] if start else 0
        stop = min(bisect_right(ends, held + budget, start + 1), start + _PART)
        yield entries[start : max(stop, start + 1)]
        start = max(stop, start + 1)


def _run_parts(run: Run, budget: int) -> Iterator[Run]:
    """:func:`_parts` of a :class:`Run`: the same cuts by data bytes, without ``_PART``."""
    n = len(run)
    ends = np.cumsum(run.sizes)
    if not n or ends[-1] <= budget:
        if n:
            yield run
        return
    start = 0
    while start < n:
        held = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, held + budget, side="right")), start + 1)
        yield run.part(start, stop)
        start = stop


def _read_upto(read: Callable[[int], bytes], size: int) -> bytes:
    """Read ``size`` bytes (fewer at EOF) in pieces of at most 64 MiB.

    ``FileIO.read(n)`` allocates ``n`` bytes before reading; a corrupt size field can claim
    terabytes, so a header that lies costs at most the rest of the real file.
    """
    if size <= _MAX_READ:
        return read(size)
    parts = []
    while size > 0:
        piece = read(min(size, _MAX_READ))
        if not piece:
            break
        parts.append(piece)
        size -= len(piece)
    return b"".join(parts)
