"""The iterator of one epoch of a ``DataLoader2`` (torchdata 0.9's ``DataLoader2Iterator``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from shardpipes.dataloader2.error import PauseIteration

__all__ = ["DataLoader2Iterator"]

T = TypeVar("T")


class DataLoader2Iterator(Iterator[T]):
    """The iterator of one epoch of a :class:`DataLoader2` (torchdata 0.9's).

    Only the newest iterator of a loader is valid: ``next()`` on an older one raises
    ``RuntimeError``. Other attributes are those of the graph's own iterator.
    """

    def __init__(self, dataloader: Any, iterator_id: int) -> None:
        self.dataloader = dataloader
        self.iterator_id = iterator_id
        self.limit_counter: int | None = None
        self.limit_threshold: int | None = None

    def __next__(self) -> T:
        dl = self.dataloader
        if self.iterator_id != dl.valid_iterator_id or dl._active is None:
            if self.iterator_id != dl.valid_iterator_id:
                raise RuntimeError(
                    "This iterator has been invalidated because another iterator has been created "
                    "from the same DataLoader2"
                )
            raise StopIteration
        if dl._is_paused:
            raise PauseIteration  # ends this loop; the epoch continues after resume()
        item: T = next(dl._active)
        if dl._consumer is not None:  # Lightning's fetcher: its state after each batch (_consumers)
            dl._consumer.handed_out(dl._state())
        if self.limit_threshold is not None:
            self.limit_counter = (self.limit_counter or 0) + 1
            if self.limit_counter >= self.limit_threshold:
                self._pause()
        return item

    def _pause(self) -> None:
        self.dataloader._pause()
        self.limit_counter = 0

    def resume(self) -> None:
        """Continue after a pause (:meth:`limit` reached, or ``DataLoader2._pause()``)."""
        self.dataloader._resume()

    def limit(self, num_batches: int | None) -> None:
        """Pause after ``num_batches`` more items; ``None`` removes the limit.

        Counted from now, and again after each ``resume()``. A paused iterator ends its
        ``for`` loop; ``resume()`` continues the same epoch.
        """
        self.limit_counter = 0
        self.limit_threshold = num_batches

    def __getattr__(self, name: str) -> Any:
        dl = self.__dict__.get("dataloader")
        if dl is None or dl._datapipe_iter is None:
            raise AttributeError(name)
        return getattr(dl._datapipe_iter, name)
