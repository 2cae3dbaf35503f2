"""One reader's read-ahead: the blocks of its streams fetched in reading order, across shards.

An object store answers each request after tens of milliseconds and serves each connection at
tens of MB/s, so a reader is fast only when it keeps several requests open, and keeps them
open when one shard ends and the next begins. :class:`Readahead` does this for a reader (one
``open_files_by_fsspec`` iteration, or one stream opened alone):

- every stream of the reader takes a :class:`BlockQueue`, in the order the streams are read;
  the queues' blocks are claimed in that order, as if the shards were one long object, so the
  first blocks of the next shards are requested while the current one is parsed;
- the blocks are fetched by the process's fetch threads (:mod:`shardpipes.storage.pool`: one
  pool per process, shared by every reader, so a mixture of many sources does not multiply
  them), as many at once as the pool has learnt that the store rewards
  (:class:`~shardpipes.storage.adapt.Concurrency`), or ``max_requests`` when the reader
  asked for a number (``readahead=N``);
- memory: blocks in flight or fetched and not yet read stay within the process's read-ahead
  budget (``SHARDPIPES_READAHEAD_BYTES``, shared by every stream of every reader of the
  process) and the reader's own ``max_bytes``/``max_blocks`` when set; plus the block each
  stream's reader holds. A stream whose next block cannot be claimed because other streams
  hold the budget (it is read out of order) fetches that block itself, so nothing waits
  forever.

:func:`iter_opened` opens the next shards (their look-ups) ahead, in the process's opener
threads, while the process has room for more open streams, so that their queues exist before
they are read; its ``yield`` order and errors are those of opening one URL after the other.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from shardpipes.storage.pool import (
    DEFAULT_FETCH_THREADS,
    DEFAULT_READAHEAD_BYTES,
    ProcessPool,
    process_pool,
)

__all__ = [
    "AUTO_MAX_BLOCK",
    "AUTO_MAX_BYTES",
    "AUTO_REQUESTS",
    "BlockQueue",
    "Readahead",
    "auto_block_size",
    "iter_opened",
]

# Chosen with benchmarks/object_store.py (docs/performance.md, "An object store far away"):
# a process holds at most 56 MiB ahead (its budget, DEFAULT_READAHEAD_BYTES) + the block being
# read, 8 MiB at most = 64 MiB; the requests in flight are learnt (adapt.py), within it.
AUTO_MAX_BYTES = DEFAULT_READAHEAD_BYTES
AUTO_REQUESTS = DEFAULT_FETCH_THREADS  # a reader alone may use every fetch thread of the process
AUTO_MAX_BLOCK = 8 << 20
_MIN_AUTO_BLOCK = 1 << 20
# Automatic blocks do not shrink as the learnt requests rise: shrinking them to 4 MiB (13 fit
# in 56 MiB) cost the server (moto copies the whole object per request) and the reader more
# CPU than it saved on the 2-core benchmark machine, in three runs against the code before
# (docs/performance.md); so the count rises where blocks are small (small objects, or
# block_size) or the budget large.
_AUTO_BLOCKS_PER_OBJECT = 4
_MAX_SHARDS_AHEAD = 8


def auto_block_size(size: int | None) -> int:
    """Bytes per request for an object of ``size`` bytes: a quarter of it, within 1-8 MiB.

    A few blocks per object let several requests of one shard run at once; blocks of 1 MiB
    and more keep the request count (and the per-request latency paid) low.

    Examples:
        >>> auto_block_size(35_000_000) >> 20, auto_block_size(6_700_000), auto_block_size(None) >> 20
        (8, 1835008, 8)
    """
    if size is None:
        return AUTO_MAX_BLOCK
    quarter = -(-size // _AUTO_BLOCKS_PER_OBJECT)
    quarter = -(-quarter // (256 << 10)) * (256 << 10)  # whole 256 KiB
    return max(_MIN_AUTO_BLOCK, min(AUTO_MAX_BLOCK, quarter))


class BlockQueue:
    """The blocks of one stream, in order: claimed by the reader's threads, taken by the stream.

    Created by :meth:`Readahead.queue` in reading order; not fetched from until
    :meth:`start` gives it the stream's fetch function.
    """

    def __init__(self, pool: Readahead) -> None:
        self.pool = pool
        self.fetch: Callable[[int, int, threading.Event], bytes] | None = None
        self.plan: Callable[[int], tuple[int, int] | None] | None = None
        self.max_in_flight = 0  # 0: not started
        self.halt = threading.Event()
        self.next_claim = 0  # index of the next block a thread may start
        self.consumed = 0  # index of the next block the stream takes
        self.end: int | None = None  # first index past the end (or past a failure)
        self.in_flight = 0
        self.claimed: dict[int, int] = {}  # claimed, not yet taken: index -> bytes counted
        self.results: dict[int, bytes | BaseException] = {}
        self.on_result: Callable[[int, bytes | BaseException], None] | None = None

    def start(
        self,
        fetch: Callable[[int, int, threading.Event], bytes],
        plan: Callable[[int], tuple[int, int] | None],
        max_in_flight: int,
        on_result: Callable[[int, bytes | BaseException], None] | None = None,
    ) -> None:
        """Begin fetching.

        ``plan(i)`` is ``(offset, length)`` of block ``i`` or ``None`` past the end;
        ``fetch(offset, length, halt)`` fetches it (with retries).
        """
        with self.pool.cond:
            self.fetch, self.plan, self.on_result = fetch, plan, on_result
            self.max_in_flight = max(1, max_in_flight)
            self.pool.changed()

    def widen(self, max_in_flight: int) -> None:
        """Let up to ``max_in_flight`` requests of this stream run at once (once ranges are known)."""
        with self.pool.cond:
            self.max_in_flight = max(1, max_in_flight)
            self.pool.changed()

    def _past_end(self, idx: int) -> bool:
        if self.end is not None and idx >= self.end:
            return True
        return self.plan is not None and self.plan(idx) is None

    def take(self) -> bytes | BaseException:
        """The next block in order; ``b""`` past the end (or once stopped)."""
        pool = self.pool
        with pool.cond:
            idx = self.consumed
            while idx not in self.results:
                if self.halt.is_set() or self.plan is None or self._past_end(idx):
                    return b""
                if self.next_claim == idx and (
                    not pool.can_claim(self, idx) or pool.stuck_before(self)
                ):
                    # Other streams hold the budget (this one is read out of order), or an
                    # earlier stream's next block does not fit and keeps this one's from being
                    # claimed (blocks differ in size): fetch it here.
                    claim = pool.claim_one(self, idx, forced=True)
                    if claim is None:
                        return b""
                    pool.cond.release()
                    try:
                        pool.fetch_claimed(self, *claim)
                    finally:
                        pool.cond.acquire()
                    continue
                pool.cond.wait()
            self.consumed += 1
            if idx in self.claimed:
                pool.release(self.claimed.pop(idx), 1)
            result = self.results.pop(idx)
            if self._past_end(self.consumed) and not self.claimed:
                pool.remove(self)
            pool.changed()
            return result

    def stop(self) -> None:
        """Stop claiming and drop fetched blocks; requests in flight finish and are discarded."""
        with self.pool.cond:
            if self.halt.is_set():
                return
            self.halt.set()
            self.pool.release(sum(self.claimed.values()), len(self.claimed))
            self.claimed.clear()
            self.results.clear()
            self.pool.remove(self)
            self.pool.changed()


class Readahead:
    """Blocks of a reader's streams, fetched in reading order within one memory budget.

    One *lane* of the process's fetch pool (:mod:`shardpipes.storage.pool`): the pool's
    threads serve the lanes in turn, so ``max_requests`` is reached only while other readers
    of the process leave threads free, and every lane's blocks count in the process's budget.

    Args:
        max_bytes: Bytes of blocks in flight or fetched and not yet read, over all streams of
            this reader, or ``None`` for the process's budget alone.
        max_requests: Requests in flight at once, or ``None`` for as many as the pool allows
            (learnt from the requests that finished).
        max_blocks: Blocks in flight or fetched and not yet read, or ``None`` for no limit
            beyond ``max_bytes``.
        shared: The process's pool. Default: :func:`~shardpipes.storage.pool.process_pool`.

    Attributes:
        requests: Blocks fetched so far (each one request, plus any retries).
        peak_bytes: The most bytes ever held by the budget.
        peak_in_flight: The most requests ever in flight at once.
    """

    def __init__(
        self,
        max_bytes: int | None,
        max_requests: int | None,
        max_blocks: int | None = None,
        shared: ProcessPool | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.fixed = max_requests or 0
        self.max_blocks = max_blocks
        self.shared = shared if shared is not None else process_pool()
        self.cond = self.shared.cond  # one lock for every lane of the process
        self.queues: list[BlockQueue] = []
        self.held = 0  # bytes claimed and not yet taken (or stopped)
        self.blocks = 0  # blocks claimed and not yet taken
        self.in_flight = 0
        self.requests = 0
        self.peak_bytes = 0
        self.peak_in_flight = 0
        self.first_claims: list[int] = []  # order in which queues got their first claim (ids)

    @classmethod
    def for_options(cls, readahead: int | None) -> Readahead:
        """The read-ahead for ``open_files_by_fsspec``'s ``readahead`` (``None``: automatic)."""
        if readahead is None:
            return cls(None, None)
        return cls(None, readahead, max_blocks=readahead)

    @property
    def max_requests(self) -> int:
        """Requests of this reader in flight at once: asked for, or what the pool allows now."""
        return self.fixed or self.shared.allowed()

    @property
    def width(self) -> int:
        """Requests of one stream that may run at once (the lane's count bounds them all)."""
        return self.fixed or self.shared.limits.threads

    @property
    def threads(self) -> int:
        """Fetch threads of the process running now (shared by every lane)."""
        with self.cond:
            return self.shared.threads

    def queue(self) -> BlockQueue:
        """A queue for the next stream in reading order."""
        q = BlockQueue(self)
        with self.cond:
            self.queues.append(q)
            self.shared.add_lane(self)
        return q

    def replace(self, old: BlockQueue) -> BlockQueue:
        """A fresh queue in ``old``'s place (after a seek), first if ``old`` is gone; ``old`` is stopped."""
        q = BlockQueue(self)
        with self.cond:
            try:
                at = self.queues.index(old)
            except ValueError:
                at = 0
            self.queues.insert(at, q)
            self.shared.add_lane(self)
        old.stop()
        return q

    # -- under self.cond --

    def remove(self, q: BlockQueue) -> None:
        """Forget ``q`` (its blocks no longer count)."""
        if q in self.queues:
            self.queues.remove(q)
            if not self.queues:
                self.shared.drop_lane(self)

    def changed(self) -> None:
        """Wake the fetch threads after the queues or the budget changed."""
        self.shared.changed()

    def wanted(self) -> int:
        """Requests this lane could have in flight now (what it asks of the pool's threads)."""
        return min(
            self.max_requests, sum(q.max_in_flight for q in self.queues if q.plan is not None)
        )

    def _length(self, q: BlockQueue, idx: int) -> int | None:
        assert q.plan is not None
        got = q.plan(idx)
        return None if got is None else got[1]

    def can_claim(self, q: BlockQueue, idx: int) -> bool:
        """Whether the budgets have room for block ``idx`` of ``q`` (always, when the process holds none)."""
        length = self._length(q, idx) or 0
        if not self.shared.fits(length):
            return False
        if self.blocks == 0:
            return True
        if self.max_blocks is not None and self.blocks >= self.max_blocks:
            return False
        return self.max_bytes is None or self.held + length <= self.max_bytes

    def stuck_before(self, q: BlockQueue) -> bool:
        """Whether an earlier stream's next block waits for budget (so :meth:`claim` stops there)."""
        for other in self.queues:
            if other is q:
                return False
            if other.plan is None or other.halt.is_set() or other.in_flight >= other.max_in_flight:
                continue
            idx = other.next_claim
            if not other._past_end(idx) and not self.can_claim(other, idx):
                return True
        return False

    def release(self, length: int, blocks: int) -> None:
        """``blocks`` claimed blocks of ``length`` bytes in all were taken or dropped."""
        self.held -= length
        self.blocks -= blocks
        self.shared.hold(-length, -blocks)

    def claim_one(
        self, q: BlockQueue, idx: int, forced: bool = False
    ) -> tuple[int, int, int] | None:
        """Claim block ``idx`` of ``q`` for fetching: ``(index, offset, length)``, or ``None``."""
        assert q.plan is not None
        got = q.plan(idx)
        if got is None:
            return None
        offset, length = got
        q.next_claim = idx + 1
        q.in_flight += 1
        q.claimed[idx] = length
        if idx == 0:
            self.first_claims.append(id(q))
        self.held += length
        self.blocks += 1
        self.shared.hold(length, 1)
        self.shared.started()  # the fetch follows the claim at once (fetch_claimed)
        self.in_flight += 1
        self.requests += 1
        self.peak_bytes = max(self.peak_bytes, self.held)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return idx, offset, length

    def claim(self) -> tuple[BlockQueue, int, int, int] | None:
        """The next block a fetch thread may start, claimed, or ``None`` (called by the pool)."""
        if self.in_flight >= self.max_requests:
            return None
        for q in self.queues:
            if q.plan is None:
                return None  # its look-up is not done: later streams wait (order is kept)
            if q.halt.is_set() or q.in_flight >= q.max_in_flight:
                continue
            idx = q.next_claim
            if q._past_end(idx):
                continue
            if not self.can_claim(q, idx):
                return None  # budget full: the earliest unclaimed block goes first
            claim = self.claim_one(q, idx)
            if claim is not None:
                return (q, *claim)
        return None

    # -- the threads --

    def fetch_claimed(self, q: BlockQueue, idx: int, offset: int, length: int) -> None:
        """Fetch a claimed block (without the lock) and hand it over."""
        assert q.fetch is not None
        result: bytes | BaseException
        try:
            result = q.fetch(offset, length, q.halt)
        except BaseException as exc:  # handed to the stream, raised at its position
            result = exc
        with self.cond:
            self.in_flight -= 1
            q.in_flight -= 1
            self.shared.finished(len(result) if isinstance(result, bytes) else 0)
            if q.on_result is not None and not q.halt.is_set():
                q.on_result(idx, result)
            if not q.halt.is_set():
                q.results[idx] = result
                if isinstance(result, BaseException) or not result:
                    q.end = idx + 1 if q.end is None else min(q.end, idx + 1)
            self.changed()


