"""The compressions shards and files come in: gzip, bzip2 and xz, known by magic and by suffix.

The one table every reader and writer uses: the tar reader recognises a compressed shard by
its first bytes, the webdataset front end and torchdata 0.9's ``decompress`` by the file name's
suffix, and webdataset's ``TarWriter`` picks the tar mode by suffix.

Examples:
    >>> import gzip, io
    >>> by_magic(gzip.compress(b"x")[:6]), by_suffix("train-0.tar.gz"), by_suffix("a.tar")
    ('gzip', 'gzip', None)
    >>> decompress_stream("gzip", io.BytesIO(gzip.compress(b"hello"))).read()
    b'hello'
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from typing import IO, Any, NamedTuple

__all__ = [
    "CODECS",
    "MAGIC_LENGTH",
    "Codec",
    "by_magic",
    "by_suffix",
    "decompress_stream",
]


class Codec(NamedTuple):
    """One compression: its name, first bytes, file suffixes and ``tarfile`` mode suffix."""

    name: str
    magic: bytes
    suffixes: tuple[str, ...]
    tar: str  # "gz", "bz2", "xz": as in tarfile's "r|gz" / "w|gz"


CODECS: dict[str, Codec] = {
    "gzip": Codec("gzip", b"\x1f\x8b", (".gz", ".tgz"), "gz"),
    "bzip2": Codec("bzip2", b"BZh", (".bz2",), "bz2"),
    "xz": Codec("xz", b"\xfd7zXZ\x00", (".xz",), "xz"),
}

#: Bytes :func:`by_magic` needs to tell every codec apart.
MAGIC_LENGTH = max(len(c.magic) for c in CODECS.values())

_BY_SUFFIX = {suffix: c.name for c in CODECS.values() for suffix in c.suffixes}


def by_magic(head: bytes) -> str | None:
    """The codec whose magic ``head`` starts with, or ``None`` (not compressed)."""
    return next((c.name for c in CODECS.values() if head.startswith(c.magic)), None)


def by_suffix(name: str) -> str | None:
    """The codec of a file name's last suffix (case-blind: ``.gz``, ``.tgz``, ``.bz2``, ``.xz``)."""
    dot = name.rfind(".")
    return _BY_SUFFIX.get(name[dot:].lower()) if dot >= 0 else None


def decompress_stream(codec: str, fileobj: IO[bytes]) -> IO[bytes]:
    """A binary reader that decompresses ``fileobj`` with ``codec`` as it is read.

    Raises:
        ValueError: An unknown codec, naming the known ones.
    """
    opener: Any
    if codec == "gzip":
        return gzip.GzipFile(fileobj=fileobj, mode="rb")  # type: ignore[return-value]
    if codec == "bzip2":
        opener = bz2.BZ2File
    elif codec == "xz":
        opener = lzma.LZMAFile
    else:
        raise ValueError(f"compression {codec!r} is not known; must be one of {sorted(CODECS)}")
    return opener(fileobj, mode="rb")  # type: ignore[no-any-return]
