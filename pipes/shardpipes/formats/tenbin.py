"""webdataset's ``tenbin`` format (``.ten``/``.tb`` members): numeric arrays, 64-byte aligned.

A buffer is a run of chunks, each ``b"~TenBin~"``, its length as a little-endian int64, then
its bytes padded with NULs to a multiple of 64. An array is two chunks: a header (int64 words:
the dtype as up to 8 ASCII characters (``"f4"``, ``"u1"``, ...), an info string of up to 8
ASCII characters, the number of dimensions, then each dimension) and its data, C order.

Written here from that description (webdataset's own module is not a dependency); buffers
it writes read back with webdataset's and the other way round. Differences: ``uint32``
arrays are written and read (webdataset's table misspells the type, so it can do neither),
and ``infos=[...]`` checks the info strings (webdataset's check raises whatever they are).
Only numeric arrays are ever made: nothing is unpickled.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np

__all__ = ["decode_buffer", "encode_buffer", "load", "read", "save", "write"]

MAGIC = b"~TenBin~"
_LENGTH = struct.Struct("<q")
_ALIGN = 64
_MAX_DIMS = 9
# dtype name -> the code a header carries
_CODES = {
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
}
_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in _CODES.items()}


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _word(text: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > 8:
        raise ValueError(f"tenbin: an info string holds at most 8 ASCII characters, got {text!r}")
    return raw.ljust(8, b"\0")


def _header(a: np.ndarray, info: str) -> bytes:
    code = _CODES.get(a.dtype.name)
    if code is None:
        raise ValueError(
            f"tenbin: cannot encode an array of {a.dtype}; it takes {', '.join(_CODES)}"
        )
    if a.ndim > _MAX_DIMS:
        raise ValueError(f"tenbin: at most {_MAX_DIMS} dimensions, got {a.ndim}")
    dims = np.array([a.ndim, *a.shape], dtype="<i8").tobytes()
    return _word(code) + _word(info) + dims


def _chunks_of(arrays: Sequence[Any], infos: Sequence[str] | None) -> Iterator[bytes]:
    if not isinstance(arrays, list | tuple):
        raise ValueError(f"tenbin: encodes a list of arrays, got {type(arrays).__name__}")
    if infos is not None and len(infos) != len(arrays):
        raise ValueError(f"tenbin: {len(infos)} info strings for {len(arrays)} arrays")
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        yield _header(a, infos[i] if infos is not None else "")
        yield np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def encode_buffer(arrays: Sequence[Any], infos: Sequence[str] | None = None) -> bytearray:
    """``arrays`` (a list of numpy arrays) as one tenbin buffer."""
    chunks = list(_chunks_of(arrays, infos))
    out = bytearray(sum(16 + _padded(len(c)) for c in chunks))
    at = 0
    for c in chunks:
        out[at : at + 8] = MAGIC
        _LENGTH.pack_into(out, at + 8, len(c))
        out[at + 16 : at + 16 + len(c)] = c
        at += 16 + _padded(len(c))
    return out


def _chunk_size(head: Any, at: int) -> int:
    """The length a chunk header (16 bytes from ``head[0]``, at byte ``at``) gives its data."""
    if bytes(head[:8]) != MAGIC:
        raise ValueError(f"tenbin: no chunk magic at byte {at} (not a tenbin buffer?)")
    if len(head) < 16:
        raise ValueError(f"tenbin: the data ends inside the chunk header at byte {at}")
    (n,) = _LENGTH.unpack_from(head, 8)
    if n < 0:
        raise ValueError(f"tenbin: the chunk at byte {at} says {n} bytes")
    return int(n)


def _chunks(buf: Any) -> list[memoryview]:
    view = memoryview(buf).cast("B")
    out = []
    at = 0
    while at < len(view):
        n = _chunk_size(view[at : at + 16], at)
        if at + 16 + n > len(view):
            raise ValueError(
                f"tenbin: the chunk at byte {at} says {n} bytes; the buffer has {len(view) - at - 16}"
            )
        out.append(view[at + 16 : at + 16 + n])
        at += 16 + _padded(n)
    return out


def _array(header: memoryview, data: memoryview, at: int) -> tuple[np.ndarray, str]:
    if len(header) < 24 or len(header) % 8:
        raise ValueError(f"tenbin: array {at}: a header of {len(header)} bytes")
    code = bytes(header[:8]).rstrip(b"\0").decode("ascii", "replace")
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise ValueError(f"tenbin: array {at}: unknown type code {code!r}")
    info = bytes(header[8:16]).rstrip(b"\0").decode("ascii", "replace")
    words = np.frombuffer(header, dtype="<i8")
    ndim = int(words[2])
    if not 0 <= ndim <= min(_MAX_DIMS, len(words) - 3):
        raise ValueError(
            f"tenbin: array {at}: {ndim} dimensions in a header of {len(header)} bytes"
        )
    shape = tuple(int(d) for d in words[3 : 3 + ndim])
    count = int(np.prod(shape, dtype=np.int64))
    if min(shape, default=0) < 0 or count * dtype.itemsize != len(data):
        raise ValueError(
            f"tenbin: array {at}: shape {shape} of {dtype} needs {count * dtype.itemsize} bytes, "
            f"its data chunk has {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape), info


def _check_infos(found: list[str], wanted: Any) -> None:
    if not isinstance(wanted, list | tuple):
        raise ValueError("tenbin: infos must be a bool, a list or a tuple")
    for i, (want, got) in enumerate(zip(wanted, found, strict=False)):
        if want != got:
            raise ValueError(f"tenbin: array {i} has info {got!r}, not {want!r}")


def _decode(chunks: list[memoryview], infos: Any) -> Any:
    if len(chunks) % 2:
        raise ValueError("tenbin: an array header without its data chunk")
    pairs = [
        _array(h, d, i) for i, (h, d) in enumerate(zip(chunks[::2], chunks[1::2], strict=True))
    ]
    arrays = [a for a, _ in pairs]
    found = [info for _, info in pairs]
    if infos is True:
        return arrays, found
    if infos is not False and infos is not None:
        _check_infos(found, infos)
    return arrays


def decode_buffer(buf: Any, infos: Any = False) -> Any:
    """The arrays of a tenbin buffer (views of it); ``infos=True``: ``(arrays, info strings)``.

    ``infos`` a list: the info strings must be those, else ``ValueError``.
    """
    return _decode(_chunks(buf), infos)


def write(stream: IO[bytes], arrays: Sequence[Any], infos: Sequence[str] | None = None) -> None:
    """Write ``arrays`` to a binary stream as tenbin chunks."""
    stream.write(encode_buffer(arrays, infos))


def read(stream: IO[bytes], n: int = sys.maxsize, infos: Any = False) -> Any:
    """Read up to ``n`` arrays from a binary stream of tenbin chunks."""
    chunks: list[memoryview] = []
    at = 0  # bytes read, for the messages
    while len(chunks) < 2 * n:
        head = stream.read(16)
        if not head:
            break
        size = _chunk_size(head, at)
        body = stream.read(_padded(size))
        if len(body) < size:
            raise ValueError(
                f"tenbin: the chunk at byte {at} says {size} bytes; the stream has {len(body)}"
            )
        chunks.append(memoryview(body)[:size])
        at += 16 + len(body)
    return _decode(chunks, infos)


def _named(fname: str, nocheck: bool) -> None:
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError(f"tenbin: {fname!r}: the file name should end in .ten (or nocheck=True)")


def save(
    fname: str, *arrays: Any, infos: Sequence[str] | None = None, nocheck: bool = False
) -> None:
    """Write ``arrays`` to file ``fname`` (``.ten``)."""
    _named(fname, nocheck)
    with open(fname, "wb") as stream:
        write(stream, list(arrays), infos=infos)


def load(fname: str, infos: Any = False, nocheck: bool = False) -> Any:
    """The arrays of file ``fname`` (``.ten``)."""
    _named(fname, nocheck)
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
