"""A tar parser that parses headers itself, from a memory-mapped file or large buffered reads.

Python's ``tarfile`` spends most of its time per member building ``TarInfo`` objects and
summing header checksums byte by byte (about 55% of webdataset's time on small samples). Here
one scanner (:func:`_scan`) finds every complete member in a buffer with a few slices per
header, and verifies the checksums of all of those headers in one numpy operation over a
``(blocks, 512)`` view. The buffer is either

- the ``mmap`` of a whole local file: members are copied straight out of the page cache
  (members of 64 KiB and more with ``pread``), so each byte is copied once, and no read
  buffer is allocated, filled and sliced again; or
- chunks read from any other stream (remote objects, byte ranges, wrappers), holding one
  chunk plus the largest member.

Supported: POSIX ustar (with the 155-byte prefix), GNU long names (``L``), pax extended headers
(``x``: ``path`` and ``size``), base-256 sizes. Directories, links and other entry types are
skipped; global pax headers (``g``) are ignored.
"""

from __future__ import annotations

import io
import mmap
import os
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any, NamedTuple

import numpy as np

from shardpipes.errors import ShardFormatError

__all__ = ["BLOCK", "TarEntry", "iter_tar"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_REGULAR_FLAGS = frozenset(b"0\x007")  # the same type flags, as the ints bytes indexing gives
_LONGNAME, _PAX = ord("L"), ord("x")
_TERMINATORS = frozenset(b"\x00 ")
_GZIP_MAGIC = b"\x1f\x8b"
_DEFAULT_CHUNK = 1 << 20
_PREAD_MIN = 64 << 10  # members at least this large are read with pread from a mapped file
# Larger sizes cannot be read (``read(n)`` takes an ssize_t); only a corrupt header claims them.
_MAX_SIZE = 1 << 62


class TarEntry(NamedTuple):
    """One regular file of a tar archive.

    ``offset`` is the byte offset of the member's first header (including any GNU long-name or
    pax header before it), so ``[offset, data_offset + size)`` is everything needed to read the
    member alone; ``data_offset`` is where its bytes start.
    """

    name: str
    data: bytes
    offset: int
    data_offset: int


# A chunk of a stream, or the map of a whole file: both slice to bytes and index to ints.
Buffer = bytes | mmap.mmap
# What a member's own header still has to consume: (GNU long name, pax records, first header offset).
_Carry = list[Any]
_NO_PAX: dict[str, str] = {}  # shared, never modified: _parse_pax returns a new dict


# TarEntry(*fields) without the Python-level __new__ that namedtuple generates: a member is
# made hundreds of thousands of times a second.
_entry: Callable[[type[TarEntry], tuple[str, bytes, int, int]], TarEntry] = tuple.__new__


def _parse_size(field: bytes, url: str, offset: int) -> int:
    if field[0] & 0x80:  # base-256 (GNU) for sizes >= 8 GiB; 0xff starts a negative number
        size = int.from_bytes(field[1:], "big") if field[0] == 0x80 else -1
    else:
        digits = field.split(b"\0", 1)[0].strip()
        try:
            size = int(digits, 8) if digits else 0
        except ValueError:
            size = -1
    return _checked_size(size, field, url, offset)


def _checked_size(size: int, field: object, url: str, offset: int) -> int:
    # A negative size would move the parser backwards (or not at all): never accept one.
    if not 0 <= size < _MAX_SIZE:
        raise ShardFormatError(
            f"{url}: corrupt tar header at byte offset {offset}: size {field!r} is not a valid size",
            url=url,
            offset=offset,
        )
    return size


def _parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardFormatError(
                f"{url}: corrupt pax header at byte offset {offset}", url=url, offset=offset
            ) from None
        if length <= 0 or space < 0:
            raise ShardFormatError(
                f"{url}: corrupt pax header at byte offset {offset}", url=url, offset=offset
            )
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    size = records.get("size")
    if size is not None:
        if not (size.isascii() and size.isdigit()):
            raise ShardFormatError(
                f"{url}: corrupt pax header at byte offset {offset}: size {size!r} is not a number",
                url=url,
                offset=offset,
            )
        _checked_size(int(size), size, url, offset)
    return records


_OCTAL = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def _stored_sum(hdr: bytes) -> int:
    digits = hdr[148:156].split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8)
    except ValueError:
        return -1  # never equal to a computed sum: reported as a checksum mismatch


