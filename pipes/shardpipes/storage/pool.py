"""The reader process's fetch pool: fixed numbers of threads and open streams, whatever the sources.

A reader that interleaves N sources (a mixture, ``mux``, webdataset's ``RandomMix``) has N
openers, each with its read-ahead (:class:`~shardpipes.storage.readahead.Readahead`), each
with a stream open. Were threads and connections per opener, a 35-source mixture would start
35 x 14 threads and hold 35 x 9 streams in every process (a 35-domain Grain mixture made
17,920 reader thread pools on 64 hosts). Here they belong to the process, one
:class:`ProcessPool` per process (a forked child starts its own), shared by every stream of it,
one source or many:

- **fetch threads** (named ``shardpipes-readahead``): at most ``threads`` per process, and
  fewer while fewer carry as much: how many requests are in flight is learnt from the
  requests that finished (:class:`~shardpipes.storage.adapt.Concurrency`: raised while the
  throughput rises with it). Each reader's read-ahead is a *lane* with its own order; the
  threads serve the lanes in turn. They start when a lane has work and end when no lane has
  any.
- **read-ahead bytes**: blocks in flight or fetched and not yet read, over every stream of
  every reader of the process, stay within ``readahead_bytes`` (one budget per process, not
  per stream or reader), plus the block each reading thread holds and one a reading thread
  fetches itself when the budget is full of other streams' blocks. Raising the count never
  raises the memory: a block that does not fit waits.
- **opener threads** (``shardpipes-open``): at most ``openers`` per process look up the next
  shards of every lane, so that their first blocks can be requested ahead.
- **open streams**: at most ``streams`` remote streams per process hold a read-ahead queue or a
  connection. A stream past the bound that is read again takes the place of the least
  recently read one, which closes its connection and drops what it fetched ahead; when it is
  read again it reopens at the byte offset it reached (the offset a retry resumes at), so it
  still delivers every byte once, in order. Streams opened ahead wait for a free place.

- **local files** read by byte ranges (what ``sharding_by_index`` gives ``mix()`` and every
  indexed reader) are :class:`ReopeningFile` objects, which take the same places: at most
  ``streams`` of them (with the remote streams) hold a file handle; the one that holds it
  longest closes it and reopens it at its offset when it is read again.

So a process has at most ``threads + openers`` threads of ours and its requests in flight are
at most ``threads + openers`` plus one per thread that reads (a stream read with
``readahead=0`` fetches in the reading thread); connections held between requests belong to
the ``streams`` open streams. The limits come from the environment
(``SHARDPIPES_FETCH_THREADS``, ``SHARDPIPES_OPEN_STREAMS``, read when a process first reads a
remote stream, so worker processes get them too; ``SHARDPIPES_READAHEAD_BYTES`` for the
budget, with an optional ``K``/``M``/``G`` suffix of binary units) or :func:`set_fetch_limits`.

Examples:
    >>> limits = fetch_limits()
    >>> limits.threads, limits.streams, limits.openers, limits.readahead_bytes >> 20
    (32, 16, 2, 56)
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from shardpipes.storage.adapt import Concurrency

__all__ = [
    "DEFAULT_FETCH_THREADS",
    "DEFAULT_OPEN_STREAMS",
    "DEFAULT_READAHEAD_BYTES",
    "START_REQUESTS",
    "FetchLimits",
    "ProcessPool",
    "ReopeningFile",
    "fetch_figures",
    "fetch_limits",
    "process_pool",
    "set_fetch_limits",
]

# At most 32 requests in flight (31 blocks of 1.75 MiB fit in the default budget, or more of
# 8 MiB in a larger one); how many run is measured (adapt.py, docs/cloud-storage.md).
# 56 MiB of read-ahead per process: what one reader held before the budget was the process's
# (with the 8 MiB block being read: 64 MiB). 16 streams: one reader's current shard and the
# shards it opens ahead (at most 8), with room for a few sources read in turn.
DEFAULT_FETCH_THREADS = 32
DEFAULT_OPEN_STREAMS = 16
DEFAULT_READAHEAD_BYTES = 56 << 20
_OPENERS = 2
# Requests in flight at first: 6 blocks of 8 MiB and one more fill the default budget.
START_REQUESTS = 6


@dataclass(frozen=True)
class FetchLimits:
    """The bounds of one process's fetch pool.

    Attributes:
        threads: The most fetch threads (requests in flight for read-ahead). Default: ``32``.
        streams: Remote streams holding a read-ahead queue or a connection. Default: ``16``.
        openers: Threads looking up shards ahead. Default: ``2``.
        readahead_bytes: Bytes of blocks in flight or not yet read, over every stream of the
            process. Default: ``56 MiB``.

    Raises:
        ValueError: A bound below 1, naming it.
    """

    threads: int = DEFAULT_FETCH_THREADS
    streams: int = DEFAULT_OPEN_STREAMS
    openers: int = _OPENERS
    readahead_bytes: int = DEFAULT_READAHEAD_BYTES

    def __post_init__(self) -> None:
        for name in ("threads", "streams", "openers", "readahead_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fetch limit {name} should be an integer >= 1, got {value!r}")


logger = logging.getLogger(__name__)

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _env_limit(name: str, default: int, units: bool = False) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    text, scale = raw.strip(), 1
    if units and text[-1:].upper() in _UNITS:
        text, scale = text[:-1], _UNITS[text[-1:].upper()]
    try:
        return int(text) * scale
    except ValueError:
        what = "an integer >= 1 (K, M or G: KiB, MiB, GiB)" if units else "an integer >= 1"
        raise ValueError(f"{name}={raw!r} should be {what}") from None


class Lane(Protocol):
    """What the pool needs of one reader's read-ahead (:class:`~shardpipes.storage.readahead.Readahead`)."""

    in_flight: int
    fixed: int  # requests the reader asked for (``readahead=N``), 0: as many as the pool allows

    def wanted(self) -> int:
        """Fetch threads this lane could keep busy now."""

    def claim(self) -> tuple[Any, int, int, int] | None:
        """The next block to fetch ``(queue, index, offset, length)``, or ``None`` (under the lock)."""

    def fetch_claimed(self, q: Any, idx: int, offset: int, length: int) -> None:
        """Fetch a claimed block (without the lock) and hand it over."""


