"""Background prefetching and memory pinning: ``prefetch``, ``pin_memory``."""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter.base import StageIterDataPipe, check_picklable_fn, register

__all__ = ["PinMemoryIterDataPipe", "PrefetcherIterDataPipe"]

T = TypeVar("T")

_ITEM, _END, _ERROR = 0, 1, 2
_POLL = 0.05  # seconds; how often a blocked producer checks whether the consumer left


class _Control:
    """One iteration's producer: stopped, paused, and whether it is reading the source now."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._cond = threading.Condition()
        self._paused = False
        self._reading = False

    def start_read(self) -> bool:
        """Wait while paused; ``False`` once stopped. Else the producer may read one item."""
        with self._cond:
            while self._paused and not self.stop.is_set():
                self._cond.wait(_POLL)
            if self.stop.is_set():
                return False
            self._reading = True
            return True

    def end_read(self) -> None:
        with self._cond:
            self._reading = False
            self._cond.notify_all()

    def pause(self) -> None:
        with self._cond:
            self._paused = True
            while self._reading and not self.stop.is_set():
                self._cond.wait(_POLL)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()


@register("prefetch")
class PrefetcherIterDataPipe(StageIterDataPipe[T]):
    """Read ahead of the consumer in a background thread (functional name: ``prefetch``).

    Keeps up to ``buffer_size`` items ready, so I/O waits (a network read, a slow disk) overlap
    with the work downstream. Errors in the source are re-raised in the consumer, in order.
    Leaving the loop early stops the thread and closes the source.

    Args:
        source_datapipe: The source.
        buffer_size: Items to keep ready. Default: ``10``.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).prefetch(2))
        [0, 1, 2, 3, 4]
    """

    one_to_one = True
    carries_ids = "untouched"  # moves items without looking at them

    def __init__(self, source_datapipe: IterDataPipe[T], buffer_size: int = 10) -> None:
        if buffer_size <= 0:
            raise ValueError(f"buffer_size should be a positive integer, got {buffer_size!r}")
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self._control: _Control | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]
        state["_control"] = None  # the running iteration's thread stays with its process
        return state

    def pause(self) -> None:
        """Stop reading the source (torchdata 0.9): returns once the thread reads no more.

        Items already read stay ready for the consumer; the next iteration starts unpaused.
        """
        control = self._control
        if control is not None:
            control.pause()

    def resume(self) -> None:
        """Read the source again after :meth:`pause`."""
        control = self._control
        if control is not None:
            control.resume()

    def shutdown(self) -> None:
        """Stop the background thread of the current iteration (torchdata 0.9)."""
        control = self._control
        if control is not None:
            control.stop.set()
            control.resume()

    def __iter__(self) -> Iterator[T]:
        q: queue.Queue[tuple[int, Any]] = queue.Queue(self.buffer_size)
        self._control = control = _Control()
        stop = control.stop

        def put(entry: tuple[int, Any]) -> bool:
            while not stop.is_set():
                try:
                    q.put(entry, timeout=_POLL)
                    return True
                except queue.Full:  # noqa: PERF203 - the poll that lets a stopped consumer end us
                    continue
            return False

        def produce() -> None:
            it: Any = None
            try:
                # iter() inside the try: a source whose __iter__ raises at once must reach
                # the consumer, which otherwise waits on the queue forever.
                it = iter(self.source_datapipe)
                while True:
                    if not control.start_read():
                        return
                    try:
                        item = next(it)
                    except StopIteration:
                        break
                    finally:
                        control.end_read()
                    if not put((_ITEM, item)):
                        return
                put((_END, None))
            except BaseException as exc:  # re-raised in the consumer
                put((_ERROR, exc))
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

        thread = threading.Thread(target=produce, name="shardpipes-prefetch", daemon=True)
        thread.start()
        consumer = threading.get_ident()
        try:
            while True:
                kind, value = q.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            stop.set()
            control.resume()
            # An abandoned iteration may be finalised by the garbage collector in any thread,
            # even fsspec's event-loop thread, which a producer reading a remote shard waits
            # on: joining there would deadlock. Elsewhere the producer sees `stop` within a
            # poll interval and ends on its own.
            if threading.get_ident() == consumer:
                thread.join()

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("pin_memory")
class PinMemoryIterDataPipe(StageIterDataPipe[T]):
    """Copy tensors (in nested batches) into pinned memory for faster GPU transfer (functional name: ``pin_memory``).

    Without an accelerator it passes items through unchanged, with one warning, as torch's
    ``DataLoader(pin_memory=True)`` does.

    Args:
        source_datapipe: The source.
        device: Accelerator device to pin for. Default: the current one.
        pin_memory_fn: ``fn(item, device) -> item``. Default: torch's own, which walks dicts,
            lists, tuples and namedtuples.

    Examples:
        >>> import torch
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> [t.shape for t in IterableWrapper([torch.zeros(2)]).pin_memory()]  # doctest: +SKIP
        [torch.Size([2])]
    """

    main_process = True  # pins in the memory of the process that trains

    def __init__(
        self,
        source_datapipe: IterDataPipe[T],
        device: str | None = None,
        pin_memory_fn: Callable[[Any, str | None], Any] | None = None,
    ) -> None:
        if pin_memory_fn is not None:
            check_picklable_fn(pin_memory_fn, "pin_memory_fn")
        self.source_datapipe = source_datapipe
        self.device = device
        self.pin_memory_fn = pin_memory_fn

    def __iter__(self) -> Iterator[T]:
        import torch
        from torch.utils.data._utils.pin_memory import pin_memory

        if self.pin_memory_fn is None and not torch.accelerator.is_available():
            warnings.warn(
                "pin_memory() found no accelerator; items pass through unpinned",
                UserWarning,
                stacklevel=2,
            )
            yield from self.source_datapipe
            return
        fn = self.pin_memory_fn or pin_memory
        for item in self.source_datapipe:
            yield fn(item, self.device)

    def __len__(self) -> int:
        return len(self.source_datapipe)
