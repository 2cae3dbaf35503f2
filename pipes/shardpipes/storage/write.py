"""Writing files: one way out for shards, index files and sample files.

:func:`write_atomic` opens a URL for writing. A file on this machine's disk is written under a
temporary name beside it (``<name>.partial``) and renamed into place when it is closed: a
reader listing the folder never sees half a file, and a process that is reading (and has
memory-mapped) an older file of the same name keeps reading the old one instead of failing
with ``SIGBUS`` as it would if the file were rewritten in place. An object store makes an
upload visible only when it is complete, so remote files are written directly.

Examples:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "sub", "a.txt")
    >>> with write_atomic(p, mode="wt") as f:
    ...     _ = f.write("hello")
    ...     os.path.exists(p)
    False
    >>> open(p).read()
    'hello'
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
from collections.abc import Mapping
from typing import IO, Any

from shardpipes.storage.source import Source, resolve

__all__ = ["AtomicFile", "write_atomic", "write_bytes"]


class AtomicFile:
    """A file being written by :func:`write_atomic`; :meth:`close` puts it in place.

    Leaving a ``with`` block by an exception discards a local file's partial copy instead.

    Attributes:
        url: The destination.
        file: The open file object (binary, or text for a text mode).
    """

    def __init__(
        self, source: Source, *, text: bool, encoding: str, compression: str | None
    ) -> None:
        self.url = source.url
        fs, path = source.fs, source.path
        folder = posixpath.dirname(path) if not source.local else os.path.dirname(path)
        if folder:
            fs.makedirs(folder, exist_ok=True)
        self._rename: tuple[str, str] | None = None
        if source.local:
            self._rename = (f"{path}.partial", path)
            path = self._rename[0]
        # Each layer is closed in turn: a GzipFile does not close the file it writes to.
        self._layers: list[Any] = [fs.open(path, "wb")]
        if compression == "gzip":
            self._layers.append(gzip.GzipFile(fileobj=self._layers[-1], mode="wb"))
        if text:
            self._layers.append(io.TextIOWrapper(self._layers[-1], encoding=encoding))
        self.file: IO[Any] = self._layers[-1]

    def _close_layers(self) -> None:
        layers, self._layers = self._layers, []
        for layer in reversed(layers):
            if not layer.closed:
                layer.close()

    def write(self, data: Any) -> int:
        """Write ``data`` (bytes, or ``str`` in a text mode)."""
        return self.file.write(data)

    def close(self) -> None:
        """Finish the file and put it in place (a rename for a local file); idempotent."""
        if not self._layers:
            return
        self._close_layers()
        if self._rename is not None:
            os.replace(*self._rename)  # atomic within a folder: a new file, not a rewrite
            self._rename = None

    def discard(self) -> None:
        """Close without putting the file in place (a local partial copy is removed)."""
        try:
            self._close_layers()
        finally:
            self._remove_partial()

    def _remove_partial(self) -> None:
        if self._rename is not None:
            try:
                os.remove(self._rename[0])
            except FileNotFoundError:
                pass
            self._rename = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def write_atomic(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    mode: str = "wb",
    encoding: str | None = None,
    compression: str | None = None,
) -> AtomicFile:
    """Open ``url`` for writing; the file appears whole when closed (local: by a rename).

    Folders are made as needed.

    Args:
        url: Destination: a local path or any fsspec URL.
        storage_options: Passed to the fsspec filesystem.
        mode: ``"wb"`` (default) or ``"wt"``.
        encoding: Of a text mode. Default: UTF-8.
        compression: ``"gzip"`` to compress while writing. Default: ``None``.
    """
    if mode not in ("wb", "wt", "w"):
        raise ValueError(f"mode {mode!r} is not a write mode; must be one of 'wb', 'wt', 'w'")
    if compression not in (None, "gzip"):
        raise ValueError(f"compression {compression!r} is not supported; must be 'gzip' or None")
    return AtomicFile(
        resolve(url, storage_options),
        text=mode != "wb",
        encoding=encoding or "utf-8",
        compression=compression,
    )


def write_bytes(url: str, data: bytes, storage_options: Mapping[str, Any] | None = None) -> None:
    """Write ``data`` to ``url`` whole, atomically when local."""
    with write_atomic(url, storage_options) as f:
        f.write(data)
