"""webdataset's ``cache``: download shards once into a local folder and open them from there.

``FileCache`` (``{"url": ...}`` -> ``{"url", "stream", "local_path"}``), ``StreamingOpen``,
``LRUCleanup``, ``url_to_cache_name``, ``download`` and the tar check, with webdataset 1.x's
names, arguments and behaviour. Downloads go through :func:`shardpipes.webdataset.gopen.gopen`
(shardpipes' storage layer: retries, parsed ``pipe:`` URLs). ``WebDataset(cache_dir=...)``
itself caches with shardpipes' ``on_disk_cache`` (locked across processes, size-bounded).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from shardpipes.webdataset.gopen import gopen
from shardpipes.webdataset.handlers import reraise_exception

__all__ = [
    "FileCache",
    "LRUCleanup",
    "StreamingOpen",
    "check_tar_format",
    "default_cache_dir",
    "default_cache_size",
    "download",
    "get_filetype",
    "islocal",
    "magic_filetype",
    "pipe_cleaner",
    "url_to_cache_name",
    "verbose_cache",
]

default_cache_dir = os.environ.get("WDS_CACHE", "./_cache")
default_cache_size = float(os.environ.get("WDS_CACHE_SIZE", "1e18"))
verbose_cache = int(os.environ.get("WDS_VERBOSE_CACHE", "0"))

_NAMED_SCHEMES = ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais")


def islocal(url: str) -> bool:
    """Whether ``url`` is a local path (no scheme, or ``file:``)."""
    return urlparse(url).scheme in ("", "file")


def get_filetype(fname: str) -> str:
    """The ``file`` command's description of ``fname`` (run without a shell)."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    try:
        out = subprocess.run(["file", fname], capture_output=True, text=True, check=True)
    except (subprocess.SubprocessError, FileNotFoundError):
        return magic_filetype(fname)
    return out.stdout


def magic_filetype(fname: str) -> str:
    """``"<fname>: gzip compressed data"``, ``"... POSIX tar archive"`` or ``"... data"`` from the first bytes."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if header[:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if len(header) > 261 and header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def check_tar_format(fname: str) -> bool:
    """Whether ``fname`` is a tar archive or gzip data."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    kind = magic_filetype(fname).lower()
    return "tar archive" in kind or "gzip compressed" in kind


def pipe_cleaner(spec: str) -> str:
    """The URL inside a ``pipe:`` command (the first ``http(s)/hdfs/gs/ais/s3`` word), else ``spec``."""
    if spec.startswith("pipe:"):
        for word in spec[len("pipe:") :].split(" "):
            if urlparse(word).scheme in ("http", "https", "hdfs", "gs", "ais", "s3"):
                return word
    return spec


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """The cache file name of ``url``: its last ``ndir + 1`` path parts, or the quoted URL.

    Examples:
        >>> url_to_cache_name("s3://b/path/to/file.tar", ndir=1)
        'to/file.tar'
    """
    if not isinstance(url, str):
        raise AssertionError(f"url_to_cache_name needs a str, got {type(url).__name__}")
    parsed = urlparse(url)
    if parsed.scheme in _NAMED_SCHEMES:
        parts = parsed.path.lstrip("/").split("/")
        return "/".join(parts[-1 - ndir :])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


@dataclass(eq=False)  # compared by identity, as webdataset's
class LRUCleanup:
    """Keep the files under ``cache_dir`` below ``cache_size`` bytes, deleting the oldest first."""

    cache_dir: str | None = None
    cache_size: float = int(1e12)
    keyfn: Callable[[str], float] = os.path.getctime
    verbose: bool = False
    interval: float | None = 30
    last_run: float = field(default=0.0, init=False)

    def set_cache_dir(self, cache_dir: str) -> None:
        """Use ``cache_dir``."""
        self.cache_dir = cache_dir

    def cleanup(self) -> None:
        """Delete the oldest files until the total is at most ``cache_size`` (at most every ``interval`` s)."""
        if self.cache_dir is None or not os.path.exists(self.cache_dir):
            return
        if self.interval is not None and time.time() - self.last_run < self.interval:
            return
        try:
            files = [
                os.path.join(d, name) for d, _, names in os.walk(self.cache_dir) for name in names
            ]
            total = sum(os.path.getsize(f) for f in files)
            files.sort(key=self.keyfn, reverse=True)  # newest first: pop() takes the oldest
            while files and total > self.cache_size:
                victim = files.pop()
                total -= os.path.getsize(victim)
                if self.verbose:
                    print(f"# deleting {victim}", file=sys.stderr)  # noqa: T201 (webdataset's verbose)
                os.remove(victim)
        except OSError:
            pass  # another process deleted a file between the listing and now
        self.last_run = time.time()


