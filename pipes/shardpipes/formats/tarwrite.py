"""Writing tar members: the one tar writer under ``shardpipes.writer`` and webdataset's ``TarWriter``.

Examples:
    >>> import io
    >>> from shardpipes.formats.tarparse import iter_tar
    >>> buf = io.BytesIO()
    >>> w = TarMemberWriter(buf)
    >>> w.add("a.cls", b"3")
    1
    >>> w.close()
    >>> _ = buf.seek(0)
    >>> [(e.name, bytes(e.data)) for e in iter_tar(buf, "mem")]
    [('a.cls', b'3')]
"""

from __future__ import annotations

import io
import tarfile
from typing import IO

from shardpipes.formats.compression import CODECS

__all__ = ["TarMemberWriter"]


class TarMemberWriter:
    """Append regular files to a tar stream written to ``fileobj`` (which it does not close).

    Args:
        fileobj: A writable binary stream.
        compression: ``"gzip"``, ``"bzip2"``, ``"xz"`` (see
            :mod:`shardpipes.formats.compression`) or ``None``. Default: ``None``.
        format: A ``tarfile`` format. Default: ``tarfile.PAX_FORMAT``.
    """

    def __init__(
        self,
        fileobj: IO[bytes],
        *,
        compression: str | None = None,
        format: int = tarfile.PAX_FORMAT,
    ) -> None:
        if compression is not None and compression not in CODECS:
            raise ValueError(
                f"compression {compression!r} is not known; must be one of {sorted(CODECS)}"
            )
        mode = "w|" + (CODECS[compression].tar if compression is not None else "")
        # Open across add() calls, closed in close(): no with-block can span them.
        self._tar = tarfile.open(fileobj=fileobj, mode=mode, format=format)  # type: ignore[call-overload]  # noqa: SIM115

    def add(
        self,
        name: str,
        data: bytes | bytearray | memoryview,
        *,
        mode: int = 0o444,
        mtime: float = 0,
        uname: str = "",
        gname: str = "",
    ) -> int:
        """Append the member ``name`` holding ``data``; return its size in bytes."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = mtime  # as given: PAX_FORMAT writes any float mtime as a pax header
        info.uname = uname
        info.gname = gname
        self._tar.addfile(info, io.BytesIO(data))
        return info.size

    def close(self) -> None:
        """Write the end-of-archive blocks (and flush a compressor); idempotent."""
        self._tar.close()
