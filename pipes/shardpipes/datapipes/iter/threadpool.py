"""Map a function over items with a thread pool, keeping order (functional name: ``threadpool_map``)."""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable, Iterator, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import validate_input_col

from shardpipes.datapipes.iter.base import StageIterDataPipe, check_picklable_fn, register

__all__ = ["ThreadPoolMapperIterDataPipe"]


@register("threadpool_map")
class ThreadPoolMapperIterDataPipe(StageIterDataPipe[Any]):
    """Apply ``fn`` to each item in a pool of threads, yielding results in input order (functional name: ``threadpool_map``).

    Useful when ``fn`` releases the GIL (I/O, image decoding in C, numpy). At most
    ``scheduled_tasks`` items are in flight; an exception in ``fn`` is raised at that item's
    position. Leaving the loop early cancels what was not started and waits for the rest.

    Args:
        source_datapipe: The source.
        fn: A module-level function (it must pickle to worker processes).
        input_col: Apply ``fn`` to this key/index of each item and put the result back there
            (or into ``output_col``); a list/tuple of them passes several arguments, and the
            result replaces the first (the others are removed), as torch's ``map`` does.
            Default: the whole item.
        output_col: Where to put the result when ``input_col`` is given; ``-1`` appends it.
            Default: ``input_col``.
        scheduled_tasks: Items in flight at most. Default: ``128``.
        max_workers: Threads. Default: ``min(32, cpu count + 4)`` as ``ThreadPoolExecutor``.
        **threadpool_kwargs: Passed to ``ThreadPoolExecutor`` (for example ``initializer=``).

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["a", "bb"]).threadpool_map(len))
        [1, 2]
    """

    one_to_one = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        fn: Callable[[Any], Any],
        input_col: Any = None,
        output_col: Any = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> None:
        check_picklable_fn(fn, "threadpool_map fn")
        validate_input_col(fn, input_col)  # torchdata 0.9: a wrong arity fails at construction
        if scheduled_tasks <= 0:
            raise ValueError(
                f"scheduled_tasks should be a positive integer, got {scheduled_tasks!r}"
            )
        if output_col is not None and input_col is None:
            raise ValueError("output_col needs input_col")
        if isinstance(output_col, list | tuple):
            if len(output_col) != 1:
                raise ValueError(
                    f"output_col should be a single-element list or tuple, got {output_col!r}"
                )
            output_col = output_col[0]
        self.source_datapipe = source_datapipe
        self.fn = fn
        self.input_col = input_col
        self.output_col = output_col
        self.scheduled_tasks = scheduled_tasks
        self.max_workers = max_workers
        self.threadpool_kwargs = {"thread_name_prefix": "shardpipes-map", **threadpool_kwargs}

    def _apply(self, item: Any) -> Any:
        # Same column semantics as torch's Mapper, but on a copy: items are shared with the
        # source (and other threads), so they are never modified in place.
        in_col, out_col = self.input_col, self.output_col
        if in_col is None:
            return self.fn(item)
        several = isinstance(in_col, list | tuple)
        out = self.fn(*(item[c] for c in in_col)) if several else self.fn(item[in_col])
        result = list(item) if isinstance(item, tuple) else copy.copy(item)
        if out_col is None and several:
            result[in_col[0]] = out
            for c in sorted(in_col[1:], reverse=True):
                del result[c]
        elif out_col == -1 and isinstance(result, list):
            result.append(out)
        else:
            result[in_col if out_col is None else out_col] = out
        return tuple(result) if isinstance(item, tuple) else result

    def __iter__(self) -> Iterator[Any]:
        pending: collections.deque[Future[Any]] = collections.deque()
        pool = ThreadPoolExecutor(self.max_workers, **self.threadpool_kwargs)
        consumer = threading.get_ident()
        try:
            for item in self.source_datapipe:
                pending.append(pool.submit(self._apply, item))
                if len(pending) >= self.scheduled_tasks:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()
            # An abandoned iteration may be finalised by the garbage collector in any thread,
            # even inside threading's own locks (a collection that starts in a new thread's
            # bootstrap, which holds the lock that joining a thread takes: a deadlock, seen in
            # tests/test_guarantees.py). There the workers are told to stop and end on their
            # own; the consumer's thread waits for them, as before.
            pool.shutdown(wait=threading.get_ident() == consumer, cancel_futures=True)

    def __len__(self) -> int:
        if isinstance(self.source_datapipe, Sized):
            return len(self.source_datapipe)
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
