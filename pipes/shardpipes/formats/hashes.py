"""Checking data against an expected digest: the one hash check of ``check_hash`` and ``on_disk_cache``.

Examples:
    >>> import hashlib, io
    >>> want = hashlib.md5(b"abc").hexdigest()
    >>> digest_of(b"abc", "md5") == want, digest_of(io.BytesIO(b"abc"), "md5") == want
    (True, True)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

__all__ = ["HASH_TYPES", "check_hash_type", "digest_of", "file_digest"]

#: The digests torchdata 0.9's ``hash_type`` names.
HASH_TYPES = ("sha256", "md5")

_CHUNK = 1 << 20


def check_hash_type(hash_type: str) -> None:
    """Raise ``ValueError`` naming the known hash types unless ``hash_type`` is one."""
    if hash_type not in HASH_TYPES:
        raise ValueError(f"Invalid hash_type requested, should be one of {list(HASH_TYPES)}")


def digest_of(data: str | bytes | bytearray | Iterable[bytes] | Any, hash_type: str) -> str:
    """The hex digest of ``data``: ``str`` (as UTF-8), bytes, or a stream read to its end.

    A stream is read in chunks with ``read(n)`` when it has one, else iterated (as 0.9 did).
    """
    check_hash_type(hash_type)
    digest = hashlib.new(hash_type)
    if isinstance(data, str):
        digest.update(data.encode())
    elif isinstance(data, (bytes, bytearray, memoryview)):
        digest.update(data)
    elif hasattr(data, "read"):
        for chunk in iter(lambda: data.read(_CHUNK), b""):
            if not chunk:
                break
            digest.update(chunk if isinstance(chunk, bytes) else chunk.encode())
    else:
        for chunk in data:
            digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: str, hash_type: str) -> str:
    """The hex digest of the local file ``path``."""
    with open(path, "rb") as f:
        return digest_of(f, hash_type)
