"""Resumable, read-ahead streams over remote fsspec filesystems (S3, GCS, HTTP, ...).

:class:`RemoteStream` reads one remote object as a sequence of ``block_size`` byte ranges.
Background threads fetch the next blocks while the consumer parses the current one, so the
pipeline stays busy while the network waits. The threads and the memory budget belong to a
reader (:mod:`shardpipes.storage.readahead`), which may hold several streams: the next shards' blocks are
fetched, in reading order, while the current one is read; memory is bounded per reader. The
threads, and the number of streams that hold a read-ahead queue or a connection, are bounded
per process (:mod:`shardpipes.storage.pool`): a stream that gives its place up to another
reopens at the byte offset it reached when it is read again.

Each block is one range request (``fs.cat_file(path, start, end)``). A transient failure (a
connection reset, a time-out, a 5xx, a short body) is retried with exponential backoff by
requesting the same range again, so the bytes handed to the consumer are exactly the object's
bytes in order: nothing lost, nothing repeated. A permanent failure (no such key or bucket,
401/403, a bad request) is raised at once. Every error names the URL (with any credentials
removed) and the byte offset.

Servers that cannot serve ranges (``Accept-Ranges: none``, no size, or a ``200`` with the whole
body for a range request) are read as one sequential stream instead; a retry there reopens
the stream and skips to the offset reached.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import io
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shardpipes.errors import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    RetriesExhaustedError,
)
from shardpipes.storage.counters import COUNTERS, retry_cause
from shardpipes.storage.pool import process_pool
from shardpipes.storage.readahead import BlockQueue, Readahead, auto_block_size
from shardpipes.storage.retry import (
    Redactor,
    RetryPolicy,
    ShortBody,
    classify_error,
    redact_url,
)
from shardpipes.storage.source import ReadOptions, Source

__all__ = [
    "ForbiddenShardError",
    "MissingShardError",
    "NotAFileError",
    "Redactor",
    "RemoteStream",
    "RetriesExhaustedError",
    "RetryPolicy",
    "classify_error",
    "open_remote",
    "presign_ok",
    "redact_url",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


# --- transports: how one range (or the next piece of a stream) is fetched ----------------------


class _RangesIgnored(Exception):
    """The server answered a range request with the whole object."""


def _is_async(fs: Any) -> bool:
    return bool(getattr(fs, "async_impl", False)) and getattr(fs, "loop", None) is not None


class _RangeTransport:
    """Fetch ``[start, end)`` with one range request, within the time-out."""

    sequential = False

    def __init__(self, fs: Any, path: str, timeout: float | None) -> None:
        self.fs, self.path, self.timeout = fs, path, timeout
        self._signed: _Presigned | None = _Presigned(fs, path) if presign_ok(fs, path) else None

    def fetch(self, start: int, length: int) -> bytes:
        signed = self._signed
        if signed is not None:
            try:
                return self._checked(signed.fetch(start, length, self.timeout), length)
            except _Unsigned as exc:
                logger.debug("%s: reading through the filesystem from now on (%s)", self.path, exc)
                self._signed = None
        end = start + length
        if _is_async(self.fs):
            from fsspec.asyn import sync

            # sync() wraps the coroutine in asyncio.wait_for: a time-out cancels the request.
            data = sync(
                self.fs.loop,
                self.fs._cat_file,
                self.path,
                start=start,
                end=end,
                timeout=self.timeout,
            )
        else:
            data = self.fs.cat_file(self.path, start=start, end=end)
        return self._checked(data, length)

    @staticmethod
    def _checked(data: bytes, length: int) -> bytes:
        if len(data) == length:
            return bytes(data)
        if len(data) > length:
            raise _RangesIgnored(f"asked for {length} bytes, got {len(data)}")
        raise ShortBody(f"response ended after {len(data)} of {length} bytes")

    def close(self) -> None:
        pass


# --- S3 ranges as GETs of a presigned URL ---------------------------------------------------------
#
# s3fs spends 3-5 ms of CPU on each request (botocore signs it, runs its event hooks, builds the
# user agent, parses the answer's headers): at 8 MiB per request, a quarter of the reader's CPU
# (docs/performance.md, "Where the reader's CPU goes on S3"). A GET with a Range header of a URL
# that s3fs presigned (once per object, 0.4-0.8 ms) costs about half. Only where botocore would
# add nothing to the request: no requester-pays or SSE-C headers (``req_kw``,
# ``s3_additional_kwargs``), no object versions, no TLS or proxy settings of the client's own
# (``verify``, ``proxies``, a proxy in the environment). What a presigned GET cannot settle (a
# 4xx, a redirect, an error before any answer) is read through s3fs from then on, which reports
# it as it always has (so a 403 is asked twice, once presigned). Errors never show the signed
# URL. Only SigV4 URLs are used: where botocore would presign with SigV2 (its default for
# presigning in the regions that once took SigV2, unless the client's ``signature_version`` is
# ``s3v4``), which S3 refuses on buckets created after June 24, 2020, ranges go through s3fs.
# ``SHARDPIPES_S3_PRESIGNED=0`` turns it off.

_PRESIGN_EXPIRES = 3600
# Sign again after 5 minutes: botocore refreshes temporary credentials 10 minutes before they
# expire at the latest, so a URL is never used past its credentials.
_RESIGN_AFTER = 300.0
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
_CLIENT_KWARGS_OK = frozenset({"endpoint_url", "region_name"})
# Filesystems whose client presigns with SigV2: asked once, not once per stream (presigning
# costs 0.4-0.8 ms of CPU). Weak: a filesystem dropped from fsspec's cache is forgotten.
_SIGV2: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class _Unsigned(Exception):
    """The presigned GET cannot settle this request: read it through the filesystem."""


class _PresignedStatus(OSError):
    """A transient HTTP status (5xx, 429, 408) of a presigned S3 GET; the URL is not in it."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status} from S3")
        self.status = status


