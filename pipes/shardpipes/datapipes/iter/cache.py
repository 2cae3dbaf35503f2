"""Keep downloaded shards in a local directory (functional name: ``on_disk_cache``).

Safe for several workers and ranks on one machine sharing the directory:

- one download per shard at a time: an exclusive ``flock`` on ``<entry>.lock``;
- no torn files: data goes to a temporary name in the same directory, then ``os.replace``;
- a size limit: after each download, least recently used entries are evicted (an entry that
  another process holds the lock of, because it is downloading it, is left alone);
- names derived from URLs cannot leave the directory: a hash plus a sanitised basename.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardpipes.datapipes.iter._base import StageIterDataPipe, register
from shardpipes.datapipes.iter.fsspec import open_url

__all__ = ["OnDiskCacheHolderIterDataPipe", "cache_entry_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_COPY_CHUNK = 8 << 20


def cache_entry_name(url: str) -> str:
    """Return the file name for ``url`` in a cache directory: hash prefix + safe basename."""
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    base = _UNSAFE.sub("_", url.rstrip("/").rsplit("/", 1)[-1])[-80:].lstrip(".")
    return f"{digest}-{base}" if base else digest


@register("on_disk_cache")
class OnDiskCacheHolderIterDataPipe(StageIterDataPipe[str]):
    """Download each URL once into ``cache_dir`` and yield the local path (functional name: ``on_disk_cache``).

    Put it between the URLs and ``open_files_by_fsspec``: later epochs (and other workers or
    ranks on the machine) read the local copy. Local files pass through.

    Args:
        source_datapipe: URLs.
        cache_dir: Directory for cached shards; created if missing.
        max_bytes: Size limit of the directory's entries; least recently used entries are
            evicted after a download. Default: no limit.
        storage_options: Passed to fsspec when downloading.

    Yields:
        str: Local path of the cached copy.

    Raises:
        ShardReadError: The download failed (naming the URL); no partial entry is left.
        OSError: The cache directory cannot be written (for example the disk is full).

    Example:
        >>> import tempfile, os
        >>> src = os.path.join(tempfile.mkdtemp(), "a.tar"); _ = open(src, "wb").write(b"x")
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> cache = tempfile.mkdtemp()
        >>> [p.startswith(cache) for p in IterableWrapper(["file://" + src]).on_disk_cache(cache)]
        [True]
    """

    def __init__(
        self,
        source_datapipe: Iterable[str],
        cache_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes should be a positive integer or None, got {max_bytes!r}")
        self.source_datapipe = source_datapipe
        self.cache_dir = os.fspath(cache_dir)
        self.max_bytes = max_bytes
        self.storage_options = dict(storage_options or {})

    def __iter__(self) -> Iterator[str]:
        os.makedirs(self.cache_dir, exist_ok=True)
        for url in self.source_datapipe:
            if "://" not in url:
                yield url  # already local
                continue
            yield self.fetch(url)

    def fetch(self, url: str) -> str:
        """Return the cached path of ``url``, downloading it first if it is not there."""
        path = os.path.join(self.cache_dir, cache_entry_name(url))
        with _locked(path + ".lock"):
            if os.path.exists(path):
                os.utime(path)  # mark as recently used
                return path
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.cache_dir)
            try:
                with os.fdopen(fd, "wb") as out, open_url(url, "rb", self.storage_options) as src:
                    shutil.copyfileobj(src, out, _COPY_CHUNK)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        if self.max_bytes is not None:
            evict(self.cache_dir, self.max_bytes, keep=path)
        return path


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
