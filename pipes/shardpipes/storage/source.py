"""A URL resolved once: its filesystem, path, storage options and redactor; and the read options.

Every reader in :mod:`shardpipes.storage` takes a :class:`Source` (made by :func:`resolve`,
once per URL) and a :class:`ReadOptions` (made once per stage), instead of resolving the
filesystem again and passing the read options loose. :attr:`Source.local` is the one answer
to "is it on this machine's disk?", :attr:`Source.streamed` to "is it read through a remote
read-ahead stream?".

Examples:
    >>> s = resolve("/tmp/a.tar")
    >>> s.local, s.streamed, s.path
    (True, False, '/tmp/a.tar')
    >>> ReadOptions(retries=2).retry.retries
    2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from shardpipes.storage.pipeurl import resolve_pipe_url
from shardpipes.storage.retry import Redactor, RetryPolicy

__all__ = ["ReadOptions", "Source", "filesystem", "resolve"]

# The extra to install for a URL scheme whose fsspec filesystem is missing.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for ``url``, with a clear error for a missing backend."""
    try:
        fs, path = url_to_fs(url, **dict(storage_options or {}))
    except ImportError as exc:
        proto = url.split("://", 1)[0] if "://" in url else "file"
        extra = _EXTRAS.get(proto)
        hint = f"pip install 'shardpipes[{extra}]'" if extra else str(exc)
        raise ImportError(f"reading {url!r} needs the {proto!r} filesystem: {hint}") from exc
    return fs, str(path)


@dataclass(frozen=True)
class ReadOptions:
    """How a remote object is read: request size, read-ahead and retries.

    Attributes:
        block_size: Bytes per range request, or ``None``: a quarter of each object, within
            1-8 MiB.
        readahead: Blocks in flight or ready ahead of the reader, across shard boundaries;
            ``0`` fetches in the reading thread; ``None``: automatic (within the
            process's read-ahead budget, ``SHARDPIPES_READAHEAD_BYTES``).
        retries: Retries of a failing request after the first attempt.
        backoff: Seconds before the first retry, doubled for each next one.
        timeout: Seconds one request may take, or ``None``.

    Raises:
        ValueError: A value out of range, naming it.
    """

    block_size: int | None = None
    readahead: int | None = None
    retries: int = 5
    backoff: float = 0.5
    timeout: float | None = 60.0

    def __post_init__(self) -> None:
        # The opener stages also want block_size >= 4096 (check_read_options); a byte range
        # read on its own may use smaller requests.
        bs, ra = self.block_size, self.readahead
        if bs is not None and (not isinstance(bs, int) or bs <= 0):
            raise ValueError(f"block_size should be a positive integer or None, got {bs!r}")
        if ra is not None and (not isinstance(ra, int) or not 0 <= ra <= 64):
            raise ValueError(f"readahead should be an integer in [0, 64], got {ra!r}")
        self.retry  # noqa: B018  # validates retries, backoff and timeout

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of these options."""
        return RetryPolicy(retries=self.retries, backoff=self.backoff, timeout=self.timeout)


@dataclass(eq=False, repr=False)  # identity, and a repr without the URL's secrets
class Source:
    """A URL resolved once: what every storage reader and writer needs to reach its bytes.

    Attributes:
        url: The URL as given (with any credentials; never put it in a message: use
            ``redactor.url``).
        fs: The fsspec filesystem.
        path: The path within ``fs``.
        storage_options: The options ``fs`` was made with.
        local: On this machine's disk (``LocalFileSystem``): seekable, mappable, renameable.
        streamed: Read through a remote read-ahead stream (not local, not in memory, not a
            chained ``a::b`` URL, which fsspec reads in-process).
        command: The shell command of a ``pipe:`` URL the user allowed to run, else ``None``
            (the common ``pipe:`` forms resolve to the URL they read).
    """

    url: str
    fs: Any
    path: str
    storage_options: Mapping[str, Any] | None
    command: str | None = None
    local: bool = field(init=False)
    streamed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.local = isinstance(self.fs, LocalFileSystem)
        self.streamed = self.command is None and not (
            self.local or isinstance(self.fs, MemoryFileSystem) or "::" in self.url
        )

    @cached_property
    def redactor(self) -> Redactor:
        """Formats messages about this URL without its secrets (made on first use)."""
        return Redactor(self.url, self.storage_options)

    def __repr__(self) -> str:
        return f"Source({self.redactor.url!r})"


def resolve(url: str, storage_options: Mapping[str, Any] | None = None) -> Source:
    """Resolve ``url`` once: its filesystem and path (``ImportError`` naming a missing extra).

    A ``pipe:`` URL (webdataset's) resolves to the URL its command reads (``aws s3 cp URL -``,
    ``gsutil cat URL``, ``curl ... URL``, ``cat PATH``, see :mod:`shardpipes.storage.pipeurl`),
    or, when the user allowed commands, to the command itself.
    """
    if isinstance(url, str) and url.startswith("pipe:"):
        piped = resolve_pipe_url(url)
        if piped.command is not None:
            return Source(url, None, "", storage_options, command=piped.command)
        url = str(piped.url)
        storage_options = {**piped.storage_options, **(storage_options or {})}
    fs, path = filesystem(url, storage_options)
    return Source(url, fs, path, storage_options)
