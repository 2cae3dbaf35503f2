"""``StreamBytes``: a member's data as a real in-memory file that also answers like ``bytes``.

torchdata 0.9's ``load_from_tar`` and ``webdataset()`` yielded file objects, and 0.9 code hands
them to whatever reads files: ``PIL.Image.open(v)``, ``torch.load(v)``, ``tarfile.open(fileobj=v)``,
``np.load(v)``, ``json.load(v)``, ``pickle.load(v)``, ``io.TextIOWrapper(v)``. A ``StreamBytes`` is
an :class:`io.BytesIO` (so every one of those takes it as the file it is) that is *not* a
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
from typing import IO, Any, cast

__all__ = ["StreamBytes", "binary_stream", "raw_bytes"]

# The bytes methods a StreamBytes answers (on its data, as a bytes would). ``count`` and
# ``index`` are on the list too: BytesIO has neither, so nothing else can answer them.
_BYTES_METHODS = frozenset(
    name for name in dir(bytes) if not name.startswith("_") and name not in ("fromhex", "maketrans")
)


class StreamBytes(io.BytesIO):
    """A member's data: an in-memory file (``io.BytesIO``) that also answers like ``bytes``.

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

    mode = "rb"

    def __bytes__(self) -> bytes:
        return self.getvalue()  # shares the buffer: no copy

    def __len__(self) -> int:
        return len(self.getvalue())

    def __getitem__(self, index: Any) -> Any:
        return self.getvalue()[index]

    def __contains__(self, item: object) -> bool:
        return item in self.getvalue()  # type: ignore[operator]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StreamBytes):
            return self.getvalue() == other.getvalue()
        if isinstance(other, bytes | bytearray | memoryview):
            return self.getvalue() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.getvalue())

    def __add__(self, other: Any) -> bytes:
        return self.getvalue() + bytes(other)

    def __radd__(self, other: Any) -> bytes:
        return bytes(other) + self.getvalue()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.getvalue()!r})"

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the file does not have: the bytes methods, on the data.
        if name in _BYTES_METHODS:
            return getattr(self.getvalue(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    if sys.version_info >= (3, 12):

        def __buffer__(self, flags: int, /) -> memoryview:
            return memoryview(self.getvalue())

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The data decoded as text (as ``bytes.decode``)."""
        return self.getvalue().decode(encoding, errors)

    def close(self) -> None:
        """Nothing to release: the data stays readable (0.9 code closes after reading)."""

    @property
    def closed(self) -> bool:
        """``False``: the value is in memory and stays usable."""
        return False

    def writable(self) -> bool:
        """``False``: a member's data is read, never written."""
        return False

    def write(self, data: Any, /) -> int:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only: write to a new io.BytesIO")

    def writelines(self, lines: Any, /) -> None:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only: write to a new io.BytesIO")

    def truncate(self, size: int | None = None, /) -> int:
        """Refused: a member's data is read-only."""
        raise io.UnsupportedOperation("a StreamBytes is read-only")

    @property
    def file_obj(self) -> StreamBytes:
        """The value itself (0.9's ``StreamWrapper.file_obj``)."""
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamBytes, (self.getvalue(),))


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
