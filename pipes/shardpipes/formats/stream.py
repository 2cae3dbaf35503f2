"""``StreamBytes``: a member's bytes that also read like the stream torchdata 0.9 gave.

torchdata 0.9's ``load_from_tar`` and ``webdataset()`` yielded file-like streams; shardpipes
yields the bytes. A ``StreamBytes`` is both: a ``bytes`` (equality, hashing, slicing,
``decode()``, the buffer protocol, ``np.frombuffer``, ``pickle``: all as ``bytes``) that also
has ``read(n=-1)``, ``readline()``, ``readlines()``, ``seek``/``tell``, ``close()``,
``file_obj`` and iteration over lines, with a position like a stream: ``read()`` twice gives
the data and then ``b""``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any, cast

__all__ = ["StreamBytes", "binary_stream"]


class StreamBytes(bytes):
    """``bytes`` with a read position: what ``webdataset()`` puts in a sample's fields.

    Examples:
        >>> v = StreamBytes(b"one|two")
        >>> v == b"one|two", v[:3], v.decode().upper()
        (True, b'one', 'ONE|TWO')
        >>> v.read(3), v.read(), v.read()
        (b'one', b'|two', b'')
        >>> v.seek(0)
        0
    """

    # A position only once read: most values are never read as streams, and an instance
    # dict is made lazily, on the first attribute set.

    def _stream(self) -> io.BytesIO:
        state = self.__dict__.get("_io", 0)
        if isinstance(state, int):  # never read, or read whole at once: make the stream now
            stream = io.BytesIO(self)
            stream.seek(state)
            self.__dict__["_io"] = stream
            return stream
        return state  # type: ignore[no-any-return]

    def read(self, n: int | None = -1, /) -> bytes:
        """Read up to ``n`` bytes (all that is left when ``n`` is ``-1`` or ``None``)."""
        if (n is None or n < 0) and "_io" not in self.__dict__:
            self.__dict__["_io"] = len(self)  # the usual case: one read() of everything
            return bytes(self)
        return self._stream().read(n)

    def read1(self, n: int = -1, /) -> bytes:
        """Same as :meth:`read`."""
        return self.read(n)

    def readinto(self, buffer: Any, /) -> int:
        """Read into a writable buffer; return the number of bytes read."""
        return self._stream().readinto(buffer)

    def readline(self, size: int | None = -1, /) -> bytes:
        """Read one line (up to ``size`` bytes)."""
        return self._stream().readline(size)

    def readlines(self, hint: int | None = -1, /) -> list[bytes]:
        """Read the remaining lines."""
        return self._stream().readlines(hint)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Move the read position (as ``io.BytesIO.seek``)."""
        return self._stream().seek(offset, whence)

    def tell(self) -> int:
        """The read position."""
        return self._stream().tell()

    def readable(self) -> bool:
        """``True``."""
        return True

    def seekable(self) -> bool:
        """``True``."""
        return True

    def close(self) -> None:
        """Nothing to release: the data stays usable as ``bytes``."""

    @property
    def closed(self) -> bool:
        """``False``: the value is in memory."""
        return False

    @property
    def file_obj(self) -> StreamBytes:
        """The value itself (0.9's ``StreamWrapper.file_obj``)."""
        return self

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        """The remaining lines, as a stream iterates."""
        return iter(self._stream())

    def __enter__(self) -> StreamBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamBytes, (bytes(self),))


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
