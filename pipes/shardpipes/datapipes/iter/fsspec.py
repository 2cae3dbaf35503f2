"""List, open and save files through fsspec: local paths, ``file://``, ``s3://``, ``gs://``, HTTP."""

from __future__ import annotations

import errno
import fnmatch
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

from fsspec.core import url_to_fs
from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._base import StageIterDataPipe, register
from shardpipes.errors import ShardReadError

__all__ = [
    "FSSpecFileListerIterDataPipe",
    "FSSpecFileOpenerIterDataPipe",
    "FSSpecSaverIterDataPipe",
    "filesystem",
]

_GLOB_CHARS = frozenset("*?[")


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for ``url``, with a clear error for a missing backend."""
    try:
        return url_to_fs(url, **dict(storage_options or {}))
    except ImportError as exc:
        proto = url.split("://", 1)[0] if "://" in url else "file"
        extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
        hint = f"pip install 'shardpipes[{extra[proto]}]'" if proto in extra else str(exc)
        raise ImportError(f"reading {url!r} needs the {proto!r} filesystem: {hint}") from exc


def _unstrip(fs: Any, path: str, like: str) -> str:
    """Give ``path`` (as returned by ``fs.ls``/``fs.glob``) the protocol prefix ``like`` had."""
    if "://" not in like:
        return path
    return str(fs.unstrip_protocol(path))


@register("list_files_by_fsspec")
class FSSpecFileListerIterDataPipe(StageIterDataPipe[str]):
    """List the files under URLs, directories or glob patterns (functional name: ``list_files_by_fsspec``).

    Each input (or ``root`` itself) may be a file, a directory or a glob pattern. Output URLs are
    sorted within each input, so every rank and worker sees the same list in the same order.

    Args:
        root: A URL, a list of URLs, or a DataPipe of URLs.
        masks: Glob patterns that a file's basename must match (any of them). Default: all files.
        recursive: List directories recursively. Default: ``False``.
        storage_options: Passed to the fsspec filesystem (endpoint, credentials, ...).

    Yields:
        str: File URLs, with the same protocol prefix as the input.

    Raises:
        FileNotFoundError: An input names nothing: no such file or directory, or a glob that
            matches no file. The message names the input.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for n in ("b.tar", "a.tar", "c.txt"): _ = (d / n).write_bytes(b"")
        >>> from shardpipes.datapipes.iter import FSSpecFileLister
        >>> [p.rsplit("/", 1)[1] for p in FSSpecFileLister(str(d), masks="*.tar")]
        ['a.tar', 'b.tar']
    """

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe[str],
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(root, str):
            root = [root]
        self.datapipe: Iterable[str] = root
        self.masks = [masks] if isinstance(masks, str) else list(masks)
        self.recursive = recursive
        self.storage_options = dict(storage_options or {})

    def _matches(self, path: str) -> bool:
        masks = [m for m in self.masks if m]
        if not masks:
            return True
        name = posixpath.basename(path.rstrip("/"))
        return any(fnmatch.fnmatchcase(name, m) for m in masks)

    def __iter__(self) -> Iterator[str]:
        for url in self.datapipe:
            yield from self._list_one(url)

    def _list_one(self, url: str) -> list[str]:
        if not url:
            raise ValueError("list_files_by_fsspec got an empty URL")
        fs, path = filesystem(url, self.storage_options)
        if _GLOB_CHARS & set(path):
            found = [p for p in fs.glob(path) if not fs.isdir(p)]
            if not found:
                raise FileNotFoundError(f"{url}: the glob pattern matches no file")
        elif fs.isdir(path):
            if self.recursive:
                found = list(fs.find(path))
            else:
                found = [e["name"] for e in fs.ls(path, detail=True) if e["type"] != "directory"]
        elif fs.exists(path):
            found = [path]
        else:
            raise FileNotFoundError(f"{url}: no such file or directory")
        return sorted(_unstrip(fs, p, url) for p in found if self._matches(p))


@register("open_files_by_fsspec")
class FSSpecFileOpenerIterDataPipe(StageIterDataPipe[tuple[str, IO[Any]]]):
    """Open each URL through fsspec and yield ``(url, stream)`` (functional name: ``open_files_by_fsspec``).

    Streams are opened lazily, one at a time, and read sequentially by the next stage, which
    closes them; nothing is downloaded whole.

    Args:
        source_datapipe: URLs to open.
        mode: ``"rb"`` (default) or ``"r"``.
        storage_options: Passed to the fsspec filesystem (endpoint, credentials, ...).
        open_kwargs: Passed to ``fs.open`` (for example ``block_size``).

    Yields:
        tuple[str, IO]: The URL and an open file object.

    Raises:
        ShardReadError: The URL cannot be opened (a ``FileNotFoundError``/``PermissionError``
            subclass of ``OSError``); the message names the URL.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
        >>> _ = p.write_bytes(b"abc")
        >>> from shardpipes.datapipes.iter import FSSpecFileOpener, IterableWrapper
        >>> [(u == str(p), s.read()) for u, s in FSSpecFileOpener(IterableWrapper([str(p)]))]
        [(True, b'abc')]
    """

    def __init__(
        self,
        source_datapipe: Iterable[str],
        mode: str = "rb",
        *,
        storage_options: Mapping[str, Any] | None = None,
        open_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in ("rb", "r"):
            raise ValueError(f"mode {mode!r} is not supported; must be one of 'rb', 'r'")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.storage_options = dict(storage_options or {})
        self.open_kwargs = dict(open_kwargs or {})

    def __iter__(self) -> Iterator[tuple[str, IO[Any]]]:
        for url in self.source_datapipe:
            yield url, open_url(url, self.mode, self.storage_options, self.open_kwargs)


def open_url(
    url: str,
    mode: str = "rb",
    storage_options: Mapping[str, Any] | None = None,
    open_kwargs: Mapping[str, Any] | None = None,
) -> IO[Any]:
    """Open ``url`` with fsspec; map failures to errors that name the URL."""
    fs, path = filesystem(url, storage_options)
    try:
        return fs.open(path, mode, **dict(open_kwargs or {}))  # type: ignore[no-any-return]
    except FileNotFoundError as exc:
        raise _read_error(url, "no such file", exc, FileNotFoundError) from exc
    except PermissionError as exc:
        raise _read_error(url, "permission denied", exc, PermissionError) from exc
    except IsADirectoryError as exc:
        raise _read_error(url, "is a directory, not a file", exc, IsADirectoryError) from exc


def _read_error(url: str, what: str, exc: OSError, kind: type[OSError]) -> ShardReadError:
    # Module-level subclasses (not made on the fly) so the error pickles across processes.
    cls = _CONCRETE.get(kind, ShardReadError)
    return cls(f"{url}: {what}", url=url, err=exc.errno or errno.EIO)


class MissingShardError(ShardReadError, FileNotFoundError):
    """The URL names no file (or no bucket)."""


class ForbiddenShardError(ShardReadError, PermissionError):
    """Access to the URL is denied."""


class NotAFileError(ShardReadError, IsADirectoryError):
    """The URL names a directory."""


_CONCRETE: dict[type[OSError], type[ShardReadError]] = {
    FileNotFoundError: MissingShardError,
    PermissionError: ForbiddenShardError,
    IsADirectoryError: NotAFileError,
}


@register("save_by_fsspec")
class FSSpecSaverIterDataPipe(StageIterDataPipe[str]):
    """Write ``(url, data)`` pairs to their URLs and yield each URL (functional name: ``save_by_fsspec``).

    Args:
        source_datapipe: Pairs of destination URL and ``bytes`` (or ``str`` with ``mode="w"``).
        mode: ``"wb"`` (default) or ``"w"``.
        filepath_fn: Maps the incoming URL to the destination URL. Default: unchanged.
        storage_options: Passed to the fsspec filesystem.

    Yields:
        str: The URL written.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> out = list(IterableWrapper([(os.path.join(d, "a.bin"), b"xy")]).save_by_fsspec())
        >>> open(out[0], "rb").read()
        b'xy'
    """

    def __init__(
        self,
        source_datapipe: Iterable[tuple[str, bytes | str]],
        mode: str = "wb",
        filepath_fn: Any = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in ("wb", "w"):
            raise ValueError(f"mode {mode!r} is not supported; must be one of 'wb', 'w'")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.storage_options = dict(storage_options or {})

    def __iter__(self) -> Iterator[str]:
        for url, data in self.source_datapipe:
            dest = self.filepath_fn(url) if self.filepath_fn is not None else url
            fs, path = filesystem(dest, self.storage_options)
            parent = posixpath.dirname(path)
            if parent:
                fs.makedirs(parent, exist_ok=True)
            with fs.open(path, self.mode) as f:
                f.write(data)
            yield dest