def iter_opened(
    urls: Iterator[Any],
    open_one: Callable[[Any, BlockQueue | None], Any],
    remote: Callable[[Any], bool],
    pool: Readahead,
) -> Iterator[tuple[Any, Future[Any] | None, BlockQueue | None]]:
    """Yield ``(url, future of its stream or None, queue)`` in order, opening remote URLs ahead.

    ``open_one(url, queue)`` opens one URL. Remote URLs are opened in the process's opener
    threads as soon as they are pulled; up to ``_MAX_SHARDS_AHEAD`` are pulled ahead while the
    bytes of the shards opened ahead stay below the pool's budget and the process has room for
    more open streams (the next one is always pulled). A URL that is not remote (a local file,
    a cache entry, a sample range) stops the pulling until it is yielded, so stages before this
    one see the order they would without read-ahead; it is opened by the caller.
    """
    ahead: deque[tuple[Any, Future[Any] | None, BlockQueue | None]] = deque()
    shared = pool.shared
    budget = pool.max_bytes if pool.max_bytes is not None else shared.budget
    exhausted = False
    try:
        while True:
            while not exhausted and not any(f is None for _, f, _ in ahead):
                if len(ahead) >= 2 and (
                    len(ahead) >= _MAX_SHARDS_AHEAD or _bytes_ahead(ahead) >= budget
                ):
                    break
                if ahead and not shared.has_room():
                    break  # the process's open streams are at their bound: open it at its turn
                try:
                    url = next(urls)
                except StopIteration:
                    exhausted = True
                    break
                if remote(url):
                    q = pool.queue()
                    ahead.append((url, shared.submit(_open_guarded, open_one, url, q), q))
                else:
                    ahead.append((url, None, None))
            if not ahead:
                return
            yield ahead.popleft()
    finally:
        for _, fut, pending in ahead:
            if pending is not None:
                pending.stop()
            if fut is not None and not fut.cancel():
                fut.add_done_callback(_close_result)


def _open_guarded(
    open_one: Callable[[Any, BlockQueue | None], Any], url: Any, q: BlockQueue
) -> Any:
    try:
        return open_one(url, q)
    except BaseException:
        q.stop()  # its place in the order is given up: later streams go on
        raise


def _bytes_ahead(ahead: deque[tuple[Any, Future[Any] | None, BlockQueue | None]]) -> int:
    total = 0
    for _, fut, _ in ahead:
        if fut is None or not fut.done() or fut.exception() is not None:
            total += AUTO_MAX_BLOCK  # not known yet: count one block
            continue
        size = getattr(fut.result(), "size", None)
        total += size if size is not None else AUTO_MAX_BLOCK
    return total


def _close_result(fut: Future[Any]) -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    close = getattr(fut.result(), "close", None)
    if close is not None:
        close()
