"""Keep downloaded shards in a local directory (functional name: ``on_disk_cache``).

Safe for several workers and ranks on one machine sharing the directory:

- one download per shard: an exclusive ``flock`` on ``<entry>.dl.lock`` while it downloads;
- no torn files: data goes to a temporary name in the same directory, then ``os.replace``;
- a size limit: after each download, least recently used entries are evicted;
- an entry is never evicted while a reader holds it: the stage holds a shared ``flock`` on the
  entry from the moment it yields the path until it is asked for the next one, which is when
  the next stage (``open_files_by_fsspec``) has opened it; eviction only takes entries whose
  lock it can get exclusively without waiting;
- names derived from URLs cannot leave the directory: a hash plus a sanitised basename.

Downloads use the same resumable, retrying stream as ``open_files_by_fsspec``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.storage.open import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_READAHEAD,
    check_read_options,
    open_source,
)
from shardpipes.storage.ranges import ShardRange
from shardpipes.storage.retry import Redactor
from shardpipes.storage.source import ReadOptions, resolve

__all__ = ["OnDiskCacheHolderIterDataPipe", "cache_entry_name", "evict"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cache_entry_name(url: str) -> str:
    """Return the file name for ``url`` in a cache directory: hash prefix + safe basename."""
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    base = _UNSAFE.sub("_", url.rstrip("/").rsplit("/", 1)[-1])[-80:].lstrip(".")
    return f"{digest}-{base}" if base else digest


@register("on_disk_cache")
class OnDiskCacheHolderIterDataPipe(StageIterDataPipe[str]):
    """Download each URL once into ``cache_dir`` and yield the local path (functional name: ``on_disk_cache``).

    Put it right before ``open_files_by_fsspec``: later epochs (and other workers or ranks on
    the machine) read the local copy. Several processes may share ``cache_dir``: each shard is
    downloaded once, readers never see a partial file, and an entry is not evicted while the
    next stage opens it. Local files pass through.

    Args:
        source_datapipe: URLs.
        cache_dir: Directory for cached shards; created if missing.
        max_bytes: Size limit of the directory's entries; least recently used entries are
            evicted after a download. Default: no limit.
        storage_options: Passed to fsspec when downloading.
        block_size: Bytes per range request when downloading. Default: ``16 MiB``.
        retries: Retries of a failing request. Default: ``5``.
        backoff: Seconds before the first retry, doubled each time. Default: ``0.5``.
        timeout: Seconds one request may take, or ``None``. Default: ``60``.

    After ``sharding_by_index`` the whole shard is cached and each ``ShardRange`` is yielded
    with the local path in place of the URL, so the next stage still reads only its range.

    Yields:
        str: Local path of the cached copy (a ``ShardRange`` for a ``ShardRange``).

    Raises:
        ShardReadError: The download failed (naming the URL and byte offset); no partial
            entry is left.
        OSError: The cache directory cannot be written (for example the disk is full); the
            message names the directory.

    Examples:
        >>> import tempfile, os
        >>> src = os.path.join(tempfile.mkdtemp(), "a.tar"); _ = open(src, "wb").write(b"x")
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> cache = tempfile.mkdtemp()
        >>> [p.startswith(cache) for p in IterableWrapper(["file://" + src]).on_disk_cache(cache)]
        [True]
    """

    rewrites_urls = True  # yields local paths in place of the URLs an index names

    def __init__(
        self,
        source_datapipe: Iterable[str],
        cache_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float | None = 60.0,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes should be a positive integer or None, got {max_bytes!r}")
        check_read_options(block_size, DEFAULT_READAHEAD)
        self.source_datapipe = source_datapipe
        self.cache_dir = os.fspath(cache_dir)
        self.max_bytes = max_bytes
        self.storage_options = dict(storage_options or {})
        self.options = ReadOptions(block_size, None, retries, backoff, timeout)  # validates
        self.block_size = block_size

    def __iter__(self) -> Iterator[str]:
        os.makedirs(self.cache_dir, exist_ok=True)
        for url in self.source_datapipe:
            if "://" not in url:
                yield url  # a plain path: already local (a file:// URL is copied)
                continue
            path, fd = self._acquire(str(url))  # the whole shard, whatever part is read
            try:
                # A ShardRange (from sharding_by_index) stays one: the next stage reads only
                # its samples from the local copy.
                yield url.relocated(path) if isinstance(url, ShardRange) else path
                # the shared lock keeps eviction away until the next request
            finally:
                os.close(fd)

    def fetch(self, url: str) -> str:
        """Return the cached path of ``url``, downloading it first if it is not there."""
        os.makedirs(self.cache_dir, exist_ok=True)
        path, fd = self._acquire(url)
        os.close(fd)
        return path

    def _acquire(self, url: str) -> tuple[str, int]:
        """Make sure ``url`` is cached; return its path and a lock fd holding it shared.

        Two locks per entry: ``<entry>.lock``, held shared by readers and taken exclusively
        (without waiting) by eviction, and ``<entry>.dl.lock``, held by the one process that
        downloads. A process that finds the entry missing keeps its shared lock while it
        waits for the download lock, so neither waits behind a reader, and the new entry
        cannot be evicted between its rename into place and its first reader.
        """
        path = os.path.join(self.cache_dir, cache_entry_name(url))
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.path.exists(path):  # and it stays: eviction needs the lock exclusively
                os.utime(path)  # mark as recently used
                return path, fd
            with _locked(path + ".dl.lock"):
                downloaded = not os.path.exists(path)  # else another process just did it
                if downloaded:
                    self._download(url, path)
            if downloaded and self.max_bytes is not None:
                evict(self.cache_dir, self.max_bytes, keep=path)
            return path, fd
        except BaseException:
            os.close(fd)
            raise

    def _download(self, url: str, path: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.cache_dir)
        try:
            # Read in this thread, without the process's read-ahead pool: this download runs
            # inside an opener that may be opening shards ahead through the same pool, and a
            # read-ahead stream here could wait on fetches queued behind that opener's look-up
            # (seen as a hang of test_guarantees over S3 with on_disk_cache).
            options = dataclasses.replace(self.options, readahead=0)
            with contextlib.closing(
                open_source(resolve(url, self.storage_options), "rb", options)
            ) as src:
                while block := src.read(self.block_size):
                    self._write_all(fd, block, url)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _write_all(self, fd: int, data: bytes, url: str) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            what = os.strerror(exc.errno) if exc.errno else str(exc)
            full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
            hint = "; free space or lower max_bytes" if full else ""
            raise OSError(
                exc.errno,
                f"on_disk_cache: cannot write to the cache directory {self.cache_dir} while "
                f"downloading {Redactor(url, None).url}: {what}{hint}",
            ) from exc


@contextlib.contextmanager
def _locked(lock_path: str, *, blocking: bool = True) -> Iterator[bool]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def evict(cache_dir: str, max_bytes: int, *, keep: str | None = None) -> list[str]:
    """Delete least recently used entries until the directory's entries fit in ``max_bytes``.

    Entries whose lock another process holds are skipped. Returns the deleted paths.
    """
    entries = []
    for name in os.listdir(cache_dir):
        if name.endswith(".lock") or name.startswith(".tmp-"):
            continue
        full = os.path.join(cache_dir, name)
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(full)
            entries.append((st.st_mtime, st.st_size, full))
    total = sum(size for _, size, _ in entries)
    deleted = []
    for _, size, full in sorted(entries):
        if total <= max_bytes:
            break
        if full == keep:
            continue
        with _locked(full + ".lock", blocking=False) as got:
            if not got:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
                total -= size
                deleted.append(full)
    return deleted
