"""Helpers shared by the stage tests: small tar archives made on the spot, good and bad."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Sequence
from typing import IO, Any

from shardpipes.datapipes.iter import IterableWrapper

Members = Sequence[tuple[str, bytes]]

# Three samples of two fields each, the smallest shard where grouping means something.
ABC: list[tuple[str, bytes]] = [
    ("a.cls", b"0"),
    ("a.txt", b"alpha"),
    ("b.cls", b"1"),
    ("b.txt", b"beta" * 200),  # 800 bytes: spans two blocks, so it has padding
    ("c.cls", b"2"),
    ("c.txt", b"gamma"),
]


def tar_bytes(members: Members, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """Return a tar archive holding ``members`` (name, data), written by ``tarfile``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_tar(path: str | os.PathLike[str], members: Members, fmt: int = tarfile.PAX_FORMAT) -> str:
    """Write ``members`` as a tar archive at ``path``; return the path as a str."""
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(tar_bytes(members, fmt))
    return path


def write_bytes(path: str | os.PathLike[str], data: bytes) -> str:
    """Write raw ``data`` (a cut or corrupted archive) at ``path``; return the path as a str."""
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return path


def tarfile_members(data: bytes) -> list[tarfile.TarInfo]:
    """The regular members of ``data`` as Python's ``tarfile`` reads them (the reference)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [m for m in tar.getmembers() if m.isfile()]


def header_offsets(data: bytes) -> list[int]:
    """Byte offsets of the last header block of each regular member (the one with its size)."""
    return [m.offset_data - tarfile.BLOCKSIZE for m in tarfile_members(data)]


def with_bad_checksum(data: bytes, header_offset: int) -> bytes:
    """Return ``data`` with one byte of the member name at ``header_offset`` changed."""
    out = bytearray(data)
    out[header_offset] ^= 0x01  # covered by the checksum, which is left as it was
    return bytes(out)


def tar_pipe(urls: Iterable[str], **tar_kwargs: Any) -> Any:
    """``IterableWrapper(urls).open_files_by_fsspec().load_from_tar(**tar_kwargs)``."""
    return IterableWrapper(list(urls)).open_files_by_fsspec().load_from_tar(**tar_kwargs)


def read_pair(pair: tuple[str, IO[bytes]]) -> tuple[str, bytes]:
    """Map ``(path, stream)`` to ``(path, data)``, closing the stream (module level: it pickles)."""
    path, stream = pair
    with stream:
        return path, stream.read()


def keys(samples: Iterable[dict[str, Any]]) -> list[str]:
    """The ``__key__`` of each sample, in order."""
    return [s["__key__"] for s in samples]


class TrickleReader(io.RawIOBase):
    """A readable stream that returns at most ``step`` bytes per ``read``, as sockets may."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._step, len(self._data) - self._pos)
        b[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = len(self._data) - self._pos
        n = min(size, self._step, len(self._data) - self._pos)
        out = bytes(self._data[self._pos : self._pos + n])
        self._pos += n
        return out


class FailingReader(io.RawIOBase):
    """A stream of ``data`` whose reads fail with a :class:`ShardReadError` after ``limit`` bytes.

    It stands for a network stream whose retries ran out mid-shard (the opener raises that).
    """

    def __init__(self, data: bytes, url: str, limit: int) -> None:
        self._data = data
        self._url = url
        self._limit = limit
        self._pos = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        from shardpipes.errors import ShardReadError

        if self._pos >= self._limit:
            raise ShardReadError(
                f"{self._url}: connection reset at byte offset {self._pos}",
                url=self._url,
                offset=self._pos,
            )
        end = self._limit if size is None or size < 0 else min(self._pos + size, self._limit)
        out = self._data[self._pos : end]
        self._pos = end
        return out