def presign_ok(fs: Any, path: str) -> bool:
    """Whether ranges of ``path`` on ``fs`` may be read as GETs of a presigned URL (see above)."""
    if os.environ.get("SHARDPIPES_S3_PRESIGNED", "1").strip() in ("0", "false", "no", "off"):
        return False
    cls = type(fs)
    if cls.__name__ != "S3FileSystem" or not cls.__module__.startswith("s3fs"):
        return False
    if _SIGV2.get(fs, False):
        return False
    if not _is_async(fs) or getattr(fs, "version_aware", False) or getattr(fs, "req_kw", None):
        return False  # req_kw: requester pays
    if getattr(fs, "s3_additional_kwargs", None):  # SSE-C keys, say: headers of every request
        return False
    if set(getattr(fs, "client_kwargs", None) or {}) - _CLIENT_KWARGS_OK:
        return False
    if (getattr(fs, "config_kwargs", None) or {}).get("proxies"):
        return False
    if any(os.environ.get(k) or os.environ.get(k.upper()) for k in _PROXY_ENV):
        return False
    try:
        return fs.split_path(path)[2] is None  # no version id in the path
    except Exception:
        return False


class _Presigned:
    """GETs of byte ranges of one S3 object through a URL that s3fs presigned."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path
        self._url: str | None = None
        self._signed_at = 0.0
        self._lock = threading.Lock()

    def _current_url(self) -> str:
        from fsspec.asyn import sync

        with self._lock:
            now = time.monotonic()
            if self._url is None or now - self._signed_at > _RESIGN_AFTER:
                url: str = sync(self.fs.loop, self.fs._url, self.path, expires=_PRESIGN_EXPIRES)
                if "X-Amz-Signature=" not in url:
                    # botocore presigns with SigV2 in the regions that once took it, unless the
                    # client asks for s3v4; S3 refuses SigV2 on buckets made after June 2020,
                    # so such a URL would cost each stream a refused GET: use s3fs instead.
                    # The client's configuration decides it: remembered for the filesystem.
                    _SIGV2[self.fs] = True
                    raise _Unsigned("botocore presigns with SigV2 here")
                self._url, self._signed_at = url, now
            return self._url

    def fetch(self, start: int, length: int, timeout: float | None) -> bytes:
        from fsspec.asyn import sync

        try:
            url = self._current_url()
        except _Unsigned:
            raise
        except Exception as exc:
            raise _Unsigned("cannot presign") from exc
        got: tuple[int, bytes] = sync(self.fs.loop, _get_range, url, start, length, timeout=timeout)
        status, data = got
        if status in (200, 206):
            return data
        if status >= 500 or status in (408, 429):
            raise _PresignedStatus(status)
        raise _Unsigned(f"HTTP {status}")


async def _get_range(url: str, start: int, length: int) -> tuple[int, bytes]:
    """``(status, body)`` of a GET of ``url`` with the range ``[start, start + length)``."""
    import yarl

    session = await _session()
    headers = {"Range": f"bytes={start}-{start + length - 1}"}
    try:
        # No redirects: another host would not match the signature (read through s3fs then).
        async with session.get(
            yarl.URL(url, encoded=True), headers=headers, allow_redirects=False
        ) as r:
            if r.status not in (200, 206):
                return r.status, b""
            return r.status, await r.read()
    except (asyncio.TimeoutError, TimeoutError):
        raise TimeoutError("a presigned S3 GET timed out") from None
    except Exception as exc:
        # aiohttp's errors may carry the signed URL: keep the type's name, not the message.
        if isinstance(exc, ConnectionError | EOFError) or "Payload" in type(exc).__name__:
            raise ShortBody(f"connection lost ({type(exc).__name__})") from None
        raise _Unsigned(type(exc).__name__) from None


_SESSIONS: dict[int, tuple[Any, Any]] = {}  # event loop id -> (loop, this process's session)


def _close_sessions() -> None:
    """At exit, close this process's sessions as fsspec closes its own (else aiohttp complains)."""
    from fsspec.implementations.http import HTTPFileSystem

    for loop, session in list(_SESSIONS.values()):
        HTTPFileSystem.close_session(loop, session)


