"""A worker's side of telemetry: its figures, attached to one bundle every so often.

Made once per worker process when telemetry is on. The worker's bundle loop
(``dataloader2/_bundle.py``) calls :meth:`WorkerReporter.report` once per bundle it sends,
with the seconds the bundle's items took to make; every :data:`EVERY` seconds the call returns
a small dict (busy and idle time, CPU per stage, storage counters) that travels in that bundle
to the main process. No message of its own, nothing per sample.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.telemetry.sampler import BUDGET, StageSampler, thread_cpu_clock
from shardpipes.storage.counters import COUNTERS

__all__ = ["EVERY", "WorkerReporter"]

#: Seconds between two reports of a worker (its first bundle always carries one).
EVERY = 0.2


class WorkerReporter:
    """Figures of one worker process, running totals since it was made.

    Args:
        datapipe: The worker's graph.
        interval: Seconds between two stack samples; ``None``: no stage figures.
        budget: The stack sampler's CPU budget (:data:`~.sampler.BUDGET`).
    """

    def __init__(
        self, datapipe: IterDataPipe[Any], interval: float | None, budget: float = BUDGET
    ) -> None:
        self._start = time.perf_counter()
        self._sent = -EVERY
        self._cpu = thread_cpu_clock(threading.get_ident())
        self._cpu0 = self._cpu()
        self._storage0 = COUNTERS.totals()
        self.busy = 0.0
        self.items = 0
        self.sampler = StageSampler(datapipe, interval, budget=budget) if interval else None
        if self.sampler is not None:
            self.sampler.start()  # this thread: the one that iterates the graph

    def report(self, took: float, count: int, last: bool = False) -> dict[str, Any] | None:
        """Take a bundle of ``count`` items made in ``took`` seconds; the figures, when due.

        A report is due every :data:`EVERY` seconds and with the ``last`` bundle of an epoch.
        """
        now = time.perf_counter()
        self.busy += took
        self.items += count
        if now - self._sent < EVERY and not last:
            return None
        self._sent = now
        storage = COUNTERS.totals()
        base = self._storage0
        retries = {
            k: v - base["retries"].get(k, 0)
            for k, v in storage["retries"].items()
            if v - base["retries"].get(k, 0)
        }
        sampler = self.sampler
        return {
            "wall": now - self._start,
            "busy": self.busy,
            "cpu": self._cpu() - self._cpu0,
            "items": self.items,
            "stages": dict(sampler.cpu) if sampler is not None else {},
            "ticks": sampler.ticks if sampler is not None else 0,
            "sampler_cpu": sampler.own_cpu if sampler is not None else 0.0,
            "storage": {
                "bytes_read": storage["bytes_read"] - base["bytes_read"],
                "opened": storage["opened"] - base["opened"],
                "closed": storage["closed"] - base["closed"],
                "retries": retries,
            },
        }

    def close(self) -> None:
        """Stop the stack sampler."""
        if self.sampler is not None:
            self.sampler.stop()
