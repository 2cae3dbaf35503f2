"""The stage that stands, in the main process, for the part of the graph that runs in workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.datapipes.iter.prefetch import PrefetcherIterDataPipe

__all__ = ["MainPrefetcherIterDataPipe", "WorkerPoolIterDataPipe"]


class WorkerPoolIterDataPipe(StageIterDataPipe[Any]):
    """Yields what the worker processes of a ``MultiProcessingReadingService`` produce.

    Not a user-facing stage: ``MultiProcessingReadingService.initialize`` puts it in the graph
    in place of the part that runs in workers.
    """

    main_process = True

    def __init__(self, source_datapipe: IterDataPipe[Any], service: Any) -> None:
        self.source_datapipe = source_datapipe
        self.service = service

    def __iter__(self) -> Iterator[Any]:
        pool: Iterator[Any] = self.service._iterate_pool()
        return pool


class MainPrefetcherIterDataPipe(PrefetcherIterDataPipe[Any]):
    """``main_prefetch_cnt``'s read-ahead over the worker pool, in the main process."""

    main_process = True
