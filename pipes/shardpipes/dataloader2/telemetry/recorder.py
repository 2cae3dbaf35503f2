"""The main process's side of telemetry: what the training loop waited, and the workers' reports.

:class:`Telemetry` is made by :meth:`DataLoader2.watch
<shardpipes.dataloader2.DataLoader2.watch>`. The loader runs each epoch's items through
:meth:`Telemetry.batches` (the one hook where a batch is handed to the training loop), the
worker pool hands it each report a worker attached to a bundle (:meth:`Telemetry.take`), and
:meth:`Telemetry.snapshot` adds everything up into one :class:`~.snapshot.Snapshot`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.telemetry.names import stage_labels
from shardpipes.dataloader2.telemetry.reporter import add_storage, storage_since
from shardpipes.dataloader2.telemetry.sampler import BUDGET, StageSampler
from shardpipes.dataloader2.telemetry.snapshot import (
    Snapshot,
    StageCost,
    StorageFigures,
    WorkerFigures,
)
from shardpipes.storage.counters import COUNTERS

__all__ = ["DEFAULT_INTERVAL", "Telemetry", "count_samples"]

#: Seconds between two stack samples of a process (docs/telemetry.md: the cost it was measured at).
DEFAULT_INTERVAL = 0.01


def count_samples(item: Any) -> int:
    """The samples in a batch: a list's length, or the first dimension of a collated batch's first tensor."""
    if isinstance(item, list):
        return len(item)
    first = item
    if isinstance(item, Mapping):
        first = next(iter(item.values()), None)
    elif isinstance(item, tuple) and item:
        first = item[0]
    if isinstance(first, torch.Tensor | np.ndarray) and first.ndim:
        return int(first.shape[0])
    if isinstance(first, list):
        return len(first)
    return 1


class Telemetry:
    """Figures of one loader on one rank while it runs; :meth:`snapshot` gives them.

    Args:
        interval: Seconds between two samples of a process's stack for the CPU per stage (at
            most; longer when the budget says so); ``None``: no stage figures (wait,
            throughput, workers and storage only).
        budget: Each sampler's own CPU stays under this share of the CPU it samples.
        skipped: Returns what error handlers skipped so far (the loader's count).
    """

    def __init__(
        self,
        interval: float | None = DEFAULT_INTERVAL,
        *,
        budget: float = BUDGET,
        skipped: Callable[[], int] | None = None,
    ) -> None:
        if interval is not None and interval <= 0:
            raise ValueError(
                f"interval should be a positive number of seconds or None, got {interval!r}"
            )
        self.interval = interval
        self.budget = budget
        self._skipped = skipped
        self._start: float | None = None
        self._batches = 0
        self._samples = 0
        self._wait = 0.0
        self._marks = 0
        self._first_mark = self._last_mark = 0.0
        self._wait_at_first = self._wait_at_last = 0.0
        self._workers: dict[int, tuple[dict[str, Any], int]] = {}
        self._sampler: StageSampler | None = None
        self._storage0 = COUNTERS.totals()
        self._lock = threading.Lock()

    # -- hooks --

    def batches(self, items: Iterator[Any], graph: IterDataPipe[Any] | None) -> Iterator[Any]:
        """``items`` as they are, timing each wait for the next one (the loader's one hook)."""
        clock = time.perf_counter
        if self._start is None:
            self._start = clock()
        batched = graph is not None and any("batch" in n for n in stage_labels(graph).values())
        sampler = self._sampler
        if sampler is None and self.interval is not None and graph is not None:
            sampler = self._sampler = StageSampler(
                graph, self.interval, inside=Telemetry.batches.__code__, budget=self.budget
            )
        while True:
            began = clock()
            try:
                item = next(items)
            except StopIteration:
                return
            self._wait += clock() - began
            self._batches += 1
            self._samples += count_samples(item) if batched else 1
            if sampler is not None and self._batches == 1:
                # Started once the first item is here: the worker processes are forked by then.
                sampler.start()
            yield item

    def step(self) -> None:
        """Mark where a training step ends (and the next begins); ``LightningLoader.step()`` calls it."""
        now = time.perf_counter()
        if not self._marks:
            self._first_mark, self._wait_at_first = now, self._wait
        self._last_mark, self._wait_at_last = now, self._wait
        self._marks += 1

    def take(self, worker: int, figures: dict[str, Any], depth: int) -> None:
        """A worker's report (from a bundle), and its items ready in this process when it came."""
        with self._lock:
            self._workers[worker] = (figures, depth)

    def close(self) -> None:
        """Stop this process's stack sampler."""
        if self._sampler is not None:
            self._sampler.stop()

    # -- the figures --

    def snapshot(self) -> Snapshot:
        """Everything measured so far on this rank (running totals; see :class:`Snapshot`)."""
        now = time.perf_counter()
        with self._lock:
            reports = sorted(self._workers.items())
        stages: dict[tuple[str, str], float] = {}
        workers = []
        storage = storage_since(COUNTERS.totals(), self._storage0)
        ticks, sampler_cpu = 0, 0.0
        for worker, (fig, depth) in reports:
            for name, cpu in fig["stages"].items():
                stages[(name, "workers")] = stages.get((name, "workers"), 0.0) + cpu
            ticks += fig["ticks"]
            sampler_cpu += fig["sampler_cpu"]
            workers.append(
                WorkerFigures(worker, fig["wall"], fig["busy"], fig["cpu"], fig["items"], depth)
            )
            add_storage(storage, fig["storage"])
        if self._sampler is not None:
            for name, cpu in dict(self._sampler.cpu).items():
                stages[(name, "main")] = stages.get((name, "main"), 0.0) + cpu
            ticks += self._sampler.ticks
            sampler_cpu += self._sampler.own_cpu
        distributed = dist.is_available() and dist.is_initialized()
        steps = max(self._marks - 1, 0)
        return Snapshot(
            rank=dist.get_rank() if distributed else 0,
            world_size=dist.get_world_size() if distributed else 1,
            time=time.time(),
            elapsed=now - self._start if self._start is not None else 0.0,
            batches=self._batches,
            samples=self._samples,
            wait=self._wait,
            steps=steps,
            step_time=self._last_mark - self._first_mark if steps else 0.0,
            step_wait=self._wait_at_last - self._wait_at_first if steps else 0.0,
            skipped=self._skipped() if self._skipped is not None else 0,
            stages=tuple(
                sorted(
                    (StageCost(name, cpu, where) for (name, where), cpu in stages.items()),
                    key=lambda s: -s.cpu,
                )
            ),
            workers=tuple(workers),
            storage=StorageFigures(
                storage["bytes_read"], storage["opened"], storage["closed"], storage["retries"]
            ),
            ticks=ticks,
            sampler_cpu=sampler_cpu,
        )
