"""Write samples into WebDataset-style tar shards.

A sample is a dict ``{"__key__": "000123", ".jpg": bytes, ".cls": 3, ...}``. Values that are
not bytes are encoded by extension: ``str`` as UTF-8, ``int`` as decimal text, ``dict``/``list``
as JSON for ``.json``, numpy arrays as ``.npy``. Members are written in key order of the dict,
all members of a sample adjacent, as the format requires.
"""

from __future__ import annotations

import io
import json
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from shardpipes.formats.stream import raw_bytes
from shardpipes.formats.tarwrite import TarMemberWriter
from shardpipes.storage.write import AtomicFile, write_atomic

__all__ = ["ClosesOnExit", "ShardSeries", "ShardWriter", "encode_value"]


def encode_value(ext: str, value: Any) -> bytes:
    """Encode one field for ``ext`` (``".cls"`` or ``"cls"``, ``".json"``, ...) as bytes."""
    value = raw_bytes(value)  # a member read by webdataset() (a file): its bytes, no copy
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        raise TypeError(f"field {ext!r}: bool is ambiguous; encode it yourself")
    if isinstance(value, numbers.Integral):  # also numpy integers, as labels often are
        return str(int(value)).encode("ascii")
    # write() accepts "json" as well as ".json" for a field name; so does the choice here.
    dotted = ext if ext.startswith(".") else f".{ext}"
    if dotted.endswith((".json", ".jsn")):
        return json.dumps(value).encode("utf-8")
    if dotted.endswith(".npy"):
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.asarray(value), allow_pickle=False)
        return buf.getvalue()
    raise TypeError(f"field {ext!r}: cannot encode {type(value).__name__}; pass bytes")


_W = TypeVar("_W", bound="ClosesOnExit")


class ClosesOnExit:
    """``with writer:`` calls ``writer.close()`` at the end: the context protocol of the writers."""

    def close(self) -> None:
        """Finish writing."""
        raise NotImplementedError

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardSeries:
    """Numbered shards ``pattern % n``, opened one after the other: the core of both shard writers.

    Each shard is opened with :func:`~shardpipes.storage.write.write_atomic` (a local shard is
    written as ``<name>.partial`` and renamed into place when finished), or with ``opener``.

    Args:
        pattern: Shard URL with a ``%d``-style placeholder.
        start: Number of the first shard. Default: ``0``.
        storage_options: Passed to fsspec for remote destinations.
        opener: ``opener(url)`` returns the binary stream to write a shard to (not closed
            here). Default: :func:`~shardpipes.storage.write.write_atomic`.

    Attributes:
        urls: The shards opened so far.
    """

    def __init__(
        self,
        pattern: str,
        *,
        start: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        opener: Callable[[str], Any] | None = None,
    ) -> None:
        self.pattern = pattern
        self.start = start
        self.storage_options = dict(storage_options or {})
        self.opener = opener
        self.urls: list[str] = []
        self._file: AtomicFile | None = None

    def next(self) -> Any:
        """Finish the current shard, open the next and return its binary stream."""
        self.finish()
        url = self.pattern % (self.start + len(self.urls))
        if self.opener is not None:
            stream = self.opener(url)
        else:
            self._file = write_atomic(url, self.storage_options)
            stream = self._file.file
        self.urls.append(url)
        return stream

    def finish(self) -> None:
        """Put the current shard in place (call after its tar stream is closed)."""
        file, self._file = self._file, None
        if file is not None:
            file.close()


class ShardWriter(ClosesOnExit):
    """Write samples to numbered shards, starting a new shard at ``maxcount`` samples or ``maxsize`` bytes.

    A local shard is written under a temporary name beside it (``<name>.partial``) and renamed
    into place when it is complete: a reader listing the folder never sees half a shard, and a
    job that is reading (and has memory-mapped) an older shard of the same name keeps reading
    the old file instead of failing with ``SIGBUS`` as it would if the file were rewritten in
    place.

    Args:
        pattern: Shard URL with a ``%d``-style placeholder, e.g. ``"out/train-%06d.tar"``.
        maxcount: Samples per shard at most. Default: ``10000``.
        maxsize: Bytes of member data per shard at most (a shard holds at least one sample).
            Default: ``1 GB``.
        start: Number of the first shard. Default: ``0``.
        storage_options: Passed to fsspec for remote destinations.

    Attributes:
        urls: The shards written so far.
        counts: Samples in each shard, in the same order.

    Examples:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> with ShardWriter(os.path.join(d, "s-%03d.tar"), maxcount=2) as w:
        ...     for i in range(5):
        ...         w.write({"__key__": f"{i:03d}", ".cls": i})
        >>> [os.path.basename(u) for u in w.urls], w.counts
        (['s-000.tar', 's-001.tar', 's-002.tar'], [2, 2, 1])
    """

    def __init__(
        self,
        pattern: str,
        *,
        maxcount: int = 10_000,
        maxsize: int = 1_000_000_000,
        start: int = 0,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if "%" not in pattern:
            raise ValueError(f"pattern {pattern!r} needs a %d placeholder for the shard number")
        if maxcount <= 0 or maxsize <= 0:
            raise ValueError(f"maxcount ({maxcount}) and maxsize ({maxsize}) should be positive")
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.start = start
        self.storage_options = dict(storage_options or {})
        self._series = ShardSeries(pattern, start=start, storage_options=self.storage_options)
        self.urls = self._series.urls
        self.counts: list[int] = []
        self._tar: TarMemberWriter | None = None
        self._size = 0

    def _next_shard(self) -> None:
        self._close_shard()
        self._tar = TarMemberWriter(self._series.next())
        self.counts.append(0)
        self._size = 0

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (a dict with ``__key__`` and one entry per extension)."""
        key = sample.get("__key__")
        if not isinstance(key, str) or not key:
            raise ValueError(f"sample needs a non-empty str __key__, got {key!r}")
        if "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"key {key!r} has a dot in its basename; readers would split it there")
        fields = [
            (ext, encode_value(ext, v)) for ext, v in sample.items() if not ext.startswith("__")
        ]
        if not fields:
            raise ValueError(f"sample {key!r} has no fields")
        size = sum(len(data) for _, data in fields)
        if (
            self._tar is None
            or self.counts[-1] >= self.maxcount
            or (self.counts[-1] and self._size + size > self.maxsize)
        ):
            self._next_shard()
        tar = self._tar
        if tar is None:  # _next_shard always opens one; this narrows the type
            raise RuntimeError("no open shard")
        for ext, data in fields:
            tar.add(key + (ext if ext.startswith(".") else "." + ext), data)
        self.counts[-1] += 1
        self._size += size

    def write_all(self, samples: Iterable[Mapping[str, Any]]) -> None:
        """Write every sample of ``samples``."""
        for sample in samples:
            self.write(sample)

    def _close_shard(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
            self._series.finish()

    def close(self) -> None:
        """Finish the current shard."""
        self._close_shard()
