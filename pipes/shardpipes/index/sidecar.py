"""Per-shard sample files of a version-2 index: each sample's byte span, and its key.

A version-2 descriptor (``train.index.json``) lists per shard only what planning needs (URL,
sample count, size). The per-sample spans live in one small binary file per shard, in the
folder the descriptor names (``train.index.samples/``), file ``{position:09d}.spx``:

======  ==========================================================================
bytes   content
======  ==========================================================================
8       ``b"SPXS"`` and the file version, uint32 little-endian (``1``)
4       length ``h`` of the JSON header, uint32
h       header: ``{"url", "num_samples", "total_bytes", "size_dtype", "keys_bytes"}``
pad     zero bytes up to a multiple of 8
8 n     offsets, int64
4 n/8 n sizes, uint32 (``"<u4"``) or int64 (``"<i8"``) when a sample exceeds 4 GiB
4 n     key lengths in bytes, uint32
k       the keys, UTF-8, end to end
======  ==========================================================================

A reader reads the header and the spans (12 bytes a sample) and never the keys, which are
there for diagnostics (``ShardInfo.keys``).
"""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardpipes.errors import ShardpipesError
from shardpipes.storage.open import open_url

__all__ = [
    "MAGIC",
    "SidecarError",
    "encode",
    "read_header",
    "read_keys",
    "read_spans",
    "sidecar_dir",
    "sidecar_path",
]

MAGIC = b"SPXS" + struct.pack("<I", 1)
_U4_MAX = (1 << 32) - 1


class SidecarError(ShardpipesError, ValueError):
    """A per-shard sample file is missing, corrupt or does not match its descriptor entry."""


def sidecar_dir(index_url: str) -> str:
    """The folder name of the sample files of the descriptor ``index_url``, relative to it.

    Examples:
        >>> sidecar_dir("/d/train.index.json"), sidecar_dir("s3://b/x/idx.json.gz")
        ('train.index.samples', 'idx.samples')
    """
    name = posixpath.basename(index_url.rstrip("/"))
    for ext in (".json.gz", ".json", ".gz"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return f"{name}.samples"


def sidecar_path(index_url: str, position: int, folder: str | None = None) -> str:
    """The sample file of shard number ``position`` of the descriptor ``index_url``."""
    base = index_url.rstrip("/").rsplit("/", 1)[0] if "/" in index_url else "."
    return f"{base}/{folder or sidecar_dir(index_url)}/{position:09d}.spx"


def encode(
    url: str,
    total_bytes: int,
    keys: Sequence[str],
    offsets: Sequence[int] | np.ndarray,
    sizes: Sequence[int] | np.ndarray,
) -> bytes:
    """The bytes of the sample file of one shard."""
    offs = np.asarray(offsets, dtype="<i8")
    sz = np.asarray(sizes, dtype=np.int64)
    size_dtype = "<u4" if not sz.size or int(sz.max()) <= _U4_MAX else "<i8"
    encoded = [k.encode("utf-8") for k in keys]
    key_blob = b"".join(encoded)
    header = json.dumps(
        {
            "url": url,
            "num_samples": len(offs),
            "total_bytes": total_bytes,
            "size_dtype": size_dtype,
            "keys_bytes": len(key_blob),
        },
        separators=(",", ":"),
    ).encode("utf-8")
    head = MAGIC + struct.pack("<I", len(header)) + header
    head += b"\0" * (-len(head) % 8)
    lengths = np.fromiter((len(e) for e in encoded), dtype="<u4", count=len(encoded))
    return b"".join(
        [head, offs.tobytes(), sz.astype(size_dtype).tobytes(), lengths.tobytes(), key_blob]
    )


def _open(url: str, storage_options: Mapping[str, Any] | None) -> Any:
    try:
        return open_url(url, "rb", storage_options, readahead=0)
    except FileNotFoundError as exc:
        raise SidecarError(
            f"{url}: no such sample file (copy the index's .samples folder with it, or "
            "rebuild it with `shardpipes index`)"
        ) from exc


def _header(f: Any, url: str) -> tuple[dict[str, Any], int]:
    first = f.read(12)
    if len(first) < 12 or first[:8] != MAGIC:
        raise SidecarError(f"{url}: not a shardpipes sample file (magic {first[:8]!r})")
    (length,) = struct.unpack("<I", first[8:12])
    raw = f.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SidecarError(f"{url}: bad sample file header ({exc})") from exc
    f.read(-(12 + length) % 8)
    return header, 12 + length + (-(12 + length) % 8)


def _array(f: Any, dtype: str, n: int, url: str, what: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    data = f.read(width * n)
    if len(data) != width * n:
        raise SidecarError(f"{url}: the file ends inside {what} ({len(data)} of {width * n} bytes)")
    return np.frombuffer(data, dtype=dtype)


def read_header(
    url: str, *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The header of the sample file ``url``, or ``None`` if there is none or it is not one."""
    try:
        with open_url(url, "rb", storage_options, readahead=0) as f:
            return _header(f, url)[0]
    except (FileNotFoundError, SidecarError):
        return None


def read_spans(
    url: str,
    num_samples: int,
    total_bytes: int,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, sizes)`` (int64) from the sample file ``url``, checked against its entry.

    Raises:
        SidecarError: A missing or corrupt file, or one whose sample count or shard size is
            not the descriptor's (a stale file), naming ``url``.
    """
    with _open(url, storage_options) as f:
        header, _ = _header(f, url)
        for name, want in (("num_samples", num_samples), ("total_bytes", total_bytes)):
            if header.get(name) != want:
                raise SidecarError(
                    f"{url}: {name} is {header.get(name)!r} but the index says {want} "
                    "(a sample file of another shard, or a stale one)"
                )
        offsets = _array(f, "<i8", num_samples, url, "the offsets")
        sizes = _array(f, header.get("size_dtype", "<i8"), num_samples, url, "the sizes")
    return offsets.astype(np.int64, copy=False), sizes.astype(np.int64)


def read_keys(url: str, *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The sample keys stored in the sample file ``url`` (for diagnostics)."""
    with _open(url, storage_options) as f:
        header, _ = _header(f, url)
        n = int(header["num_samples"])
        f.read(8 * n + np.dtype(header.get("size_dtype", "<i8")).itemsize * n)
        lengths = _array(f, "<u4", n, url, "the key lengths")
        blob = f.read(int(header["keys_bytes"]))
    out, at = [], 0
    for length in lengths.tolist():
        out.append(blob[at : at + length].decode("utf-8"))
        at += length
    return out