class Releasable(Protocol):
    """A stream that can give its place up (:class:`~shardpipes.storage.remote.RemoteStream`)."""

    def try_release(self) -> bool:
        """Close the connection and drop the read-ahead unless it is being read now."""


class ProcessPool:
    """The fetch threads, opener threads and open-stream places of one process (see the module).

    Attributes:
        limits: The bounds.
        cond: The one lock of every read-ahead lane of the process.
        concurrency: The requests in flight allowed now, learnt from finished requests.
        held: Bytes of blocks in flight or not yet read, over every lane (``blocks`` of them);
            ``peak_held`` the most at once.
        threads: Fetch threads running now; ``peak_threads`` the most at once.
        open_streams: Streams holding a place now; ``peak_streams`` the most at once.
        evictions: Streams that gave their place up to a stream read again.
    """

    def __init__(self, limits: FetchLimits) -> None:
        self.limits = limits
        self.cond = threading.Condition()
        self.concurrency = Concurrency(cap=limits.threads, start=START_REQUESTS)
        self.held = 0
        self.blocks = 0
        self.peak_held = 0
        self.lanes: list[Lane] = []  # lanes with queues, served in turn
        self._turn = 0
        self.threads = 0
        self.peak_threads = 0
        self._jobs: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._openers = 0
        # Least recently read first; weak, so that a stream nobody closes is still collected.
        self._places: OrderedDict[int, weakref.ref[Releasable]] = OrderedDict()
        self._places_lock = threading.Lock()
        self.peak_streams = 0
        self.evictions = 0

    # -- the budget and the count (under self.cond) --

    @property
    def budget(self) -> int:
        """Bytes of read-ahead the process may hold (``limits.readahead_bytes``)."""
        return self.limits.readahead_bytes

    def fits(self, length: int) -> bool:
        """Whether a block of ``length`` bytes fits in the budget (always, when nothing is held)."""
        return self.blocks == 0 or self.held + length <= self.limits.readahead_bytes

    def hold(self, length: int, blocks: int) -> None:
        """Count ``length`` bytes in ``blocks`` blocks claimed (negative: taken or dropped)."""
        self.held += length
        self.blocks += blocks
        self.peak_held = max(self.peak_held, self.held)

    def started(self) -> None:
        """A request starts now."""
        self.concurrency.started(time.monotonic())

    def finished(self, nbytes: int) -> None:
        """A request ends now, having carried ``nbytes`` (``0``: it failed): learn from it."""
        c = self.concurrency
        before = c.requests
        c.finished(time.monotonic(), nbytes)
        if c.requests != before:
            logger.debug(
                "requests in flight %d -> %d (window %d: %.1f MB/s, %.1f in flight)",
                before, c.requests, c.windows, c.last_rate / 1e6, c.last_in_flight,
            )  # fmt: skip
            self.changed()

    # -- fetch threads (under self.cond) --

    def allowed(self) -> int:
        """Requests in flight allowed now: the learnt count, or more if a reader asked for more."""
        asked = max((lane.fixed for lane in self.lanes), default=0)
        return min(self.limits.threads, max(self.concurrency.requests, asked))

    def add_lane(self, lane: Lane) -> None:
        """Serve ``lane`` (it has a queue)."""
        if lane not in self.lanes:
            self.lanes.append(lane)

    def drop_lane(self, lane: Lane) -> None:
        """Stop serving ``lane`` (it has no queue left)."""
        if lane in self.lanes:
            self.lanes.remove(lane)

    def changed(self) -> None:
        """Wake the fetch threads, and start more (within the bound) if the lanes want them."""
        self.cond.notify_all()
        allowed = self.allowed()
        if self.threads >= allowed:
            return
        wanted = min(allowed, sum(lane.wanted() for lane in self.lanes))
        while self.threads < wanted:
            self.threads += 1
            self.peak_threads = max(self.peak_threads, self.threads)
            threading.Thread(target=self._run, name="shardpipes-readahead", daemon=True).start()

    def _claim(self) -> tuple[Lane, Any, int, int, int] | None:
        # Lanes in turn; first those below their share of the threads, so that one reader's
        # many requests cannot keep another's waiting for more than one request's time.
        n = len(self.lanes)
        allowed = self.allowed()
        if sum(lane.in_flight for lane in self.lanes) >= allowed:
            return None  # the count went down: threads beyond it wait, then end
        share = max(1, allowed // max(n, 1))
        for fair in (True, False):
            for i in range(n):
                lane = self.lanes[(self._turn + i) % n]
                if fair and lane.in_flight >= share:
                    continue
                job = lane.claim()
                if job is not None:
                    self._turn = (self._turn + i + 1) % n  # the next lane goes first next time
                    return (lane, *job)
        return None

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while (job := self._claim()) is None:
                        if not self.lanes:
                            return  # no stream left in the process: the thread ends
                        self.cond.wait()
                lane, *claimed = job
                lane.fetch_claimed(*claimed)
        finally:
            with self.cond:
                self.threads -= 1

    # -- opener threads --

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` in an opener thread; cancel the future to drop it before it runs."""
        fut: Future[Any] = Future()
        with self.cond:
            self._jobs.append((fut, fn, args))
            # An opener thread lives only while there are jobs, so each one running is busy.
            if self._openers < self.limits.openers:
                self._openers += 1
                threading.Thread(target=self._open_run, name="shardpipes-open", daemon=True).start()
        return fut

    def _open_run(self) -> None:
        while True:
            with self.cond:
                if not self._jobs:
                    self._openers -= 1
                    return  # nothing to open: the thread ends
                fut, fn, args = self._jobs.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits for the stream
                fut.set_exception(exc)

    # -- open streams --

    def has_room(self) -> bool:
        """Whether a stream could be opened without taking another's place."""
        with self._places_lock:
            return len(self._places) < self.limits.streams

    def take_place(self, stream: Releasable) -> None:
        """Give ``stream`` a place (or mark it most recently read), releasing the least recently read.

        A stream being read (``try_release`` says no) keeps its place; the bound then holds as
        long as fewer threads read at once than there are places.
        """
        key = id(stream)
        with self._places_lock:
            held = self._places.get(key)
            if held is not None and held() is stream:
                self._places.move_to_end(key)
                return
            self._places[key] = weakref.ref(stream)
            self._places.move_to_end(key)
            for other_key, ref in list(self._places.items()):
                if len(self._places) <= self.limits.streams:
                    break
                other = ref()
                if other is None:
                    del self._places[other_key]  # collected without a close
                elif other_key != key and other.try_release():
                    del self._places[other_key]
                    self.evictions += 1
            self.peak_streams = max(self.peak_streams, len(self._places))

    def leave(self, stream: Releasable) -> None:
        """``stream`` was closed (or released): its place is free."""
        with self._places_lock:
            held = self._places.get(id(stream))
            if held is not None and held() in (stream, None):
                del self._places[id(stream)]

    @property
    def open_streams(self) -> int:
        """Streams holding a place now."""
        with self._places_lock:
            return len(self._places)


class ReopeningFile(io.RawIOBase):
    """A local file read from ``offset`` on, holding its handle only while it has a place.

    Read and seek it as a file opened ``"rb"``; when other streams of the process take its
    place (it has held it longest), its handle is closed, and the next read opens the file
    again at the position reached.

    Args:
        path: The file.
        offset: Where reading starts. Default: ``0``.

    Raises:
        OSError: As ``open(path, "rb")`` does (``FileNotFoundError``, ...), at construction.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.bin"); _ = open(p, "wb").write(b"abcdef")
        >>> with ReopeningFile(p, 2) as f:
        ...     f.read(3), f.try_release(), f.read()
        (b'cde', True, b'f')
    """

    def __init__(self, path: str, offset: int = 0) -> None:
        super().__init__()
        self.name = path
        self._pos = offset
        self._f: io.FileIO | None = None
        self._use = threading.Lock()
        self._pool = process_pool()
        self._reopen()

    def _reopen(self) -> io.FileIO:
        self._pool.take_place(self)
        f = io.FileIO(self.name, "r")
        try:
            f.seek(self._pos)
        except BaseException:
            f.close()
            raise
        self._f = f
        return f

    def readable(self) -> bool:
        """``True``."""
        return True

    def seekable(self) -> bool:
        """``True``."""
        return True

    def tell(self) -> int:
        """The position."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` (relative to ``whence``) and return the new position."""
        with self._use:
            f = self._f if self._f is not None else self._reopen()
            self._pos = f.seek(offset, whence)
            return self._pos

    def read(self, size: int | None = -1) -> bytes:
        """Read up to ``size`` bytes (all the rest if negative)."""
        with self._use:
            f = self._f if self._f is not None else self._reopen()
            data = f.read(-1 if size is None else size) or b""
            self._pos += len(data)
            return data

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer``; return the number of bytes read."""
        with self._use:
            f = self._f if self._f is not None else self._reopen()
            n = f.readinto(buffer) or 0
            self._pos += n
            return n

    def try_release(self) -> bool:
        """Close the handle unless the file is being read (the next read reopens it)."""
        if not self._use.acquire(blocking=False):
            return False
        try:
            f, self._f = self._f, None
            if f is not None:
                f.close()
            return True
        finally:
            self._use.release()

    def close(self) -> None:
        """Close the file; idempotent."""
        if not self.closed:
            with self._use:
                f, self._f = self._f, None
                if f is not None:
                    f.close()
            self._pool.leave(self)
        super().close()


_lock = threading.Lock()
_pool: ProcessPool | None = None
_limits: FetchLimits | None = None


def fetch_limits() -> FetchLimits:
    """The bounds of this process's fetch pool (from :func:`set_fetch_limits` or the environment)."""
    global _limits
    with _lock:
        if _limits is None:
            _limits = FetchLimits(
                _env_limit("SHARDPIPES_FETCH_THREADS", DEFAULT_FETCH_THREADS),
                _env_limit("SHARDPIPES_OPEN_STREAMS", DEFAULT_OPEN_STREAMS),
                _OPENERS,
                _env_limit("SHARDPIPES_READAHEAD_BYTES", DEFAULT_READAHEAD_BYTES, units=True),
            )
        return _limits


def set_fetch_limits(
    *,
    threads: int | None = None,
    streams: int | None = None,
    readahead_bytes: int | None = None,
) -> FetchLimits:
    """Set this process's bounds (``None``: keep); streams opened later follow them.

    Worker processes started by ``fork`` inherit them; others read the environment
    (``SHARDPIPES_FETCH_THREADS``, ``SHARDPIPES_OPEN_STREAMS``, ``SHARDPIPES_READAHEAD_BYTES``).

    Examples:
        >>> old = fetch_limits()
        >>> set_fetch_limits(threads=4).threads
        4
        >>> set_fetch_limits(threads=old.threads, streams=old.streams) == old
        True
    """
    global _limits, _pool
    now = fetch_limits()
    new = FetchLimits(
        threads if threads is not None else now.threads,
        streams if streams is not None else now.streams,
        now.openers,
        readahead_bytes if readahead_bytes is not None else now.readahead_bytes,
    )
    with _lock:
        _limits = new
        pool = _pool
    if pool is not None:
        with pool.cond:
            pool.limits = new
            pool.concurrency.set_cap(new.threads)
            pool.changed()
    return new


def process_pool() -> ProcessPool:
    """This process's pool, made on first use."""
    global _pool
    limits = fetch_limits()
    with _lock:
        if _pool is None:
            _pool = ProcessPool(limits)
        return _pool


def fetch_figures() -> dict[str, Any] | None:
    """What this process's fetch pool has learnt so far; ``None`` if it read nothing remote.

    ``requests``: requests in flight it allows now (learnt from the requests that finished,
    :class:`~shardpipes.storage.adapt.Concurrency`); ``mb_per_s``: throughput of its last
    window of finished requests; ``windows``: windows measured; ``peak_requests``: the most
    fetch threads at once; ``peak_readahead_mb``: the most read-ahead held, against
    ``budget_mb``, the process's budget.

    Examples:
        >>> figures = fetch_figures()
        >>> figures is None or figures["requests"] >= 1
        True
    """
    with _lock:
        pool = _pool
    if pool is None:
        return None
    with pool.cond:
        c = pool.concurrency
        return {
            "requests": c.requests,
            "mb_per_s": round(c.last_rate / 1e6, 3),
            "windows": c.windows,
            "peak_requests": pool.peak_threads,
            "peak_readahead_mb": round(pool.peak_held / 2**20, 1),
            "budget_mb": round(pool.budget / 2**20, 1),
        }


def _after_fork_in_child() -> None:
    # The parent's threads do not exist in the child, and a lock may have been held when it
    # forked: the child starts a pool of its own.
    global _pool, _lock
    _lock = threading.Lock()
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
