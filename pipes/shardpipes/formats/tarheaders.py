"""The tar format itself: header fields, checksums, and a scanner over a buffer of headers.

:func:`scan` finds every complete member in a buffer (a chunk of a stream, or the ``mmap`` of
a whole file) with a few slices per header, and verifies the checksums of all of those headers
in one numpy operation over a ``(blocks, 512)`` view; :func:`at_end` says what is wrong when the
data ends before the archive does. How the buffer is filled is ``_tarparse``'s business.

Supported: POSIX ustar (with the 155-byte prefix), GNU long names (``L``), pax extended headers
(``x``: ``path`` and ``size``), base-256 sizes. Directories, links and other entry types are
skipped; global pax headers (``g``) are ignored.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from shardpipes.errors import ShardFormatError

__all__ = ["BLOCK", "NO_PAX", "Buffer", "Carry", "at_end", "scan", "truncated"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR_FLAGS = frozenset(b"0\x007")  # regular-file type flags, as the ints bytes indexing gives
_LONGNAME, _PAX = ord("L"), ord("x")
_TERMINATORS = frozenset(b"\x00 ")
# Larger sizes cannot be read (``read(n)`` takes an ssize_t); only a corrupt header claims them.
_MAX_SIZE = 1 << 62

# A chunk of a stream, or the map of a whole file: both slice to bytes and index to ints.
Buffer = bytes | mmap.mmap
# What a member's own header still has to consume: (GNU long name, pax records, first header offset).
Carry = list[Any]
NO_PAX: dict[str, str] = {}  # shared, never modified: _parse_pax returns a new dict


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


def scan(
    buf: Buffer, pos: int, stop: int, base: int, url: str, carry: Carry
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
            long_name, pax, member_start = None, NO_PAX, None
        elif flag == _LONGNAME:
            long_name = (
                buf[pos + BLOCK : data_end].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            )
        elif flag == _PAX:
            pax = _parse_pax(buf[pos + BLOCK : data_end], url, base + pos)
        else:  # directory, link, fifo, global pax header...: nothing to yield
            long_name, pax, member_start = None, NO_PAX, None
        pos += BLOCK + ((size + BLOCK - 1) & ~(BLOCK - 1))  # the data, padded to a block
    if headers:
        _check_sums(buf, headers, base, url)
    carry[:] = long_name, pax, member_start
    return entries, pos, end, need


def at_end(buf: Buffer, pos: int, base: int, url: str, carry: Carry, *, require_end: bool) -> None:
    """The data ended at ``buf[len(buf)]`` with the next member at ``pos``: raise what is wrong.

    Returns only for a byte range of an archive (``require_end=False``) that ends on a member
    boundary, which is how such a range is meant to end.
    """
    if pos > len(buf):  # the last member's padding is missing
        truncated(url, base + len(buf), "in the padding after the last member")
    if len(buf) == pos:
        if require_end and base + pos == 0:
            raise ShardFormatError(
                f"{url}: empty file (0 bytes) is not a tar archive", url=url, offset=0
            )
        if require_end:
            truncated(url, base + pos, "no end-of-archive marker after the last member")
        return
    if len(buf) - pos < BLOCK:
        truncated(url, base + pos, "inside a header")
    hdr = buf[pos : pos + BLOCK]
    _check_sums(buf, [pos], base, url)
    long_name, pax, _ = carry
    name = (
        long_name
        or pax.get("path")
        or hdr[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    )
    truncated(url, base + pos, f"inside member {name!r}")


def truncated(url: str, offset: int, where: str) -> None:
    """Raise the ``ShardFormatError`` for an archive that ends at ``offset``."""
    raise ShardFormatError(
        f"{url}: truncated tar archive at byte offset {offset} ({where})", url=url, offset=offset
    )
