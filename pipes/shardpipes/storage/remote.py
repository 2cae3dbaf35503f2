"""Resumable, read-ahead streams over remote fsspec filesystems (S3, GCS, HTTP, ...).

:class:`RemoteStream` reads one remote object as a sequence of ``block_size`` byte ranges.
Background threads fetch the next ``readahead`` blocks while the consumer parses the current
one, so the pipeline stays busy while the network waits; memory is bounded by
``(readahead + 1) * block_size`` per open stream, whatever the object's size.

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

import errno
import io
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shardpipes.storage.retry import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    Redactor,
    RetriesExhaustedError,
    RetryPolicy,
    ShortBody,
    classify_error,
    redact_url,
)

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

    def fetch(self, start: int, length: int) -> bytes:
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
        if len(data) == length:
            return bytes(data)
        if len(data) > length:
            raise _RangesIgnored(f"asked for {length} bytes, got {len(data)}")
        raise ShortBody(f"response ended after {len(data)} of {length} bytes")

    def close(self) -> None:
        pass


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


class _Prefetcher:
    """Threads fetching blocks ``0, 1, 2, ...`` (from ``base``) ahead of the consumer, in order.

    Invariant: at most ``depth`` blocks beyond the one the consumer holds are fetched or in
    flight, so memory is bounded by ``(depth + 1) * block_size`` whatever the object's size.
    After a failure or the end, no block past it is claimed.
    """

    def __init__(
        self,
        stream: RemoteStream,
        transport: _RangeTransport | _StreamTransport,
        base: int,
        threads: int,
        depth: int,
    ) -> None:
        # The transport is fixed for the prefetcher's life: when the stream switches to another
        # one, it starts a new prefetcher, and threads of the old one never touch the new one.
        self.stream = stream
        self.transport = transport
        self.base = base
        self.depth = depth
        self.halt = threading.Event()  # set by stop(): no new requests, no more waiting
        self.cond = threading.Condition()
        self.next_claim = 0  # index of the next block a thread may start
        self.consumed = 0  # index of the next block the consumer takes
        self.end: int | None = None  # first index past the end (or past a failure)
        self.results: dict[int, bytes | BaseException] = {}
        self.seq_pos = base  # sequential transport: offset of the next block
        self.threads: list[threading.Thread] = []
        self.widen(threads, depth)

    def widen(self, threads: int, depth: int) -> None:
        """Let up to ``threads`` requests run at once, ``depth`` blocks ahead."""
        with self.cond:
            self.depth = depth
            self.cond.notify_all()
        for _ in range(threads - len(self.threads)):
            t = threading.Thread(target=self._run, name="shardpipes-readahead", daemon=True)
            self.threads.append(t)
            t.start()

    def _start_of(self, idx: int) -> int | None:
        """Offset of block ``idx``, or ``None`` past the end (sequential: not known ahead)."""
        if self.transport.sequential:
            return self.seq_pos
        start = self.base + idx * self.stream._block_size
        size = self.stream.size
        return start if size is None or start < size else None

    def _past_end(self, idx: int) -> bool:
        return (self.end is not None and idx >= self.end) or self._start_of(idx) is None

    def _claim(self) -> int | None:
        with self.cond:
            while not self.halt.is_set():
                idx = self.next_claim
                if self._past_end(idx):
                    return None
                if idx < self.consumed + self.depth:
                    self.next_claim += 1
                    return idx
                self.cond.wait()
            return None

    def _run(self) -> None:
        while (idx := self._claim()) is not None:
            result: bytes | BaseException
            try:
                start = self._start_of(idx)
                if start is None:
                    return
                result = self.stream._fetch_block(self.transport, start, self.halt)
                if self.transport.sequential:  # one thread: offsets follow the data
                    self.seq_pos += len(result)
            except BaseException as exc:  # handed to the consumer, raised at its position
                result = exc
            with self.cond:
                if self.halt.is_set():
                    return
                self.results[idx] = result
                if isinstance(result, BaseException) or not result:
                    self.end = idx + 1 if self.end is None else min(self.end, idx + 1)
                self.cond.notify_all()

    def take(self) -> bytes | BaseException:
        """The next block in order; ``b""`` past the end."""
        with self.cond:
            idx = self.consumed
            while idx not in self.results:
                if self.halt.is_set() or self._past_end(idx):
                    return b""
                self.cond.wait()
            self.consumed += 1
            self.cond.notify_all()
            return self.results.pop(idx)

    def stop(self) -> None:
        """Stop claiming, drop fetched blocks; requests in flight finish and are discarded."""
        self.halt.set()
        with self.cond:
            self.results.clear()
            self.cond.notify_all()


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
        block_size: int,
        readahead: int,
        retry: RetryPolicy,
        redactor: Redactor | None = None,
        open_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._redactor = redactor or Redactor(url, None)
        self.url = self._redactor.url
        self.size = size
        self.attempts = 0
        self._fs, self._path = fs, path
        self._block_size = block_size
        self._readahead = readahead
        self._retry = retry
        self._open_kwargs = dict(open_kwargs or {})
        self._halt = threading.Event()  # set on close; stops readahead=0 fetches
        self._lock = threading.Lock()
        self._transport: _RangeTransport | _StreamTransport
        if ranges and size is not None:
            self._transport = _RangeTransport(fs, path, retry.timeout)
        else:
            self._transport = _StreamTransport(fs, path, retry.timeout, self._open_kwargs)
        # Until one block shows that the server honours ranges, fetch one block at a time: a
        # server that ignores Range would otherwise send the whole object to every thread.
        self._probed = self._transport.sequential or not size
        self._buf = b""  # the block being consumed
        self._buf_pos = 0
        self._pos = 0  # offset of the next byte read() returns
        self._next_off = 0  # offset of the next block _next_block() returns
        self._failed: BaseException | None = None
        self._pf: _Prefetcher | None = None
        self._restart(0)

    # -- fetching --

    def _restart(self, offset: int) -> None:
        if self._pf is not None:
            self._pf.stop()
            self._pf = None
        self._next_off = offset
        if self._readahead > 0:
            wide = self._probed and not self._transport.sequential and _is_async(self._fs)
            threads = self._readahead if wide else 1
            depth = self._readahead if self._probed else 1
            self._pf = _Prefetcher(self, self._transport, offset, threads, depth)

    def _fetch_block(
        self, transport: _RangeTransport | _StreamTransport, start: int, halt: threading.Event
    ) -> bytes:
        """Fetch the block at ``start``, retrying transient failures; raise a ShardReadError."""
        seq = transport.sequential
        length = self._block_size
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
                return data
            except _RangesIgnored:
                raise
            except Exception as exc:
                kind = classify_error(exc)
                if kind != "transient" or attempt >= self._retry.retries:
                    spent = time.monotonic() - began
                    self._redactor.raise_(exc, kind, start, attempt + 1, spent)
                wait = self._retry.delay(attempt)
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
        if self._pf is None:  # readahead=0: fetch in the caller's thread
            result: bytes | BaseException
            try:
                result = self._fetch_block(self._transport, self._next_off, self._halt)
            except Exception as exc:  # kept, so that every later read raises it again
                result = exc
        else:
            result = self._pf.take()
        if isinstance(result, _RangesIgnored):
            logger.info("%s: the server ignores range requests; streaming it instead", self.url)
            self._transport = _StreamTransport(
                self._fs, self._path, self._retry.timeout, self._open_kwargs
            )
            self._probed = True
            self._restart(self._next_off)
            return self._next_block()
        if isinstance(result, BaseException):
            self._failed = result
            raise result
        self._next_off += len(result)
        if not self._probed and result:
            self._probed = True
            if self._pf is not None:
                self._pf.widen(self._readahead if _is_async(self._fs) else 1, self._readahead)
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
        parts = [self._buf[self._buf_pos :]] if avail else []
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
                parts.append(block[:need])
                self._buf, self._buf_pos = block, need
                need = 0
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        """Read to the end."""
        parts = [self.read(len(self._buf) - self._buf_pos)]
        while block := self._next_block():
            parts.append(block)
            self._pos += len(block)
        return b"".join(parts)

    def readinto(self, b: Any) -> int:
        """Read into a writable buffer; return the number of bytes read."""
        view = memoryview(b).cast("B")
        data = self.read(len(view))
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
            self._restart(offset)
        self._pos = offset
        return offset

    def close(self) -> None:
        """Stop the read-ahead threads and drop buffered blocks; idempotent."""
        if not self.closed:
            self._halt.set()
            if self._pf is not None:
                self._pf.stop()
            self._transport.close()
            self._buf = b""
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
            logger.warning(
                "%s: %s failed at byte offset %d (%s), attempt %d of %d; retrying in %.2fs",
                redactor.url, what, offset, redactor.describe(exc), attempt + 1,
                retry.retries + 1, wait,
            )  # fmt: skip
            time.sleep(wait)
            attempt += 1


def open_remote(
    url: str,
    fs: Any,
    path: str,
    *,
    block_size: int,
    readahead: int,
    retry: RetryPolicy,
    storage_options: Mapping[str, Any] | None = None,
    open_kwargs: Mapping[str, Any] | None = None,
) -> RemoteStream:
    """Look ``url`` up (with retries) and return a :class:`RemoteStream` that reads it.

    Raises:
        MissingShardError: No such object or bucket.
        ForbiddenShardError: 401/403 or bad credentials.
        NotAFileError: The URL names a directory.
        RetriesExhaustedError: The look-up kept failing with transient errors.
        ShardReadError: Any other failure. Messages name the URL, never credentials.
    """
    redactor = Redactor(url, storage_options)
    info = with_retries(lambda: _info(fs, path, retry.timeout), redactor, retry, "look-up", 0)
    if info.get("type") == "directory":
        msg = f"{redactor.url}: is a directory, not a file"
        raise NotAFileError(msg, url=redactor.url, offset=0, err=errno.EISDIR)
    size = info.get("size")
    return RemoteStream(
        url,
        fs,
        path,
        size=int(size) if size is not None else None,
        ranges=info.get("partial", True) is not False,
        block_size=block_size,
        readahead=readahead,
        retry=retry,
        redactor=redactor,
        open_kwargs=open_kwargs,
    )


def _info(fs: Any, path: str, timeout: float | None) -> dict[str, Any]:
    if _is_async(fs):
        from fsspec.asyn import sync

        return dict(sync(fs.loop, fs._info, path, timeout=timeout))
    return dict(fs.info(path))