def download(url: str, dest: str, chunk_size: int = 1024**2, verbose: bool = False) -> None:
    """Copy ``url`` to ``dest`` through a temporary file renamed at the end."""
    temp = f"{dest}.temp{os.getpid()}"
    with gopen(url) as stream, open(temp, "wb") as f:
        while chunk := stream.read(chunk_size):
            f.write(chunk)
    os.rename(temp, dest)


class StreamingOpen:
    """Open each URL: ``{"url", "stream"}``, plus ``local_path`` for a local file."""

    def __init__(
        self, verbose: bool = False, handler: Callable[[BaseException], bool] = reraise_exception
    ) -> None:
        self.verbose = verbose
        self.handler = handler

    def __call__(self, urls: Iterable[Any]) -> Iterator[dict[str, Any]]:
        """Open ``urls`` (strings or ``{"url": ...}``) one by one."""
        for item in urls:
            url = item["url"] if isinstance(item, dict) else item
            parsed = urlparse(url)
            try:
                if parsed.scheme in ("", "file"):
                    yield {"url": url, "stream": open(parsed.path, "rb"), "local_path": parsed.path}  # noqa: SIM115
                else:
                    yield {"url": url, "stream": gopen(url)}
            except Exception as exn:
                if self.handler(exn):
                    continue
                break


class FileCache:
    """Download each URL once into ``cache_dir`` and open it from there."""

    def __init__(
        self,
        cache_dir: str | None = None,
        *,
        url_to_name: Callable[[str], str] = url_to_cache_name,
        verbose: bool = False,
        validator: Callable[[str], bool] | None = check_tar_format,
        handler: Callable[[BaseException], bool] = reraise_exception,
        cache_size: int = -1,
        cache_cleanup_interval: int = 30,
    ) -> None:
        self.url_to_name = url_to_name
        self.validator = validator
        self.handler = handler
        self.cache_dir = default_cache_dir if cache_dir is None else cache_dir
        self.verbose = verbose
        self.cleaner = (
            LRUCleanup(self.cache_dir, cache_size, verbose=verbose, interval=cache_cleanup_interval)
            if cache_size > 0
            else None
        )

    def get_file(self, url: str) -> str:
        """The local path of ``url``, downloading it first if it is not cached.

        Raises:
            ValueError: The download is not a tar archive (it is deleted).
        """
        if not isinstance(url, str):
            raise AssertionError(f"get_file needs a str, got {type(url).__name__}")
        if islocal(url):
            return urlparse(url).path
        name = self.url_to_name(url)
        if "/" in name:
            raise AssertionError(f"bad cache name {name} for {url}")
        dest = os.path.join(self.cache_dir, name)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        if not os.path.exists(dest):
            if self.verbose:
                print(f"# downloading {url} to {dest}", file=sys.stderr)  # noqa: T201
            if self.cleaner is not None:
                self.cleaner.cleanup()
            download(url, dest, verbose=self.verbose)
            if self.validator is not None and not self.validator(dest):
                kind = get_filetype(dest)
                with open(dest, "rb") as f:
                    head = f.read(200)
                os.remove(dest)
                raise ValueError(
                    f"{dest} ({url}) is not a tar archive, but a {kind}, contains {head!r}"
                )
        return dest

    def __call__(self, urls: Iterable[Any]) -> Iterator[dict[str, Any]]:
        """``{"url", "stream", "local_path"}`` for each URL (strings or ``{"url": ...}``)."""
        for item in urls:
            url = item["url"] if isinstance(item, dict) else item
            try:
                path = self.get_file(url)
                yield {"url": url, "stream": open(path, "rb"), "local_path": path}  # noqa: SIM115
            except Exception as exn:
                if self.handler(exn):
                    continue
                break
