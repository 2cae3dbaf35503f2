"""Equal-length iteration across distributed ranks (functional name: ``fullsync``).

DDP needs every rank to run the same number of steps, but with uneven shards the ranks do not
know in advance how many items each will get. torchdata 0.9's ``FullSync`` ran a collective for
every item. Here each rank reads a chunk of items ahead (1, 2, 4, ... up to ``sync_every``)
and the ranks agree on how many of them everyone yields with one ``all_reduce`` per chunk:

- ``policy="stop"``: yield ``min`` over ranks, then stop everyone once any rank ran short.
- ``policy="pad"``: yield ``max`` over ranks; a rank that ran short repeats its own most recent
  items (up to ``sync_every`` of them, kept for this) to fill the difference.

The same collective carries an error flag: when the source raises on one rank, the other ranks
stop with an error that says so instead of waiting for a collective that never comes.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import time
from collections.abc import Iterator
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._index_length import index_length
from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.errors import WorkerError

__all__ = [
    "ExactLengthIterDataPipe",
    "FullSyncIterDataPipe",
    "PrefetchTimeoutError",
    "SyncStats",
    "gloo_group",
    "settled",
]

T = TypeVar("T")
Policy = Literal["stop", "pad"]


# Tensors of collectives torch's gloo thread still held after settled()'s wait (never seen):
# kept here, and let go far later, rather than freed on that thread.
_HELD: collections.deque[torch.Tensor] = collections.deque(maxlen=1024)


def settled(work: Any, tensors: list[torch.Tensor], timeout: float | None) -> None:
    """Wait for a collective's ``work``, then until gloo's thread has let go of ``tensors``.

    Pass ``work`` straight from the call (``settled(dist.all_reduce(t, ..., async_op=True),
    [t], ...)``): no other reference to it may be held (not even a caller's argument: the
    wait would run into its 1 s bound). gloo's thread drops its references to
    a collective's tensors just after the work completes. If Python drops a tensor first, its
    Python object is kept alive by the C++ tensor and freed later on gloo's thread, which then
    makes itself a Python thread state (1 tensor in 6 to 8 of a loop of ``all_reduce``, measured);
    CPython up to 3.11.7 deadlocks a child forked at that instant (gh-112275: the lock is
    taken without the GIL), and the worker processes of a loader are forked right after its
    collectives: a rank's worker hung in ``PyOS_AfterFork_Child``. Waiting the few
    microseconds until each tensor is Python's alone keeps its free on this thread.
    """
    if timeout is None:
        work.wait()  # the process group's own time-out
    else:
        work.wait(datetime.timedelta(seconds=timeout))
    del work  # (the Work holds the tensors too)
    deadline = time.monotonic() + 1.0
    while any(t._use_count() > 1 for t in tensors):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            _HELD.extend(tensors)
            return
        time.sleep(0)


def gloo_group(timeout: float) -> Any:
    """A process group for our small CPU collectives: the default one if it is gloo, else a new gloo group.

    Training often uses NCCL, which cannot reduce CPU tensors. ``new_group`` is a collective:
    every rank must call this at the same point.
    """
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))


class PrefetchTimeoutError(WorkerError):
    """The ranks did not answer within ``timeout`` seconds (torchdata 0.9's name; a ``WorkerError``)."""

    def __init__(self, timeout: float, message: str | None = None) -> None:
        super().__init__(message or f"Fail to fetch data within {timeout} seconds")
        self.timeout = timeout


class SyncStats:
    """What the last epoch's synchronisation did on this rank.

    Attributes:
        yielded: Items yielded (equal on every rank).
        own: Items yielded that came from this rank's source (the rest are padding).
        dropped: Items this rank read but did not yield because another rank ran out first.
        exhausted: Whether this rank's source ended this epoch.
        collectives: Number of ``all_reduce`` calls made.
    """

    __slots__ = ("collectives", "dropped", "exhausted", "own", "yielded")

    def __init__(self) -> None:
        self.yielded = 0
        self.own = 0
        self.dropped = 0
        self.exhausted = False
        self.collectives = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the counters as a plain dict."""
        return {k: getattr(self, k) for k in self.__slots__}


@register("fullsync")
class FullSyncIterDataPipe(StageIterDataPipe[T]):
    """Make every distributed rank yield the same number of items (functional name: ``fullsync``).

    ``DistributedReadingService`` adds this at the end of the graph by itself (in the main
    process, after the worker pool); write it only to choose ``policy`` or ``sync_every``.
    Outside ``torch.distributed`` (or with one rank) it passes items through.

    Args:
        datapipe: The source (usually batches).
        timeout: Seconds to wait for the other ranks at each synchronisation. Default: ``1800``.
        policy: ``"stop"`` (default): all ranks stop when the first runs out. ``"pad"``: ranks
            that run out repeat their own recent items until the longest rank ends.
        sync_every: Largest number of items read ahead between synchronisations. Default: ``16``.

    Raises:
        WorkerError: Another rank failed or stopped answering within ``timeout``.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).fullsync())  # one process: passes through
        [0, 1, 2]
    """

    main_process = True  # sees the output of all workers together
    syncs_ranks = True
    seek_refusal = "fullsync() evens out the ranks by dropping or repeating items as they come"

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        timeout: float = 1800,
        *,
        policy: Policy = "stop",
        sync_every: int = 16,
    ) -> None:
        if policy not in ("stop", "pad"):
            raise ValueError(f"policy {policy!r} is not known; must be one of 'stop', 'pad'")
        if sync_every <= 0:
            raise ValueError(f"sync_every should be a positive integer, got {sync_every!r}")
        if timeout <= 0:
            raise ValueError(f"timeout should be positive, got {timeout!r}")
        self.source_datapipe = datapipe
        self.timeout = timeout
        self.policy = policy
        self.sync_every = sync_every
        self._group: Any = None
        self._agree_buf: torch.Tensor | None = None
        self.stats = SyncStats()

    def set_process_group(self, group: Any) -> FullSyncIterDataPipe[T]:
        """Use ``group`` (a gloo group) for the collectives; called by the reading service."""
        self._group = group
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]
        state["_group"] = None  # process groups do not pickle
        state["_agree_buf"] = None
        return state

    def is_replicable(self) -> bool:
        """``False``: it runs once, in the main process, over what all workers yield (0.9's protocol)."""
        return False

    # torchdata 0.9's FullSync read one item ahead in a thread, which pause() held. This one
    # reads only when asked (a chunk at a time, between collectives), so nothing runs between
    # next() calls: pause, resume and shutdown have nothing to hold and return at once.
    def pause(self) -> None:
        """Kept for torchdata 0.9's API: nothing is read in the background, so nothing to pause."""

    def resume(self) -> None:
        """Kept for torchdata 0.9's API (see :meth:`pause`)."""

    def shutdown(self) -> None:
        """Kept for torchdata 0.9's API: no thread to stop."""

    def __iter__(self) -> Iterator[T]:
        self.stats = stats = SyncStats()
        if not dist.is_available() or not dist.is_initialized():
            yield from self.source_datapipe
            return
        group = self._group
        if dist.get_world_size(group) == 1:
            yield from self.source_datapipe
            return
        rank = dist.get_rank()
        recent: collections.deque[T] = collections.deque(maxlen=self.sync_every)
        it = iter(self.source_datapipe)
        size = 1
        while True:
            chunk: list[T] = []
            failure: BaseException | None = None
            try:
                while len(chunk) < size and not stats.exhausted:
                    try:
                        chunk.append(next(it))
                    except StopIteration:  # noqa: PERF203 - how a chunk learns the source ended
                        stats.exhausted = True
            except Exception as exc:
                failure = exc
            low, high = self._agree(len(chunk), failure is not None, rank, stats)
            if failure is not None:
                raise failure
            take = low if self.policy == "stop" else high
            for item in chunk[:take]:
                recent.append(item)
                stats.own += 1
                stats.yielded += 1
                yield item
            stats.dropped += max(len(chunk) - take, 0)
            missing = take - len(chunk)
            if missing > 0:
                if not recent:
                    raise WorkerError(
                        f"rank {rank} has no items of its own to pad with (policy='pad'): it got no "
                        "data this epoch; use more shards than ranks x workers, or policy='stop'"
                    )
                pad = list(recent)
                for i in range(missing):
                    stats.yielded += 1
                    yield pad[i % len(pad)]
            if take < size:  # some rank ("stop") or every rank ("pad") ran out
                return
            size = min(size * 2, self.sync_every)

    def _agree(self, count: int, failed: bool, rank: int, stats: SyncStats) -> tuple[int, int]:
        # One all_reduce(MAX) over [count, -count, failed] gives max, -min and any failure.
        t = getattr(self, "_agree_buf", None)
        if t is None:  # one tensor for every collective of the stage (see settled())
            t = self._agree_buf = torch.zeros(3, dtype=torch.int64)
        t.copy_(torch.tensor([count, -count, int(failed)], dtype=torch.int64))
        stats.collectives += 1
        try:
            settled(
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group, async_op=True),
                [t],
                self.timeout,
            )
        except Exception as exc:
            raise PrefetchTimeoutError(
                self.timeout,
                f"rank {rank}: the ranks could not agree on the epoch length within "
                f"{self.timeout:g} s; another rank probably died or stopped iterating ({exc})",
            ) from exc
        high, low, any_failed = (int(v) for v in t.tolist())
        if any_failed and not failed:
            raise WorkerError(
                f"rank {rank}: another rank failed while loading data; its own error says why"
            )
        return -low, high