def _check_sums(buf: Buffer, header_positions: list[int], base: int, url: str) -> None:
    """Verify the checksums of the headers at ``header_positions`` (multiples of 512 in buf)."""
    blocks = np.frombuffer(buf, dtype=np.uint8, count=(len(buf) // BLOCK) * BLOCK)
    rows = blocks.reshape(-1, BLOCK)[np.asarray(header_positions) // BLOCK]
    del blocks  # a view of buf: an mmap cannot be closed while one exists
    field = rows[:, 148:156]
    # The checksum is the sum of all header bytes with the checksum field read as 8 spaces.
    computed = rows.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 32
    # The stored sum, read for all headers at once in the usual encoding (6 octal digits, then
    # NUL or space); the rows written otherwise are read one by one.
    digits = field[:, :6].astype(np.int64) - ord("0")
    end = field[:, 6]
    usual = ((digits >= 0) & (digits <= 7)).all(axis=1) & ((end == 0) | (end == 32))
    stored = digits @ _OCTAL
    for i in np.flatnonzero(~usual):
        stored[i] = _stored_sum(rows[i].tobytes())
    for i in np.flatnonzero(computed != stored):
        pos = header_positions[int(i)]
        raise ShardFormatError(
            f"{url}: corrupt tar header at byte offset {base + pos} (checksum mismatch)",
            url=url,
            offset=base + pos,
        )


def _scan(
    buf: Buffer, pos: int, stop: int, base: int, url: str, carry: _Carry
) -> tuple[list[tuple[str, int, int, int]], int, bool, int]:
    """Parse the members whose header and data are complete in ``buf``, from ``pos`` until ``stop``.

    ``buf`` is ``bytes`` (a chunk of a stream) or the ``mmap`` of a whole file; ``base`` is the
    archive offset of ``buf[0]``, ``carry`` the GNU long name / pax records / first-header offset
    that a member's own header still has to consume. Every header passed over is verified
    (checksums in one numpy operation) before anything is returned, and so is the header of a
    member whose data is not complete in ``buf``: a corrupt size field is reported as such,
    not after reading (and holding) up to 8 GiB.

    Returns:
        ``(entries, pos, end, need)``: ``(name, member start, data position, size)`` of each
        complete member, where the next header starts, whether the end-of-archive blocks were
        reached, and how many bytes from ``pos`` the next member needs in all.
    """
    entries: list[tuple[str, int, int, int]] = []
    headers: list[int] = []
    end = False
    need = BLOCK
    long_name, pax, member_start = carry
    while len(buf) - pos >= BLOCK and pos < stop:
        # Fields are parsed in place from buf (no 512-byte header copy). The fast paths take the
        # usual encoding (11 octal digits + NUL or space); anything else (spaces, 12 digits,
        # base-256, garbage) goes to the careful parsers.
        if buf[pos] == 0 and buf[pos : pos + BLOCK] == _ZERO:
            end = True
            break
        if "size" in pax:
            size = int(pax["size"])
        else:
            size = -1
            if buf[pos + 135] in _TERMINATORS:
                try:
                    size = int(buf[pos + 124 : pos + 135], 8)
                except ValueError:
                    pass
            if size < 0:
                size = _parse_size(buf[pos + 124 : pos + 136], url, base + pos)
        data_end = pos + BLOCK + size
        if data_end > len(buf):
            need = data_end - pos
            _check_sums(buf, [*headers, pos], base, url)
            break
        headers.append(pos)
        if member_start is None:
            member_start = base + pos
        flag = buf[pos + 156]
        if flag in _REGULAR_FLAGS:
            if long_name is not None:
                name = long_name
            elif "path" in pax:
                name = pax["path"]
            else:
                nul = buf.find(b"\0", pos, pos + 100)
                name = buf[pos : nul if nul >= 0 else pos + 100].decode("utf-8", "surrogateescape")
                if buf[pos + 345] != 0 and buf[pos + 257 : pos + 263] == b"ustar\0":
                    prefix = (
                        buf[pos + 345 : pos + 500]
                        .split(b"\0", 1)[0]
                        .decode("utf-8", "surrogateescape")
                    )
                    name = f"{prefix}/{name}"
            entries.append((name, member_start, pos + BLOCK, size))
            long_name, pax, member_start = None, _NO_PAX, None
        elif flag == _LONGNAME:
            long_name = (
                buf[pos + BLOCK : data_end].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            )
        elif flag == _PAX:
            pax = _parse_pax(buf[pos + BLOCK : data_end], url, base + pos)
        else:  # directory, link, fifo, global pax header...: nothing to yield
            long_name, pax, member_start = None, _NO_PAX, None
        pos += BLOCK + ((size + BLOCK - 1) & ~(BLOCK - 1))  # the data, padded to a block
    if headers:
        _check_sums(buf, headers, base, url)
    carry[:] = long_name, pax, member_start
    return entries, pos, end, need


def _at_end(
    buf: Buffer, pos: int, base: int, url: str, carry: _Carry, *, require_end: bool
) -> None:
    """The data ended at ``buf[len(buf)]`` with the next member at ``pos``: raise what is wrong.

    Returns only for a byte range of an archive (``require_end=False``) that ends on a member
    boundary, which is how such a range is meant to end.
    """
    if pos > len(buf):  # the last member's padding is missing
        _truncated(url, base + len(buf), "in the padding after the last member")
    if len(buf) == pos:
        if require_end and base + pos == 0:
            raise ShardFormatError(
                f"{url}: empty file (0 bytes) is not a tar archive", url=url, offset=0
            )
        if require_end:
            _truncated(url, base + pos, "no end-of-archive marker after the last member")
        return
    if len(buf) - pos < BLOCK:
        _truncated(url, base + pos, "inside a header")
    hdr = buf[pos : pos + BLOCK]
    _check_sums(buf, [pos], base, url)
    long_name, pax, _ = carry
    name = (
        long_name
        or pax.get("path")
        or hdr[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    )
    _truncated(url, base + pos, f"inside member {name!r}")


def iter_tar(
    stream: IO[bytes],
    url: str,
    *,
    chunk_size: int = _DEFAULT_CHUNK,
    require_end: bool = True,
    start_offset: int = 0,
) -> Iterator[TarEntry]:
    """Yield the regular files of the tar archive read from ``stream``, in archive order.

    A whole local file (a plain file object at offset 0, as ``open()`` or fsspec's local
    filesystem return it) is memory-mapped and its members are copied straight out of the
    page cache: one copy per byte, no read buffers. Anything else (remote streams, byte ranges,
    compressed or wrapped files) is read with ``read(n)`` in chunks.

    Args:
        stream: A binary file object, read sequentially with ``read(n)``.
        url: Named in every error.
        chunk_size: How many bytes to read at a time (for a mapped file: a quarter of how far
            headers are parsed and verified ahead of the members yielded). Default: ``1 MiB``.
        require_end: Treat a stream that ends on a member boundary without the end-of-archive
            blocks as truncated (a file cut at a multiple of 512 bytes would otherwise lose its
            tail silently). ``False`` reads a byte range of an archive. Default: ``True``.
        start_offset: Where ``stream`` starts in the archive (a byte range read on its own):
            offsets in entries and errors are then those of the whole archive. Default: ``0``.

    Raises:
        ShardFormatError: Empty file, truncated member, corrupt header; the message names
            ``url`` and the byte offset.
    """
    mapped = _map(stream) if require_end and start_offset == 0 else None
    if mapped is None:
        yield from _iter_stream(stream, url, chunk_size, require_end, start_offset)
        return
    try:
        yield from _iter_mapped(mapped, stream.fileno(), url, chunk_size)
    finally:
        try:
            mapped.close()
        except BufferError:  # a numpy view still held by a traceback: the GC unmaps it
            pass


def _map(stream: IO[bytes]) -> mmap.mmap | None:
    """Map ``stream`` read-only when it is a whole, plain, non-empty regular file; else ``None``.

    Only the exact built-in file types qualify: a compressing wrapper (gzip, fsspec's
    ``compression=``) also has a ``fileno()``, but of the compressed file. A file truncated by
    another process while it is mapped makes reading past the new end fail with ``SIGBUS``;
    shards are written once and then only read, as everywhere else in this package.
    """
    raw = getattr(stream, "f", stream)  # fsspec's LocalFileOpener keeps the file object in .f
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
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead as read() would on a cold cache
    return mapped


def _iter_mapped(buf: mmap.mmap, fd: int, url: str, chunk_size: int) -> Iterator[TarEntry]:
    if buf[:2] == _GZIP_MAGIC:
        _gzip(url)
    carry: _Carry = [None, _NO_PAX, None]
    pos = 0
    pread = os.pread
    # Pages of the map that were read stay in this process's resident set (as shared file
    # pages) until unmapped; let go of each group's pages once its members are out, so a
    # mapped shard costs the process a group's worth of pages, not the shard's size.
    release = getattr(buf, "madvise", None)
    released = 0
    while True:
        # Headers are verified a group ahead of the members yielded; a group spans 4 chunks of
        # the file, since scanning a map reads nothing but the headers, and the numpy check
        # costs about the same for 10 headers as for 100 (large members).
        entries, pos, end, need = _scan(buf, pos, pos + 4 * chunk_size, 0, url, carry)
        for name, start, dpos, size in entries:
            if size < _PREAD_MIN:
                yield _entry(TarEntry, (name, buf[dpos : dpos + size], start, dpos))
                continue
            # A large member is copied by the kernel (pread into the new bytes object), which
            # writes cold memory faster than a user-space copy out of the map does, and never
            # faults the member's pages into this process (measured on 100 KB members: +10-15%).
            data = pread(fd, size, dpos)
            if len(data) != size:  # the file was truncated since it was mapped
                _truncated(url, dpos + len(data), f"inside member {name!r}")
            yield _entry(TarEntry, (name, data, start, dpos))
        upto = min(pos, len(buf)) & ~(mmap.PAGESIZE - 1)
        if release is not None and upto > released:
            release(mmap.MADV_DONTNEED, released, upto - released)
            released = upto
        if end:
            return
        if len(buf) - pos < need:  # the file ends before the next member does
            _at_end(buf, pos, 0, url, carry, require_end=True)


def _iter_stream(
    stream: IO[bytes], url: str, chunk_size: int, require_end: bool, start_offset: int
) -> Iterator[TarEntry]:
    read = stream.read
    buf = b""
    base = start_offset  # archive offset of buf[0]; always a multiple of 512
    pos = 0  # next header position in buf
    carry: _Carry = [None, _NO_PAX, None]
    while True:
        if base == 0 and pos == 0 and buf[:2] == _GZIP_MAGIC:
            _gzip(url)
        entries, pos, end, need = _scan(buf, pos, len(buf), base, url, carry)
        for name, start, dpos, size in entries:
            yield _entry(TarEntry, (name, buf[dpos : dpos + size], start, base + dpos))
        if end:
            return
        # Refill: keep the unparsed tail, read at least what the next member needs.
        if pos > len(buf):  # the last member's padding is not in buf yet
            skip = pos - len(buf)
            base += len(buf)
            buf, pos = b"", 0
            while skip:  # read() may return fewer bytes than asked before the end (sockets)
                skipped = read(skip)
                if not skipped:
                    _truncated(url, base, "in the padding after the last member")
                base += len(skipped)
                skip -= len(skipped)
        more = _read_upto(read, max(chunk_size, need - (len(buf) - pos)))
        if not more:
            _at_end(buf, pos, base, url, carry, require_end=require_end)
            return  # a byte range of an archive ends on a member boundary
        base += pos
        buf = buf[pos:] + more if pos < len(buf) else more
        pos = 0


def _gzip(url: str) -> None:
    raise ShardFormatError(
        f"{url}: is gzip-compressed (it starts with bytes 1f 8b); load_from_tar reads "
        "uncompressed tar shards: decompress it (gunzip), or write shards uncompressed",
        url=url,
        offset=0,
    )


_MAX_READ = 64 << 20


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


def _truncated(url: str, offset: int, where: str) -> None:
    raise ShardFormatError(
        f"{url}: truncated tar archive at byte offset {offset} ({where})", url=url, offset=offset
    )
