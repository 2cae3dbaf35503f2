"""webdataset's ``gopen``: open a URL for reading or writing, dispatched by scheme.

As in webdataset, ``gopen(url, mode)`` looks the URL's scheme up in ``gopen_schemes`` at each
call (code replaces entries, e.g. ``gopen_schemes["s3"] = my_opener``); a path without a scheme
(or ``file:``) is a local file and ``"-"`` standard input/output. Unlike webdataset, every other
URL (``s3://``, ``gs://``, ``http(s)://``, ...) is read by shardpipes' storage layer, with its
retries and read-ahead, instead of by a ``curl``/``gsutil`` subprocess, and ``pipe:`` URLs are
parsed (``pipe:aws s3 cp URL -``, ``pipe:gsutil cat URL``, ``pipe:curl ... URL``,
``pipe:cat PATH``; for writing ``pipe:cat > PATH``, ``pipe:aws s3 cp - URL``,
``pipe:gsutil cp - URL``): other shell text runs only with ``SHARDPIPES_PIPE_COMMANDS=1``
(see :mod:`shardpipes.storage.pipeurl`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from shardpipes.storage.open import filesystem, open_url
from shardpipes.storage.pipeurl import open_command, resolve_pipe_url

__all__ = [
    "gopen",
    "gopen_error",
    "gopen_file",
    "gopen_pipe",
    "gopen_schemes",
    "gopen_storage",
    "info",
    "reader",
    "rewrite_url",
]

#: Extra information about the last opened stream (webdataset keeps this module-level dict).
info: dict[str, Any] = {}


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[Any]:
    """Open a local file (a path, or a ``file:`` URL)."""
    parsed = urlparse(url)
    path = url2pathname(parsed.path) if parsed.scheme == "file" else url
    return open(path, mode, buffering=int(os.environ.get("GOPEN_BUFFER", -1)))


def _write_target(command: str) -> str | None:
    """The file or URL a write ``pipe:`` command copies its input to, if it is a common one."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) == 3 and argv[0] == "cat" and argv[1] == ">":
        return argv[2]
    if len(argv) == 2 and argv[0] == "cat" and argv[1].startswith(">") and len(argv[1]) > 1:
        return argv[1][1:]
    if argv[:3] == ["aws", "s3", "cp"] and len(argv) == 5 and argv[3] == "-":
        return argv[4]
    if argv[:2] == ["gsutil", "cp"] and len(argv) == 4 and argv[2] == "-":
        return argv[3]
    return None


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[Any]:
    """Open a ``pipe:`` URL: the common commands through storage, others only when allowed."""
    if mode[0] == "r":
        return open_url(url, "rb")
    command = url[len("pipe:") :].strip()
    target = _write_target(command)
    if target is not None:
        return gopen_storage(target, "wb") if "://" in target else gopen_file(target, "wb")
    source = resolve_pipe_url(url)  # raises unless the user allowed commands
    return open_command(url, source.command or command, "wb")


def gopen_storage(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[Any]:
    """Open a remote URL through shardpipes' storage layer (fsspec, retries, read-ahead)."""
    if mode[0] == "r":
        return open_url(url, "rb")
    fs, path = filesystem(url, None)
    return fs.open(path, "wb")  # type: ignore[no-any-return]


def gopen_error(url: str, *args: Any, **kw: Any) -> IO[Any]:
    """The handler for a scheme nothing can open."""
    raise ValueError(f"{url}: no gopen handler defined")


#: Scheme -> opener, looked up at each ``gopen`` call; ``__default__`` for other schemes.
gopen_schemes: dict[str, Callable[..., IO[Any]]] = {
    "__default__": gopen_storage,
    "pipe": gopen_pipe,
    "http": gopen_storage,
    "https": gopen_storage,
    "gs": gopen_storage,
    "s3": gopen_storage,
}


def rewrite_url(url: str) -> str:
    """Apply the first matching ``GOPEN_REWRITE="prefix=replacement;..."`` rule to ``url``."""
    rules = os.environ.get("GOPEN_REWRITE")
    if not rules:
        return url
    for rule in rules.split(";"):
        old, new = rule.split("=", 1)
        rewritten = re.sub("^" + old, new, url)
        if rewritten != url:
            return rewritten
    return url


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[Any]:
    """Open ``url`` in ``mode`` ``"rb"`` or ``"wb"`` (``"-"``: standard input/output).

    Raises:
        ValueError: Another mode, or a scheme without a handler.
    """
    if mode not in ("rb", "wb"):
        raise ValueError(f"gopen: mode {mode!r} is not supported; use 'rb' or 'wb'")
    if url == "-":
        return sys.stdin.buffer if mode == "rb" else sys.stdout.buffer
    url = rewrite_url(url)
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        return gopen_file(url, mode, bufsize)
    handler = gopen_schemes.get(scheme, gopen_schemes["__default__"])
    return handler(url, mode, bufsize, **kw)


def reader(url: str, **kw: Any) -> IO[Any]:
    """``gopen(url, "rb", ...)``."""
    return gopen(url, "rb", **kw)