atexit.register(_close_sessions)
if hasattr(os, "register_at_fork"):
    # A forked child has its own loop; its parent's sessions (and sockets) are never its own.
    os.register_at_fork(after_in_child=_SESSIONS.clear)


async def _session() -> Any:
    import aiohttp

    loop = asyncio.get_running_loop()
    got = _SESSIONS.get(id(loop))
    if got is None or got[1].closed:
        got = (loop, aiohttp.ClientSession(auto_decompress=False))
        _SESSIONS[id(loop)] = got
    return got[1]


class _StreamTransport:
    """Read the object front to back through ``fs.open``; reopen and skip ahead after a failure."""

    sequential = True

    def __init__(self, fs: Any, path: str, timeout: float | None, open_kwargs: Mapping[str, Any]):
        self.fs, self.path, self.timeout = fs, path, timeout
        self.open_kwargs = dict(open_kwargs)
        if "http" in _protocols(fs):
            self.open_kwargs.setdefault("block_size", 0)  # fsspec's streaming HTTP file
        self._f: Any = None
        self._pos = 0

    def _read(self, n: int) -> bytes:
        f = self._f
        if type(f).__name__ == "HTTPStreamFile" and self.timeout is not None:
            # Its read is fsspec's sync wrapper, which takes the time-out (and cancels).
            return bytes(f.read(n, timeout=self.timeout))
        return bytes(f.read(n))

    def fetch(self, start: int, length: int) -> bytes:
        if self._f is None or self._pos != start:
            self.close()
            self._f = self.fs.open(self.path, "rb", **self.open_kwargs)
            self._pos = 0
            if start:
                try:
                    self._f.seek(start)
                    self._pos = start
                except (ValueError, OSError, io.UnsupportedOperation):
                    pass  # no ranges: read and drop what was delivered before
                while self._pos < start:
                    skipped = self._read(min(length, start - self._pos))
                    if not skipped:
                        raise ShortBody(f"stream ended at {self._pos} while skipping to {start}")
                    self._pos += len(skipped)
        data = self._read(length)
        self._pos += len(data)
        return data

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception:  # a broken connection may fail to close; it is dropped anyway
                logger.debug("closing %s failed", self.path, exc_info=True)


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = getattr(fs, "protocol", ())
    return (proto,) if isinstance(proto, str) else tuple(proto)