class ExactLengthIterDataPipe(StageIterDataPipe[T]):
    """Yield exactly as many items as ``sharding_by_index`` promised this reader.

    With an index every reader gets the same number of samples, so when nothing between the
    sharder and the end of the graph changes counts except one ``batch()``, every rank's
    epoch length is known before it starts and no per-chunk synchronisation is needed.
    ``DistributedReadingService`` puts this stage at the end of such graphs in place of
    ``fullsync``. It guards the promise: if a handler skipped samples and the source runs short,
    it repeats this reader's own recent items (``stats.yielded - stats.own`` of them) rather
    than let the ranks drift apart.

    Args:
        source_datapipe: The graph, with one ``sharding_by_index`` in it.
        batch_size: The batch size of the graph's ``batch()``, or ``None`` if it has none.
        drop_last: That ``batch()``'s ``drop_last``.
    """

    one_to_one = True  # yields the count its source should: the one the index gives

    def __init__(
        self, source_datapipe: IterDataPipe[T], batch_size: int | None, drop_last: bool
    ) -> None:
        self.source_datapipe = source_datapipe
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.stats = SyncStats()

    def __iter__(self) -> Iterator[T]:
        self.stats = stats = SyncStats()
        it = iter(self.source_datapipe)
        recent: collections.deque[T] = collections.deque(maxlen=16)
        try:
            first = next(it)
        except StopIteration:
            pending: list[T] = []
        else:
            pending = [first]
        # Known once the sharder has partitioned this epoch (it did, to give the first item).
        expected = index_length(self.source_datapipe, (self.batch_size, self.drop_last))
        for item in itertools.chain(pending, it):
            if stats.yielded == expected:
                stats.dropped += 1  # more than promised: nothing in the plan should do this
                continue
            recent.append(item)
            stats.own += 1
            stats.yielded += 1
            yield item
        stats.exhausted = True
        while stats.yielded < expected:
            if not recent:
                raise WorkerError(
                    "this reader's samples were all skipped; it has nothing to repeat to keep the "
                    "ranks' epoch lengths equal"
                )
            stats.yielded += 1
            yield recent[(stats.yielded - stats.own - 1) % len(recent)]
