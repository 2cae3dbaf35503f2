"""Several of a worker's items in one message, dealt out again one by one in the same order.

Each message from a worker costs the two processes about 0.5 ms of CPU whatever it carries
(torch's ``DataLoader`` iterator, its profiler record, the index queue and its feeder thread,
the result queue; docs/performance.md). A batch of 64 small samples costs about 0.6 ms to make,
so one batch per message nearly doubled what a batch cost with workers. A worker now sends a
:class:`Bundle` of up to ``size`` items, and :class:`Interleave`, in the main process, yields
them one at a time in exactly the order one item per message gives: torch's in-order
round-robin, worker 0's next item, worker 1's, ..., a worker leaving the rotation when its
epoch ends. The order, and so checkpoints, resume arithmetic (plan/resume.py) and
``verify``'s replay, do not depend on how items were bundled.

How many items a bundle holds is decided by the main process and read by every worker from
shared memory before each bundle it starts (:attr:`EpochSlot.bundle
<shardpipes.dataloader2.workers.dataset.EpochSlot>`). It starts at 1 and only grows within an epoch,
to the smallest power of two of items that take a worker about :data:`BUNDLE_SECONDS` to make
(so the message's own cost is a few percent of the work it carries), and no more than hold
:data:`BUNDLE_BYTES` in shared memory (heavy batches, decoded images, go one per message as
before). What an item takes to make is the worker's average over its epoch so far, its
first bundle left out: a shuffle buffer makes the first batch of an epoch dear and the last
ones nearly free.
The same size for every worker matters: torch deals out messages round-robin, so a worker
whose bundles were larger than another's would pile up items in the main process; while the
size grows, workers may read it a bundle apart, which leaves at most :data:`MAX_BUNDLE` items
of one worker waiting in the main process.

What a worker's stages skipped under handlers travels in the bundle, attached to the item
after which it changed, and the main process takes it in as it yields that item: the counts
a checkpoint records are those of the items the training loop has seen.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory

from shardpipes.dataloader2.workers.attachments import Attachments, Reader
from shardpipes.dataloader2.workers.messages import AsIs, Entry, Values
from shardpipes.dataloader2.workers.packed import Packed
from shardpipes.dataloader2.workers.ring import Ring

__all__ = ["BUNDLE_BYTES", "BUNDLE_SECONDS", "MAX_BUNDLE", "Bundle", "Interleave", "bundles"]

#: A bundle grows until its items take a worker about this long to make (wall time).
BUNDLE_SECONDS = 0.01
#: ... and while its items take at most this much shared memory. Each of a worker's
#: ``worker_prefetch_cnt + 2`` blocks is filled up to this, and its pages stay in memory (in the
#: worker's and the main process's resident size): about 8 MB a worker by default.
BUNDLE_BYTES = 2 << 20
#: Items in a bundle at most.
MAX_BUNDLE = 16


class Bundle:
    """Up to ``size`` consecutive items of one worker's epoch, as one message.

    Attributes:
        worker: The worker that made them.
        payload: The items, as :meth:`Ring.pack <shardpipes.dataloader2.workers.ring.Ring.pack>`
            made them (a list of ``count`` items once unpacked).
        count: How many items.
        skips: ``(n, counters)``: after its first ``n`` items, the worker's skip counters
            were ``counters`` (a :func:`~shardpipes.dataloader2._stats.skips_to_dict`); only
            where they changed.
        end: The worker's drop totals, when its epoch ends after these items; else ``None``.
        error: The error its graph raised after these items (then no more come); else ``None``.
        cost: Seconds an item took the worker to make, on average over its epoch so far (but
            for its first bundle, which pays for filling the graph's buffers: a shuffle buffer
            of 1,000 samples makes the first batch cost what 16 do).
        nbytes: Bytes the items took in shared memory or are read from their shards; ``-1``
            when they were sent otherwise (through torch's queue).
        figures: The worker's telemetry report, every so often when telemetry is on
            (``dataloader2/telemetry/reporter.py``); else ``None``.
        fetch: The worker's fetch figures (``storage.pool.fetch_figures``), when they changed
            since its last bundle; else ``None``.
    """

    __slots__ = (
        "cost",
        "count",
        "end",
        "error",
        "fetch",
        "figures",
        "nbytes",
        "payload",
        "skips",
        "worker",
    )

    def __init__(
        self,
        worker: int,
        payload: Any,
        count: int,
        skips: list[tuple[int, dict[str, Any]]],
        end: list[list[Any]] | None,
        error: ExceptionWrapper | None,
        cost: float,
        nbytes: int,
        figures: dict[str, Any] | None = None,
        fetch: dict[str, Any] | None = None,
    ) -> None:
        self.worker = worker
        self.payload = payload
        self.count = count
        self.skips = skips
        self.end = end
        self.error = error
        self.cost = cost
        self.nbytes = nbytes
        self.figures = figures
        self.fetch = fetch

    def _args(self) -> tuple[Any, ...]:
        return (
            self.worker,
            self.payload,
            self.count,
            self.skips,
            self.end,
            self.error,
            self.cost,
            self.nbytes,
            self.figures,
            self.fetch,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Bundle, self._args())

    def pin_memory(self) -> Bundle:
        """The bundle with its tensors pinned (torch's pin thread calls this)."""
        payload = self.payload
        if type(payload) is Packed:  # what is not pickled may hold tensors (or skeletons do)
            entries = [_pinned(e) for e in payload.entries]
            # The pinned copy is what will be read: it, not the copy dropped here, gives the
            # block back if it is dropped unread.
            payload = payload.with_entries(entries)
        else:
            payload = _pin(payload)
        return Bundle(self.worker, payload, *self._args()[2:])


def bundles(
    worker: int,
    items: Iterator[Any],
    size: np.ndarray,
    ring: Ring | None,
    skip_total: Callable[[], int],
    skip_state: Callable[[], dict[str, Any]],
    end: Callable[[], list[list[Any]]],
    report: Callable[[float, int, bool], dict[str, Any] | None] | None = None,
    fetch: Callable[[], dict[str, Any] | None] | None = None,
) -> Iterator[Bundle]:
    """A worker's epoch (``items``) in bundles of ``size[0]`` items (read before each bundle).

    ``skip_total`` is a cheap sum of the worker's skip counters, read after every item;
    ``skip_state`` their full form, made only when the sum moved; ``end`` the worker's drop
    totals at the end of its epoch. An error of the graph ends the epoch's last bundle: the
    items made before it are sent, then the error (as torch's worker loop would send it).
    ``report``: telemetry's worker side (when on), given each bundle's making time and size.
    ``fetch``: the worker's fetch figures when they changed since the last call, else ``None``.
    """
    seen = skip_total()
    made, spent = -1, 0.0
    while True:
        want = int(size[0])
        out: list[Any] = []
        skips: list[tuple[int, dict[str, Any]]] = []
        ended: list[list[Any]] | None = None
        error: ExceptionWrapper | None = None
        start = time.perf_counter()
        try:
            for _ in range(want):
                item = next(items)
                # Into its block form at once: a pickled batch can be freed now.
                out.append(item if ring is None else ring.prepare(item))
                del item
                total = skip_total()
                if total != seen:
                    seen = total
                    skips.append((len(out), skip_state()))
        except StopIteration:
            ended = end()
        except Exception:
            # as torch's worker loop wraps an error, to be raised in the main process
            error = ExceptionWrapper(where=f"in DataLoader worker process {worker}")  # type: ignore[no-untyped-call]
        if ended is not None or error is not None:
            total = skip_total()
            if total != seen:
                skips.append((len(out), skip_state()))
        took = time.perf_counter() - start
        if made < 0:  # the epoch's first bundle pays for filling buffers: not in the average
            made, cost = 0, took / max(len(out), 1)
        else:
            made += len(out)
            spent += took
            cost = spent / max(made, 1)
        payload: Any = out
        nbytes = -1
        if ring is not None:
            payload = ring.seal(out)
            nbytes = ring.packed_bytes
        figures = report(took, len(out), ended is not None) if report is not None else None
        learnt = fetch() if fetch is not None else None
        yield Bundle(worker, payload, len(out), skips, ended, error, cost, nbytes, figures, learnt)
        if ended is not None or error is not None:
            return


def _pin(x: Any) -> Any:
    return pin_memory(x)  # type: ignore[no-untyped-call]


def _pinned(entry: Entry) -> Entry:
    """``entry`` with its tensors pinned (those pickled, or in a block, have none to pin)."""
    if type(entry) is AsIs:
        return AsIs(_pin(entry.item))
    if type(entry) is Values:
        return Values(_pin(entry.skeleton), entry.spans)
    return entry


class _Item:
    __slots__ = ("i", "reader")

    def __init__(self, reader: Reader, i: int) -> None:
        self.reader = reader
        self.i = i


class _Skips:
    __slots__ = ("state",)

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state


class _End:
    __slots__ = ("flows",)

    def __init__(self, flows: list[list[Any]]) -> None:
        self.flows = flows


class _Raise:
    __slots__ = ("error",)

    def __init__(self, error: ExceptionWrapper) -> None:
        self.error = error


class Interleave:
    """The main process's side: one item at a time, in the round-robin order of the workers.

    ``size`` is the shared bundle size the workers read; :meth:`items` grows it as the
    bundles that arrive show it is cheap (see the module doc), unless ``grow`` is false: a
    loader with a ``timeout`` waits that long for each item, and a bundle made of 16 items
    that became slow mid-epoch would take 16 times as long. ``attached`` reads the items out
    of the workers' shared-memory blocks, each when its turn comes.
    """

    def __init__(self, size: np.ndarray, attached: Attachments, *, grow: bool = True) -> None:
        self.size = size
        self.attached = attached
        self.grow = grow  # False: one item per message (a loader with a timeout per item)
        self.skips: dict[int, dict[str, Any]] = {}  # each worker's skip counters, as yielded
        self.flows: dict[int, list[list[Any]]] = {}  # each worker's drop totals at its end
        self.fetch: dict[int, dict[str, Any]] = {}  # each worker's fetch figures, the latest
        self._next = 1  # the size the last bundles asked for: the next epoch starts there
        self._last = 1
        #: Telemetry's ``take(worker, figures, items ready)``, when it is on.
        self.watch: Callable[[int, dict[str, Any], int], None] | None = None

    def start_epoch(self) -> None:
        """Set the size the workers start the next epoch with (what the last one reached)."""
        self.size[0] = self._next

    def items(self, messages: Iterator[Bundle], workers: int) -> Iterator[Any]:
        """Yield the items of ``messages`` (torch's loader over the workers) in order."""
        queues: list[deque[Any]] = [deque() for _ in range(workers)]
        rotation = deque(range(workers))
        while rotation:
            worker = rotation[0]
            queue = queues[worker]
            while not queue:
                self._take(next(messages, None), queues)
            head = queue.popleft()
            kind = type(head)
            if kind is _Item:
                head = head.reader.load(head.i)
                kind = type(head)
            elif kind is _End:
                self.flows[worker] = head.flows
                rotation.popleft()
                continue
            elif kind is _Raise:
                head.error.reraise()
            elif kind is _Skips:
                self.skips[worker] = head.state
                continue
            while queue and type(queue[0]) is _Skips:  # counters as of this item
                self.skips[worker] = queue.popleft().state
            rotation.rotate(-1)
            yield head
        extra = next(messages, None)
        if extra is not None:
            raise RuntimeError(f"a worker sent {type(extra).__name__} after its epoch ended")

    def _take(self, bundle: Bundle | None, queues: list[deque[Any]]) -> None:
        if bundle is None:
            raise RuntimeError(
                "the worker pool stopped before every worker had ended its epoch; please report this"
            )
        queue = queues[bundle.worker]
        if bundle.figures is not None and self.watch is not None:
            self.watch(bundle.worker, bundle.figures, len(queue))
        if bundle.fetch is not None:
            self.fetch[bundle.worker] = bundle.fetch
        payload = bundle.payload
        items: Any
        if type(payload) is Packed:
            reader = self.attached.reader(payload)
            items = [_Item(reader, i) for i in range(bundle.count)]
        else:
            items = payload
        if bundle.skips:
            at = 0
            for n, state in bundle.skips:
                queue.extend(items[at:n])
                queue.append(_Skips(state))
                at = n
            queue.extend(items[at:])
        else:
            queue.extend(items)
        if bundle.error is not None:
            queue.append(_Raise(bundle.error))
        elif bundle.end is not None:
            queue.append(_End(bundle.end))
        self._grow(bundle)

    def _grow(self, bundle: Bundle) -> None:
        """Raise the shared size when this bundle and the one before say items are cheap."""
        if bundle.count == 0 or bundle.end is not None or not self.grow:
            return  # an epoch's last bundle is often short
        want = 1
        if bundle.nbytes >= 0:
            nbytes = bundle.nbytes / bundle.count
            while (
                want < MAX_BUNDLE
                and want * bundle.cost < BUNDLE_SECONDS
                and 2 * want * nbytes <= BUNDLE_BYTES
            ):
                want *= 2
        agreed = min(want, self._last)  # two bundles in a row: one fast one is not enough
        self._last = want
        self._next = agreed
        if agreed > self.size[0]:
            self.size[0] = agreed