# --- the stream --------------------------------------------------------------------------------


# Stores that always honour ranges: their streams skip the probe (one block alone before the
# parallel requests). A server that ignored ranges anyway would still be caught on any block
# (a longer body than asked), and the stream would switch to streaming.
_RANGES_ALWAYS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "oci", "oss"})


def ranges_known(fs: Any) -> bool:
    """Whether ``fs`` is a store that always honours range requests (S3, GCS, Azure, ...)."""
    return bool(set(_protocols(fs)) & _RANGES_ALWAYS)


class RemoteStream(io.RawIOBase):
    """A read-only, resumable file object over one remote object (made by :func:`open_remote`).

    ``read(n)`` returns fewer than ``n`` bytes only at the end, or just before an error. An
    error is raised at the byte offset where the data stops, and again on every later read.
    ``seek`` works when the server serves ranges (it restarts the read-ahead unless the
    target is in the current block).

    Attributes:
        url: The URL, without credentials.
        size: The object's size in bytes, or ``None`` when the server does not say.
        attempts: Requests made for data so far, retries included.
    """

    def __init__(
        self,
        url: str,
        fs: Any,
        path: str,
        *,
        size: int | None,
        ranges: bool,
        block_size: int | None,
        readahead: int | None,
        retry: RetryPolicy,
        redactor: Redactor | None = None,
        open_kwargs: Mapping[str, Any] | None = None,
        queue: BlockQueue | None = None,
        start: int = 0,
    ) -> None:
        super().__init__()
        self._redactor = redactor or Redactor(url, None)
        self.url = self._redactor.url
        self.size = size
        self.attempts = 0
        self._fs, self._path = fs, path
        self._pool = queue.pool.shared if queue is not None else process_pool()
        self._block_size = block_size if block_size is not None else auto_block_size(size)
        self._readahead = readahead
        self._retry = retry
        self._open_kwargs = dict(open_kwargs or {})
        self._halt = threading.Event()  # set on close; stops readahead=0 fetches
        self._lock = threading.Lock()
        # Held while the stream uses its queue or connection: another stream takes its place
        # (try_release) only while it is not being read.
        self._use = threading.RLock()
        self._released = False
        self._transport: _RangeTransport | _StreamTransport
        if ranges and size is not None:
            self._transport = _RangeTransport(fs, path, retry.timeout)
        else:
            self._transport = _StreamTransport(fs, path, retry.timeout, self._open_kwargs)
        # Until one block shows that the server honours ranges, fetch one block at a time: a
        # server that ignores Range would otherwise send the whole object to every thread.
        self._probed = self._transport.sequential or not size or ranges_known(fs)
        self._buf = b""  # the block being consumed
        self._buf_pos = 0
        self._pos = start  # offset of the next byte read() returns
        self._next_off = 0  # offset of the next block _next_block() returns
        self._failed: BaseException | None = None
        self._q: BlockQueue | None = None
        if readahead != 0:
            self._q = queue if queue is not None else Readahead.for_options(readahead).queue()
        COUNTERS.stream_opened()
        with self._use:  # not released half made
            self._pool.take_place(self)
            self._restart(start)  # a range reader starts where it reads: nothing fetched before

    # -- the process's bound on open streams --

    def try_release(self) -> bool:
        """Give this stream's place up, unless it is being read: close the connection, drop the read-ahead.

        Called by the process pool for another stream; the next read reopens at the offset.
        """
        if not self._use.acquire(blocking=False):
            return False
        try:
            if self.closed or self._released:
                return True
            self._released = True
            if self._q is not None:
                self._q.stop()
            if self._transport.sequential:
                # A fetch thread may still be reading the old connection: a fresh transport
                # reopens at the offset, and the old one is closed under it.
                old, self._transport = (
                    self._transport,
                    _StreamTransport(self._fs, self._path, self._retry.timeout, self._open_kwargs),
                )
                old.close()
            return True
        finally:
            self._use.release()

    def _hold(self) -> None:
        """Take (or refresh) this stream's place; after a release, restart at the offset reached."""
        self._pool.take_place(self)
        if self._released:
            self._released = False
            self._restart(self._next_off)

    # -- fetching --

    def _restart(self, offset: int) -> None:
        self._next_off = offset
        if self._q is None:
            return
        if self._q.plan is not None:  # a seek: a fresh queue in this stream's place
            self._q = self._q.pool.replace(self._q)
        transport = self._transport  # fixed for the queue's life; a switch starts a new queue
        base, bs = offset, self._block_size
        seq_pos = [offset]  # sequential transport: offset of the next block to fetch

        def plan(idx: int) -> tuple[int, int] | None:
            if transport.sequential:
                return seq_pos[0], bs
            start = base + idx * bs
            if self.size is None:
                return start, bs
            return (start, min(bs, self.size - start)) if start < self.size else None

        def fetch(start: int, length: int, halt: threading.Event) -> bytes:
            data = self._fetch_block(transport, start, halt, length)
            if transport.sequential:  # one request at a time: offsets follow the data
                seq_pos[0] += len(data)
            return data

        queue = self._q

        def on_result(idx: int, result: bytes | BaseException) -> None:
            # The probe answered with the length asked: widen now, not when it is read, so
            # that a shard opened ahead gets its parallel requests before its turn.
            if not self._probed and idx == 0 and isinstance(result, bytes) and result:
                self._probed = True
                queue.widen(self._width())

        queue.start(fetch, plan, self._width(), on_result)

    def _width(self) -> int:
        """Requests of this stream that may run at once."""
        if not self._probed or self._transport.sequential or not _is_async(self._fs):
            return 1
        return self._q.pool.width if self._q is not None else 1

    def _fetch_block(
        self,
        transport: _RangeTransport | _StreamTransport,
        start: int,
        halt: threading.Event,
        length: int | None = None,
    ) -> bytes:
        """Fetch the block at ``start``, retrying transient failures; raise a ShardReadError."""
        seq = transport.sequential
        length = length if length is not None and not seq else self._block_size
        if self.size is not None:
            length = min(length, self.size - start)
            if length <= 0:
                return b""
        attempt, began = 0, time.monotonic()
        while True:
            if halt.is_set():
                raise ValueError(f"I/O operation on closed file ({self.url})")
            with self._lock:
                self.attempts += 1
            try:
                data = transport.fetch(start, length)
                if seq and not data and self.size is not None:
                    raise ShortBody(f"stream ended at byte {start} of {self.size}")
                COUNTERS.read(len(data))
                return data
            except _RangesIgnored:
                raise
            except Exception as exc:
                kind = classify_error(exc)
                if kind != "transient" or attempt >= self._retry.retries:
                    spent = time.monotonic() - began
                    self._redactor.raise_(exc, kind, start, attempt + 1, spent)
                wait = self._retry.delay(attempt)
                COUNTERS.retried(retry_cause(exc))
                logger.warning(
                    "%s: %s at byte offset %d (attempt %d of %d); retrying in %.2fs",
                    self.url, self._redactor.describe(exc), start, attempt + 1,
                    self._retry.retries + 1, wait,
                )  # fmt: skip
                if seq:
                    transport.close()  # the next attempt reopens at `start`
                if halt.wait(wait):
                    raise ValueError(f"I/O operation on closed file ({self.url})") from None
                attempt += 1

    def _next_block(self) -> bytes:
        """The next block of the stream, ``b""`` at the end."""
        if self._failed is not None:
            raise self._failed
        with self._use:
            self._hold()
            return self._next_block_held()

    def _next_block_held(self) -> bytes:
        if self._failed is not None:
            raise self._failed
        if self._q is None:  # readahead=0: fetch in the caller's thread
            result: bytes | BaseException
            try:
                result = self._fetch_block(self._transport, self._next_off, self._halt)
            except Exception as exc:  # kept, so that every later read raises it again
                result = exc
        else:
            result = self._q.take()
        if isinstance(result, _RangesIgnored):
            logger.info("%s: the server ignores range requests; streaming it instead", self.url)
            self._transport = _StreamTransport(
                self._fs, self._path, self._retry.timeout, self._open_kwargs
            )
            self._probed = True
            if self._q is not None:
                self._q = self._q.pool.replace(self._q)
            self._restart(self._next_off)
            return self._next_block_held()
        if isinstance(result, BaseException):
            self._failed = result
            raise result
        self._next_off += len(result)
        if not self._probed and result:  # readahead=0 (the queue widens on arrival)
            self._probed = True
        return result

    # -- io.RawIOBase --

    def readable(self) -> bool:
        """Always ``True``."""
        return True

    def seekable(self) -> bool:
        """Whether the transport allows ranges (then ``seek`` works)."""
        return not self._transport.sequential

    def tell(self) -> int:
        """The stream position."""
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        """Read up to ``size`` bytes (all the rest if negative); ``b""`` at the end."""
        if self.closed:
            raise ValueError(f"I/O operation on closed file ({self.url})")
        if size is None or size < 0:
            return self.readall()
        avail = len(self._buf) - self._buf_pos
        if avail >= size:
            if self._buf_pos == 0 and avail == size:
                out, self._buf = self._buf, b""
            else:
                out = self._buf[self._buf_pos : self._buf_pos + size]
                self._buf_pos += size
            self._pos += len(out)
            return out
        # Pieces of blocks as views: the bytes returned are copied once, by the join.
        parts: list[bytes | memoryview] = [memoryview(self._buf)[self._buf_pos :]] if avail else []
        need = size - avail
        self._buf, self._buf_pos = b"", 0
        while need > 0:
            try:
                block = self._next_block()
            except Exception:
                if parts and self._failed is not None:
                    break  # hand over what arrived before the failure; the next read raises
                raise
            if not block:
                break
            if len(block) <= need:
                parts.append(block)
                need -= len(block)
            else:  # keep the rest of the block for the next read
                parts.append(memoryview(block)[:need])
                self._buf, self._buf_pos = block, need
                need = 0
        one = parts[0] if len(parts) == 1 else None
        out = one if isinstance(one, bytes) else b"".join(parts)  # one whole block: no copy
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        """Read to the end."""
        parts = [self.read(len(self._buf) - self._buf_pos)]
        while block := self._next_block():
            parts.append(block)
            self._pos += len(block)
        return b"".join(parts)

    def take_block(self) -> tuple[bytes, int]:
        """The block the stream is in, whole, and the stream's position in it; ``(b"", 0)`` at the end.

        The stream moves to the block's end: a parser reads the rest of the block in place
        (``formats/tarparse.py``), without the copies of ``read``.
        """
        if self.closed:
            raise ValueError(f"I/O operation on closed file ({self.url})")
        block, at = self._buf, self._buf_pos
        if at >= len(block):
            block, at = self._next_block(), 0
        self._buf, self._buf_pos = block, len(block)
        self._pos += len(block) - at
        return block, at

    def readinto(self, b: Any) -> int:
        """Read into a writable buffer; return the number of bytes read."""
        view = memoryview(b).cast("B")
        n, at = len(view), self._buf_pos
        if 0 < n <= len(self._buf) - at and not self.closed:  # within the block: one copy
            view[:] = memoryview(self._buf)[at : at + n]
            self._buf_pos += n
            self._pos += n
            return n
        data = self.read(n)
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` (relative to ``whence``) and return the new position."""
        if self.closed:
            raise ValueError(f"I/O operation on closed file ({self.url})")
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            if self.size is None:
                raise io.UnsupportedOperation(f"{self.url}: size unknown, cannot seek from the end")
            offset += self.size
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        if offset == self._pos:
            return offset
        if self._transport.sequential:
            raise io.UnsupportedOperation(
                f"{self.url}: the server does not serve ranges; cannot seek"
            )
        block_start = self._pos - self._buf_pos
        if block_start <= offset < block_start + len(self._buf):
            self._buf_pos = offset - block_start
        else:
            self._buf, self._buf_pos = b"", 0
            self._failed = None
            with self._use:
                self._pool.take_place(self)
                self._released = False
                self._restart(offset)
        self._pos = offset
        return offset

    def close(self) -> None:
        """Stop the read-ahead threads and drop buffered blocks; idempotent."""
        if not self.closed:
            self._halt.set()
            if self._q is not None:
                self._q.stop()
            self._transport.close()
            self._buf = b""
            self._pool.leave(self)
            COUNTERS.stream_closed()
        super().close()

    def __repr__(self) -> str:
        return f"RemoteStream({self.url!r}, size={self.size}, pos={self._pos})"


def with_retries(
    call: Callable[[], T], redactor: Redactor, retry: RetryPolicy, what: str, offset: int
) -> T:
    """``call()``, repeated with backoff while it fails with transient errors.

    For requests that are all or nothing (a look-up, one ranged fetch): a retry repeats the
    whole request, so nothing is lost or read twice.

    Raises:
        ShardReadError: (a subclass) a permanent error at once, or the last transient one
            when the retries are spent, naming the URL (never credentials) and ``offset``.
    """
    attempt, began = 0, time.monotonic()
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: PERF203  # the loop is the retrying
            kind = classify_error(exc)
            if kind != "transient" or attempt >= retry.retries:
                redactor.raise_(exc, kind, offset, attempt + 1, time.monotonic() - began)
            wait = retry.delay(attempt)
            COUNTERS.retried(retry_cause(exc))
            logger.warning(
                "%s: %s failed at byte offset %d (%s), attempt %d of %d; retrying in %.2fs",
                redactor.url, what, offset, redactor.describe(exc), attempt + 1,
                retry.retries + 1, wait,
            )  # fmt: skip
            time.sleep(wait)
            attempt += 1


def open_remote(
    source: Source,
    *,
    options: ReadOptions,
    open_kwargs: Mapping[str, Any] | None = None,
    queue: BlockQueue | None = None,
    size: int | None = None,
    start: int = 0,
) -> RemoteStream:
    """Look ``source`` up (with retries) and return a :class:`RemoteStream` that reads it.

    Raises:
        MissingShardError: No such object or bucket.
        ForbiddenShardError: 401/403 or bad credentials.
        NotAFileError: The URL names a directory.
        RetriesExhaustedError: The look-up kept failing with transient errors.
        ShardReadError: Any other failure. Messages name the URL, never credentials.
    """
    fs, path, redactor, retry = source.fs, source.path, source.redactor, options.retry
    if size is not None and ranges_known(fs):
        info: dict[str, Any] = {"size": size}  # from a listing or an index: no look-up
    else:
        info = with_retries(lambda: _info(fs, path, retry.timeout), redactor, retry, "look-up", 0)
    if info.get("type") == "directory":
        msg = f"{redactor.url}: is a directory, not a file"
        raise NotAFileError(msg, url=redactor.url, offset=0, err=errno.EISDIR)
    got = info.get("size")
    return RemoteStream(
        source.url,
        fs,
        path,
        size=int(got) if got is not None else None,
        ranges=info.get("partial", True) is not False,
        block_size=options.block_size,
        readahead=options.readahead,
        retry=retry,
        redactor=redactor,
        open_kwargs=open_kwargs,
        queue=queue,
        start=start,
    )


def _info(fs: Any, path: str, timeout: float | None) -> dict[str, Any]:
    if _is_async(fs):
        from fsspec.asyn import sync

        return dict(sync(fs.loop, fs._info, path, timeout=timeout))
    return dict(fs.info(path))
