"""A reading service written outside the package, against the public protocol only.

It runs ``num_threads`` readers per rank in threads of the rank's process (ranks from
``torch.distributed`` when it is initialised). It answers the loader's questions
(``topology``, ``share_seed``, ``collectives``) and seeds and shards each reader's copy of the
graph the way the protocol says (``docs/reading-services.md``); nothing in ``DataLoader2`` knows
it. Its readers yield in turn, as the worker pool does, so its states resume under
``MultiProcessingReadingService(num_workers=num_threads)`` and the other way round.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph_settings import apply_sharding

from shardpipes.dataloader2 import ReadingServiceInterface
from shardpipes.dataloader2.graph import apply_epoch_plan
from shardpipes.dataloader2.protocol import Collectives, EpochPlan, Topology
from shardpipes.dataloader2.reading_service import takes_plan

_DONE = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ThreadReadingService(ReadingServiceInterface):
    """``num_threads`` readers per rank, each a thread iterating its own copy of the graph."""

    def __init__(self, num_threads: int = 2, *, timeout: float = 60.0) -> None:
        self.num_threads = num_threads
        self.timeout = timeout
        self._readers: list[IterDataPipe[Any]] = []

    # --- what the service is -------------------------------------------------------------

    def topology(self) -> Topology:
        if dist.is_available() and dist.is_initialized():
            return Topology(dist.get_world_size(), self.num_threads, True, dist.get_rank())
        return Topology(1, self.num_threads, False)

    def share_seed(self, seed: int) -> int:
        if self.topology().ranks == 1:
            return seed
        t = torch.tensor([seed], dtype=torch.int64)
        dist.broadcast(t, src=0)
        return int(t.item())

    def collectives(self) -> Collectives | None:
        return Collectives(None, self.timeout) if self.topology().distributed else None

    # --- the four call times -------------------------------------------------------------

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        top = self.topology()
        for worker in range(self.num_threads):
            reader = copy.deepcopy(datapipe)
            if top.distributed:
                apply_sharding(reader, top.ranks, top.rank, SHARDING_PRIORITIES.DISTRIBUTED)
            apply_sharding(reader, self.num_threads, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
            self._readers.append(reader)
        return _Deal(self)

    @takes_plan  # handed the epoch's EpochPlan (not torchdata 0.9's SeedGenerator facade)
    def initialize_iteration(self, seed_generator: Any, iter_reset_fn: Any = None) -> Any:
        plan: EpochPlan = seed_generator
        top = self.topology()
        rank_plan = plan.spawn(top.rank) if top.distributed else plan
        for worker, reader in enumerate(self._readers):
            apply_epoch_plan(reader, rank_plan.spawn(worker))
        return rank_plan

    def items(self) -> Iterator[Any]:
        """The readers' items in turn; a reader leaves the rotation when it has none left."""
        stop = threading.Event()
        queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=4) for _ in self._readers]
        threads = [
            threading.Thread(target=_read, args=(r, q, stop), daemon=True)
            for r, q in zip(self._readers, queues, strict=True)
        ]
        for t in threads:
            t.start()
        try:
            alive = list(queues)
            while alive:
                still = []
                for q in alive:
                    item = q.get(timeout=self.timeout)
                    if item is _DONE:
                        continue
                    if isinstance(item, _Failed):
                        raise item.exc
                    still.append(q)
                    yield item
                alive = still
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=self.timeout)


def _read(reader: IterDataPipe[Any], out: queue.Queue[Any], stop: threading.Event) -> None:
    def put(value: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(value, timeout=0.05)
                return True
            except queue.Full:  # noqa: PERF203 - wait in short steps, to see stop
                continue
        return False

    try:
        for item in reader:
            if not put(item):
                return
        put(_DONE)
    except BaseException as exc:  # handed to the main thread, raised there
        put(_Failed(exc))


class _Deal(IterDataPipe[Any]):
    """The graph the loader iterates: the readers' items, dealt in turn."""

    def __init__(self, service: ThreadReadingService) -> None:
        self.service = service

    def __iter__(self) -> Iterator[Any]:
        return self.service.items()
