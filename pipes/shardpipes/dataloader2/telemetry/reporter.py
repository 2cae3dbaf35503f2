"""A worker's side of telemetry: its figures, attached to one bundle every so often.

Made once per worker process when telemetry is on (and once per lease in a Ray reader actor,
``raypool/reader.py``). The worker's bundle loop (``dataloader2/workers/bundles.py``) calls
:meth:`WorkerReporter.report` once per bundle it sends, with the seconds the bundle's items took
to make; every :data:`EVERY` seconds the call returns a small dict (busy and idle time, CPU per
stage, storage counters) that travels in that bundle to the main process. No message of its
own, nothing per sample.

The storage counters are the process's (``storage/counters.py``). A process where several
graphs report at once (a Ray reader actor runs several logical readers in threads) shares them
out with :class:`SharedStorage`: each byte goes to the one reporter that reports next after it
arrived, so the reporters' totals add up to the process's instead of each counting all of it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.telemetry.sampler import BUDGET, StageSampler, thread_cpu_clock
from shardpipes.storage.counters import COUNTERS

__all__ = ["EVERY", "SharedStorage", "WorkerReporter", "add_storage", "storage_since"]

#: Seconds between two reports of a worker (its first bundle always carries one).
EVERY = 0.2


class SharedStorage:
    """A process's storage counters, shared out among the reporters of the graphs it runs.

    :meth:`claim` returns what was read since the last claim (by any reporter), so each byte,
    stream and retry is claimed once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = COUNTERS.totals()

    def claim(self) -> dict[str, Any]:
        """The process's reads since the last claim: ``bytes_read``, ``opened``, ``closed``, ``retries``."""
        with self._lock:
            now = COUNTERS.totals()
            last, self._last = self._last, now
        return storage_since(now, last)


def add_storage(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add the storage totals ``more`` into ``into`` (both as ``COUNTERS.totals()`` gives them)."""
    for key in ("bytes_read", "opened", "closed"):
        into[key] += more[key]
    for cause, n in more["retries"].items():
        into["retries"][cause] = into["retries"].get(cause, 0) + n


def storage_since(now: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Storage totals ``now`` less ``base`` (both as ``COUNTERS.totals()`` gives them)."""
    retries = {k: v - base["retries"].get(k, 0) for k, v in now["retries"].items()}
    return {
        "bytes_read": now["bytes_read"] - base["bytes_read"],
        "opened": now["opened"] - base["opened"],
        "closed": now["closed"] - base["closed"],
        "retries": {k: v for k, v in retries.items() if v},
    }


class WorkerReporter:
    """Figures of one worker process (or one lease of a reader actor), running totals since it was made.

    Made in the thread that iterates the graph: its CPU and stack samples are that thread's.

    Args:
        datapipe: The worker's graph.
        interval: Seconds between two stack samples; ``None``: no stage figures.
        budget: The stack sampler's CPU budget (:data:`~.sampler.BUDGET`).
        shared: The process's storage counters, when other reporters in the process claim them
            too; ``None``: this reporter is the process's only one, and reports all its reads.
        task_thread: The graph runs in a thread that also runs other code between items (a
            Ray task's): its sampler runs until :meth:`close` (``StageSampler(until_stopped)``).
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        interval: float | None,
        budget: float = BUDGET,
        *,
        shared: SharedStorage | None = None,
        task_thread: bool = False,
    ) -> None:
        self._start = time.perf_counter()
        self._sent = -EVERY
        self._cpu = thread_cpu_clock(threading.get_ident())
        self._cpu0 = self._cpu()
        self._shared = shared
        self._storage0 = COUNTERS.totals()
        self._claimed: dict[str, Any] = {"bytes_read": 0, "opened": 0, "closed": 0, "retries": {}}
        self.busy = 0.0
        self.items = 0
        self.sampler = (
            StageSampler(datapipe, interval, budget=budget, until_stopped=task_thread)
            if interval
            else None
        )
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
        sampler = self.sampler
        return {
            "wall": now - self._start,
            "busy": self.busy,
            "cpu": self._cpu() - self._cpu0,
            "items": self.items,
            "stages": dict(sampler.cpu) if sampler is not None else {},
            "ticks": sampler.ticks if sampler is not None else 0,
            "sampler_cpu": sampler.own_cpu if sampler is not None else 0.0,
            "storage": self._storage(),
        }

    def _storage(self) -> dict[str, Any]:
        if self._shared is None:
            return storage_since(COUNTERS.totals(), self._storage0)
        mine = self._claimed
        add_storage(mine, self._shared.claim())
        return {**mine, "retries": dict(mine["retries"])}

    def close(self) -> None:
        """Stop the stack sampler."""
        if self.sampler is not None:
            self.sampler.stop()
