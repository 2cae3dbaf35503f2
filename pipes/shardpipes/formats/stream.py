"""``StreamBytes``: a member's data as a real in-memory file that also answers like ``bytes``.

torchdata 0.9's ``load_from_tar`` and ``webdataset()`` yielded file objects, and 0.9 code hands
them to whatever reads files: ``PIL.Image.open(v)``, ``torch.load(v)``, ``tarfile.open(fileobj=v)``,
``np.load(v)``, ``json.load(v)``, ``pickle.load(v)``, ``io.TextIOWrapper(v)``. A ``StreamBytes`` is
a binary file object (``read``/``readinto``/``seek``/``tell``/lines; registered as an
:class:`io.BufferedIOBase`), so every one of those takes it as the file it is, and it is *not* a
``bytes``: libraries test ``isinstance(x, bytes)`` first and take a ``bytes`` for a file name.

It also answers the ``bytes`` questions shardpipes' docs promised: ``bytes(v)`` (the data,
without a copy), ``len(v)``, ``v[i]``/``v[a:b]``, ``v == b"..."``, ``hash(v)``, ``b"x" in v``,
``v + b"..."``, ``v.decode()`` and the other ``bytes`` methods (``startswith``, ``split``, ...).
What it cannot do on Python 3.11 is lend its memory through the buffer protocol: C functions that
take any bytes-like object (``io.BytesIO(v)``, ``np.frombuffer(v)``, ``b"".join``, ``hashlib``,
``zlib``, ``json.loads(v)``, ``int(v)``) need ``bytes(v)`` (free) or the file itself. From
Python 3.12 the value offers the buffer protocol too (``__buffer__``, PEP 688).

``read()`` keeps a position (``read()`` twice gives the data and then ``b""``); ``close()`` keeps
the data (0.9 code closes each stream after reading it, and the value stays usable).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from typing import IO, Any, cast

__all__ = ["StreamBytes", "binary_stream", "raw_bytes"]

# The bytes methods a StreamBytes answers (on its data, as a bytes would). ``count`` and
# ``index`` are on the list too: BytesIO has neither, so nothing else can answer them.
_BYTES_METHODS = frozenset(
    name for name in dir(bytes) if not name.startswith("_") and name not in ("fromhex", "maketrans")
)


class StreamBytes:
    """A member's data: a binary file object that also answers like ``bytes``.

    A read-only in-memory file (``read``, ``readinto``, ``readline``, ``seek``, ``tell``, line
    iteration, ...; an ``io.BufferedIOBase`` to ``isinstance``) over the member's ``bytes``,
    which it holds as they are: the file's buffer is made on the first partial read or seek and
    shares them, and ``bytes(v)``/``getvalue()`` return them without a copy.

    Examples:
        >>> v = StreamBytes(b"one|two")
        >>> v == b"one|two", v[:3], v.decode().upper(), len(v), bytes(v)
        (True, b'one', 'ONE|TWO', 7, b'one|two')
        >>> v.read(3), v.read(), v.read()
        (b'one', b'|two', b'')
        >>> v.seek(0)
        0
        >>> import json
        >>> json.load(StreamBytes(b'{"a": 1}'))
        {'a': 1}
    """

    # _pos: None (never read), an int (read whole: the position, no buffer made), or the
    # io.BytesIO made on the first partial read or seek (it shares _data).
    __slots__ = ("_data", "_pos")

    mode = "rb"

    def __init__(self, data: Any = b"", /) -> None:
        self._data: bytes = data if type(data) is bytes else bytes(data)
        self._pos: Any = None

    def _file(self) -> io.BytesIO:
        pos = self._pos
        if type(pos) is io.BytesIO:
            return pos
        f = io.BytesIO(self._data)
        if pos:
            f.seek(pos)
        self._pos = f
        return f

    # -- the data ------------------------------------------------------------------------

    def getvalue(self) -> bytes:
        """The member's data (the ``bytes`` themselves, no copy)."""
        return self._data

    def getbuffer(self) -> memoryview:
        """A read-only view of the data."""
        return memoryview(self._data)

    def __bytes__(self) -> bytes:
        return self._data

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: Any) -> Any:
        return self._data[index]

    def __contains__(self, item: object) -> bool:
        return item in self._data  # type: ignore[operator]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StreamBytes):
            return self._data == other._data
        if isinstance(other, bytes | bytearray | memoryview):
            return self._data == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self._data)

    def __add__(self, other: Any) -> bytes:
        return self._data + bytes(other)

    def __radd__(self, other: Any) -> bytes:
        return bytes(other) + self._data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the file does not have: the bytes methods, on the data.
        if name in _BYTES_METHODS:
            return getattr(self._data, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    if sys.version_info >= (3, 12):

        def __buffer__(self, flags: int, /) -> memoryview:
            return memoryview(self._data)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The data decoded as text (as ``bytes.decode``)."""
        return self._data.decode(encoding, errors)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamBytes, (self._data,))

    # -- the file ------------------------------------------------------------------------

    def read(self, n: int | None = -1, /) -> bytes:
        """Read up to ``n`` bytes (all that is left when ``n`` is ``-1`` or ``None``)."""
        if self._pos is None and (n is None or n < 0):
            self._pos = len(self._data)  # the usual case: one read() of everything
            return self._data
        return self._file().read(n)

    def read1(self, n: int = -1, /) -> bytes:
        """Same as :meth:`read`."""
        return self.read(n)

    def readinto(self, buffer: Any, /) -> int:
        """Read into a writable buffer; return the number of bytes read."""
        return self._file().readinto(buffer)

    def readinto1(self, buffer: Any, /) -> int:
        """Same as :meth:`readinto`."""
        return self._file().readinto(buffer)

    def readline(self, size: int | None = -1, /) -> bytes:
        """Read one line (up to ``size`` bytes)."""
        return self._file().readline(size)

    def readlines(self, hint: int | None = -1, /) -> list[bytes]:
        """Read the remaining lines."""
        return self._file().readlines(hint)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Move the read position (as ``io.BytesIO.seek``)."""
        return self._file().seek(offset, whence)

    def tell(self) -> int:
        """The read position."""
        pos = self._pos
        return pos.tell() if type(pos) is io.BytesIO else (pos or 0)

    def readable(self) -> bool:
        """``True``."""
        return True

    def seekable(self) -> bool:
        """``True``."""
        return True

    def writable(self) -> bool:
        """``False``: a member's data is read, never written."""
        return False

    def isatty(self) -> bool:
        """``False``."""
        return False

    def fileno(self) -> int:
        """Refused, as for any in-memory file."""
        raise io.UnsupportedOperation("fileno: a StreamBytes is in memory")

    def write(self, data: Any, /) -> int:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only: write to a new io.BytesIO")

    def writelines(self, lines: Any, /) -> None:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only: write to a new io.BytesIO")

    def truncate(self, size: int | None = None, /) -> int:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only")

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to release: the data stays readable (0.9 code closes after reading)."""

    @property
    def closed(self) -> bool:
        """``False``: the value is in memory and stays usable."""
        return False

    @property
    def file_obj(self) -> StreamBytes:
        """The value itself (0.9's ``StreamWrapper.file_obj``)."""
        return self

    def __iter__(self) -> Iterator[bytes]:
        """The remaining lines, as a file iterates."""
        return iter(self._file())

    def __next__(self) -> bytes:
        return next(self._file())

    def __enter__(self) -> StreamBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


# A binary file object to isinstance checks (io.IOBase, io.BufferedIOBase), without being a
# bytes: libraries that take a bytes for a file name see a file.
io.BufferedIOBase.register(StreamBytes)


def raw_bytes(value: Any) -> Any:
    """``value``'s bytes when it is a :class:`StreamBytes` (without a copy), else ``value``."""
    return value.getvalue() if isinstance(value, StreamBytes) else value


def binary_stream(stream: IO[Any]) -> IO[bytes]:
    """The binary file under a text-mode stream, else ``stream`` itself.

    ``open_files_by_fsspec`` opens in text mode by default, as torchdata 0.9 did (``mode="r"``),
    and archives are bytes: a stream opened in text mode and not yet read (as the opener hands
    it over) is read by the archive and decompression stages through its binary ``buffer``, so
    ``open_files_by_fsspec().load_from_tar()`` reads the same bytes with either mode. (0.9
    failed there and needed ``mode="rb"``.)
    """
    inner = getattr(stream, "file_obj", stream)  # a StreamWrapper (open_files_by_fsspec's)
    if isinstance(inner, io.TextIOBase):
        buffer = getattr(inner, "buffer", None)
        if buffer is None:
            raise TypeError(
                f"an archive is read as bytes, but got a text stream ({type(inner).__name__}) "
                "without a binary buffer: open it with mode='rb'"
            )
        try:
            read_from = buffer.tell()
        except (OSError, ValueError, AttributeError):
            read_from = 0  # cannot tell (not seekable): as the opener hands it over
        if read_from != 0:
            # Text was read from it: the text layer holds decoded bytes the buffer no longer
            # has, so reading the buffer would lose them.
            raise ValueError(
                f"an archive is read as bytes, but its text stream ({type(inner).__name__}) was "
                f"already read from (at byte {read_from}): open it with mode='rb'"
            )
        raw = getattr(buffer, "raw", None)
        if type(buffer) is io.BufferedReader and raw is not None:
            try:
                if buffer.tell() == raw.tell():  # nothing buffered: read the file underneath
                    return cast(IO[bytes], raw)
            except (OSError, ValueError):
                pass
        return cast(IO[bytes], buffer)
    return stream
