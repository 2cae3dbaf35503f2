"""``DataLoader2``: iterate a DataPipe graph through a reading service, one epoch per ``iter()``."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Generator, Iterator
from typing import Any, Generic, TypeVar

import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.seeding import SeedGenerator
from shardpipes.dataloader2.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
)
from shardpipes.errors import ShardingWarning

__all__ = ["DataLoader2"]

T = TypeVar("T")


def _uses(rs: ReadingServiceInterface, kind: type) -> bool:
    if isinstance(rs, kind):
        return True
    return isinstance(rs, SequentialReadingService) and any(_uses(r, kind) for r in rs.reading_services)


class DataLoader2(Generic[T]):
    """Run a DataPipe graph with a reading service; each ``iter()`` is one epoch.

    The graph is deep-copied on the first epoch, so the caller's graph is never modified.
    Seeds are deterministic: the default seed is ``0``, each epoch gets a new order, and
    ``dl.seed(s)`` chooses another seed (and restarts the epoch count).

    Args:
        datapipe: The graph.
        reading_service: How to run it. Default: :class:`InProcessReadingService`.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> from shardpipes.dataloader2 import DataLoader2
        >>> with DataLoader2(IterableWrapper(range(6)).shuffle().batch(3)) as dl:
        ...     dl.seed(1)
        ...     first = list(dl)
        ...     dl.seed(1)
        ...     first == list(dl)
        True
    """

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        datapipe_adapter_fn: None = None,
        reading_service: ReadingServiceInterface | None = None,
    ) -> None:
        if datapipe_adapter_fn is not None:
            raise ValueError(
                "datapipe_adapter_fn is not supported; apply the change to the graph before "
                "passing it to DataLoader2"
            )
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"DataLoader2 needs an IterDataPipe, got {type(datapipe).__name__}")
        self.datapipe = datapipe
        self.reading_service = reading_service if reading_service is not None else InProcessReadingService()
        self._seed = 0
        self._epoch = 0
        self._graph: IterDataPipe[T] | None = None
        self._active: Generator[T, None, None] | None = None
        self._closed = False
        if (
            dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
            and not _uses(self.reading_service, DistributedReadingService)
        ):
            warnings.warn(
                f"torch.distributed is initialised with {dist.get_world_size()} ranks but the "
                "reading service has no DistributedReadingService: every rank reads the same data",
                ShardingWarning,
                stacklevel=2,
            )

    def seed(self, seed: int) -> None:
        """Use ``seed`` from the next epoch on, and count epochs from 0 again."""
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed should be a non-negative int, got {seed!r}")
        self._seed = seed
        self._epoch = 0

    def __iter__(self) -> Iterator[T]:
        if self._closed:
            raise RuntimeError("DataLoader2 was shut down; create a new one")
        if self._active is not None:
            self._active.close()  # an abandoned epoch: finalise it before the next begins
            self._active = None
        if self._graph is None:
            self._graph = self.reading_service.initialize(copy.deepcopy(self.datapipe))
        generator = SeedGenerator(self._seed, self._epoch)
        self._epoch += 1
        self._active = self._run(self._graph, generator)
        return self._active

    def _run(self, graph: IterDataPipe[T], generator: SeedGenerator) -> Generator[T, None, None]:
        self.reading_service.initialize_iteration(generator)
        try:
            yield from graph
        finally:
            self.reading_service.finalize_iteration()

    def shutdown(self) -> None:
        """End the current epoch, stop workers and release process groups. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._active is not None:
                self._active.close()
                self._active = None
        finally:
            self.reading_service.finalize()

    def __enter__(self) -> DataLoader2[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
