"""Opening URLs: fsspec filesystems, local files, remote read-ahead streams, shard lists.

The storage layer below the stages: what ``open_files_by_fsspec``, ``on_disk_cache``, the
index and the command line use to reach bytes. Failures become :class:`ShardReadError`
subclasses that name the URL.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import io
import json
import os
from collections.abc import Mapping
from typing import IO, Any, cast

from fsspec import AbstractFileSystem

from shardpipes.errors import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    ShardReadError,
)
from shardpipes.storage.counters import COUNTERS
from shardpipes.storage.pipeurl import open_command
from shardpipes.storage.remote import open_remote
from shardpipes.storage.retry import Redactor
from shardpipes.storage.source import ReadOptions, Source, filesystem, resolve
from shardpipes.storage.urls import url_dir, url_join

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_READAHEAD",
    "check_read_options",
    "filesystem",
    "is_local",
    "open_source",
    "open_text",
    "open_url",
    "read_shard_list",
    "unstrip",
]

# The block size of on_disk_cache downloads. The opener's defaults (block_size=None,
# readahead=None) are automatic: see storage/readahead.py and docs/cloud-storage.md.
DEFAULT_BLOCK_SIZE = 16 << 20
DEFAULT_READAHEAD = 2


# --- forked children must not finalise the parent's filesystems -----------------------------
#
# fsspec clears its instance caches in a forked child (an at-fork hook of its own). A cached
# instance that only the cache held then dies in the child, and HTTPFileSystem's finaliser
# closes the aiohttp session it inherited: closing those sockets unregisters them from the
# epoll instance that parent and child share after fork, so the parent's pooled connection
# never reports readable again and its next request waits for the whole time-out (issue 19).
# Before every fork we hold every cached instance; the parent lets go after the fork, the
# child keeps its copies for good (inert: fsspec gives the child a new event loop and new
# instances). Costs one walk of fsspec's filesystem classes per fork (docs/worker-pool.md).
_held: list[Any] = []
_inert: list[Any] = []  # in a forked child: the parent's instances, never finalised here


def _cached_filesystems() -> list[Any]:
    found: list[Any] = []
    seen: set[type] = set()
    stack: list[type] = [AbstractFileSystem]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        cache = cls.__dict__.get("_cache")
        if cache:
            found.extend(cache.values())
    return found


def _hold_before_fork() -> None:
    _held[:] = _cached_filesystems()


def _release_in_parent() -> None:
    _held.clear()


def _keep_in_child() -> None:
    _inert.extend(_held)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_before_fork,
        after_in_parent=_release_in_parent,
        after_in_child=_keep_in_child,
    )


def unstrip(fs: Any, path: str, like: str) -> str:
    """Give ``path`` (as returned by ``fs.ls``/``fs.glob``) the protocol prefix ``like`` had."""
    if "://" not in like:
        return path
    return str(fs.unstrip_protocol(path))


def check_read_options(block_size: int | None, readahead: int | None) -> None:
    """Check the read-ahead options of an opener (``ValueError`` naming the bad one)."""
    if block_size is not None and (not isinstance(block_size, int) or block_size < 4096):
        raise ValueError(
            f"block_size should be an integer of at least 4096 bytes or None, got {block_size!r}"
        )
    ReadOptions(readahead=readahead)


def is_local(fs: Any, url: str) -> bool:
    """Whether ``url`` is read in-process (local disk, memory, or a chained fsspec URL)."""
    return not Source(url, fs, "", None).streamed


def open_url(
    url: str,
    mode: str = "rb",
    storage_options: Mapping[str, Any] | None = None,
    open_kwargs: Mapping[str, Any] | None = None,
    *,
    options: ReadOptions | None = None,
    queue: Any = None,
    **read_options: Any,
) -> IO[Any]:
    """Open ``url`` for reading; map failures to :class:`ShardReadError` subclasses naming the URL.

    Local files are opened directly. Remote ones get a resumable read-ahead stream; the
    options are those of :class:`FSSpecFileOpenerIterDataPipe`.

    Args:
        url: A local path or any fsspec URL.
        mode: ``"rb"`` (default) or ``"r"``.
        storage_options: Passed to the fsspec filesystem.
        open_kwargs: Passed to ``fs.open`` (local files, servers without ranges).
        options: How to read a remote object (a :class:`ReadOptions`). Default: its defaults.
        queue: The read-ahead queue of an opener that opens shards ahead.
        **read_options: Fields of :class:`ReadOptions` (``block_size``, ``readahead``,
            ``retries``, ``backoff``, ``timeout``) over ``options``.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.bin"); _ = open(p, "wb").write(b"hi")
        >>> with open_url(p) as f:
        ...     f.read()
        b'hi'
    """
    options = dataclasses.replace(options or ReadOptions(), **read_options)
    return open_source(resolve(url, storage_options), mode, options, open_kwargs, queue=queue)


def open_source(
    source: Source,
    mode: str = "rb",
    options: ReadOptions = ReadOptions(),  # noqa: B008  # frozen: one shared default is fine
    open_kwargs: Mapping[str, Any] | None = None,
    *,
    queue: Any = None,
) -> IO[Any]:
    """Open a resolved :class:`Source` for reading, as :func:`open_url` does for a URL."""
    if source.command is not None:  # a pipe: URL whose command the user allowed
        return open_command(source.url, source.command, mode)
    kwargs = dict(open_kwargs or {})
    url = source.url
    if source.streamed:
        stream = open_remote(
            source,
            options=options,
            open_kwargs={k: v for k, v in kwargs.items() if k not in _TEXT_KWARGS},
            queue=queue,
            size=getattr(url, "size", None),
        )
        if mode == "rb":
            return cast(IO[bytes], stream)  # an io.RawIOBase, which typing.IO does not cover
        text = {k: v for k, v in kwargs.items() if k in _TEXT_KWARGS}
        return io.TextIOWrapper(io.BufferedReader(stream, 1 << 20), **text)
    try:
        opened = source.fs.open(source.path, mode, **kwargs)
    except FileNotFoundError as exc:
        raise _read_error(url, "no such file", exc, MissingShardError) from exc
    except PermissionError as exc:
        raise _read_error(url, "permission denied", exc, ForbiddenShardError) from exc
    except IsADirectoryError as exc:
        raise _read_error(url, "is a directory, not a file", exc, NotAFileError) from exc
    COUNTERS.read(_local_size(opened))  # a local shard is read whole (mapped or streamed)
    return opened  # type: ignore[no-any-return]


def _local_size(f: Any) -> int:
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 0  # a memory:// file, a chained URL: no descriptor


def open_text(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    encoding: str = "utf-8",
    compression: str | None = None,
) -> IO[str]:
    """Open a text file (a descriptor, an index) for reading as a stream, gzip-compressed or not.

    Remote files are read sequentially with retries (no read-ahead threads); errors name the
    URL, never credentials.

    Args:
        url: A local path or any fsspec URL.
        storage_options: Passed to the fsspec filesystem.
        encoding: Of the text. Default: ``"utf-8"``.
        compression: ``"gzip"`` to decompress. Default: ``None``.

    Raises:
        MissingShardError: No such file (a ``FileNotFoundError``), and the other
            :class:`ShardReadError` subclasses.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.json"); _ = open(p, "w").write("{}")
        >>> with open_text(p) as f:
        ...     f.read()
        '{}'
    """
    if compression not in (None, "gzip"):
        raise ValueError(f"compression {compression!r} is not supported; must be 'gzip' or None")
    raw = open_source(resolve(url, storage_options), "rb", ReadOptions(readahead=0))
    layers: list[Any] = [raw]
    if isinstance(raw, io.RawIOBase):
        layers.append(io.BufferedReader(raw, 1 << 20))  # a RemoteStream: unbuffered
    if compression == "gzip":
        layers.append(gzip.GzipFile(fileobj=layers[-1], mode="rb"))
    return _TextFile(layers[-1], encoding, layers[:-1])


class _TextFile(io.TextIOWrapper):
    """A text stream that also closes the layers below its buffer (a GzipFile leaves its file)."""

    def __init__(self, buffer: Any, encoding: str, below: list[Any]) -> None:
        super().__init__(buffer, encoding=encoding)
        self._below = below

    def close(self) -> None:
        try:
            super().close()
        finally:
            for layer in reversed(self._below):
                layer.close()


_TEXT_KWARGS = frozenset({"encoding", "errors", "newline"})


def _read_error(url: str, what: str, exc: OSError, cls: type[ShardReadError]) -> ShardReadError:
    return cls(f"{url}: {what}", url=url, offset=0, err=exc.errno or errno.EIO)


def read_shard_list(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Return the shard URLs listed by a dataset descriptor, resolved against its location.

    The descriptor is a JSON file as wids writes it: ``{"shardlist": [{"url": "...",
    "nsamples": N}, ...]}``. A relative ``url`` is relative to the descriptor's own directory
    (or to its ``"base"`` field, itself relative to that directory); a URL with a scheme, or
    an absolute path, is kept as it is (an absolute path on the descriptor's server).

    Args:
        url: Where the descriptor is: a local path or any fsspec URL.
        storage_options: Passed to the fsspec filesystem.

    Returns:
        list[str]: The shard URLs, in the descriptor's order.

    Raises:
        ShardReadError: The descriptor cannot be read.
        ValueError: It is not JSON, or has no ``shardlist`` of objects with a ``url``; the
            message names the descriptor and the entry.

    Examples:
        >>> import json, os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> desc = {"shardlist": [{"url": "train-0.tar", "nsamples": 3},
        ...                       {"url": "s3://other/t-1.tar", "nsamples": 2}]}
        >>> _ = open(os.path.join(d, "dataset.json"), "w").write(json.dumps(desc))
        >>> urls = read_shard_list(os.path.join(d, "dataset.json"))
        >>> urls[0] == os.path.join(d, "train-0.tar"), urls[1]
        (True, 's3://other/t-1.tar')
    """
    with open_url(url, "rb", storage_options, readahead=0) as f:
        raw = f.read()
    safe = Redactor(url, storage_options).url
    try:
        desc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{safe}: not a JSON dataset descriptor ({exc})") from None
    if not isinstance(desc, dict) or not isinstance(desc.get("shardlist"), list):
        extra = (
            " (sub-'datasets' are not supported)"
            if isinstance(desc, dict) and "datasets" in desc
            else ""
        )
        raise ValueError(f"{safe}: a dataset descriptor needs a 'shardlist' list{extra}")
    base = url_dir(url)
    if isinstance(desc.get("base"), str):
        base = url_join(base, desc["base"])
    urls = []
    for i, entry in enumerate(desc["shardlist"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str) or not entry["url"]:
            raise ValueError(
                f"{safe}: shardlist entry {i} is not an object with a 'url' string: {entry!r}"
            )
        urls.append(url_join(base, entry["url"]))
    return urls
