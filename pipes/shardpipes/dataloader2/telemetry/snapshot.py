"""What the loader measured so far on one rank, as one frozen value (``Telemetry.snapshot()``).

Every figure is a running total since telemetry started, so two snapshots give the figures of
the time between them (:meth:`Snapshot.since`), which is what the sinks log at each interval.
Rates and shares are properties computed from the totals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["Snapshot", "StageCost", "StorageFigures", "WorkerFigures"]


@dataclasses.dataclass(frozen=True)
class StageCost:
    """CPU seconds sampled in one stage, summed over the processes that run it.

    ``where``: ``"workers"`` or ``"main"`` (the process that iterates the loader).
    """

    name: str
    cpu: float
    where: str


@dataclasses.dataclass(frozen=True)
class WorkerFigures:
    """One worker process, as of its latest report.

    Attributes:
        worker: Its number.
        wall: Seconds since it started reporting.
        busy: Of those, seconds spent making items (its stages running, waits on storage
            included); the rest it spent sending them and waiting to be asked for more.
        cpu: CPU seconds of the thread that runs its stages.
        items: Items (batches) it made.
        depth: Its items ready in the main process when its latest report arrived.
    """

    worker: int
    wall: float
    busy: float
    cpu: float
    items: int
    depth: int

    @property
    def idle(self) -> float:
        """Seconds not making items: sending them, and waiting to be asked for more."""
        return self.wall - self.busy

    @property
    def busy_share(self) -> float:
        """``busy / wall`` (0 before the first report)."""
        return self.busy / self.wall if self.wall > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class StorageFigures:
    """Reads from storage by this rank's processes (``storage/counters.py``)."""

    bytes_read: int = 0
    opened: int = 0
    closed: int = 0
    retries: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def open_streams(self) -> int:
        """Remote streams open now."""
        return self.opened - self.closed


def _minus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One rank's loader figures: running totals since telemetry started.

    Attributes:
        rank: This rank (0 without ``torch.distributed``).
        world_size: Ranks.
        time: When it was taken (``time.time()``).
        elapsed: Seconds since the first batch was asked for.
        batches: Items handed to the training loop (batches, usually).
        samples: Samples in them (a batch counts its length).
        wait: Seconds the training loop waited inside ``next()`` for them.
        steps: Steps marked by ``step()`` (``LightningLoader.step()`` marks each).
        step_time: Seconds from the first marked step to the last.
        step_wait: Of the batch waits, the seconds that fell within those steps.
        skipped: Samples and shards skipped by error handlers.
        stages: Sampled CPU per stage, costliest first (empty when sampling is off).
        workers: One entry per worker process that has reported.
        storage: Bytes, streams and retries of this rank's processes.
        ticks: Stack samples the stage figures rest on.
        sampler_cpu: CPU seconds the stack samplers themselves used (what sampling costs).
    """

    rank: int = 0
    world_size: int = 1
    time: float = 0.0
    elapsed: float = 0.0
    batches: int = 0
    samples: int = 0
    wait: float = 0.0
    steps: int = 0
    step_time: float = 0.0
    step_wait: float = 0.0
    skipped: int = 0
    stages: tuple[StageCost, ...] = ()
    workers: tuple[WorkerFigures, ...] = ()
    storage: StorageFigures = StorageFigures()
    ticks: int = 0
    sampler_cpu: float = 0.0

    # -- derived figures --

    @property
    def wait_share(self) -> float:
        """Share of step time the loop waited for data: per marked step when steps are marked, else of all time."""
        if self.steps and self.step_time > 0:
            return min(self.step_wait / self.step_time, 1.0)
        return min(self.wait / self.elapsed, 1.0) if self.elapsed > 0 else 0.0

    @property
    def wait_per_batch(self) -> float:
        """Seconds waited per batch."""
        return self.wait / self.batches if self.batches else 0.0

    @property
    def wait_per_step(self) -> float:
        """Seconds waited per marked step (per batch when no step is marked)."""
        return self.step_wait / self.steps if self.steps else self.wait_per_batch

    @property
    def samples_per_s(self) -> float:
        """Samples handed out per second."""
        return self.samples / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches handed out per second."""
        return self.batches / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Bytes read from storage per second."""
        return self.storage.bytes_read / self.elapsed if self.elapsed > 0 else 0.0

    def _key(self, stage: StageCost) -> str:
        # With workers, the main process's stages are told apart: "main:(loader)".
        split = stage.where == "main" and any(s.where == "workers" for s in self.stages)
        return f"main:{stage.name}" if split else stage.name

    def stage_share(self, where: str | None = None) -> dict[str, float]:
        """Each stage's share of the sampled CPU (of the workers', or the main process's, or all)."""
        costs = [s for s in self.stages if where is None or s.where == where]
        total = sum(s.cpu for s in costs)
        return {self._key(s): s.cpu / total for s in costs} if total > 0 else {}

    @property
    def sampler_share(self) -> float:
        """What sampling costs: the samplers' CPU over the CPU they sampled."""
        sampled = sum(s.cpu for s in self.stages)
        return self.sampler_cpu / sampled if sampled > 0 else 0.0

    def stage_us_per_sample(self) -> dict[str, float]:
        """Each stage's sampled CPU per sample handed out, in microseconds.

        With workers, the main process's stages are named ``main:<stage>``.
        """
        if not self.samples:
            return {}
        return {self._key(s): 1e6 * s.cpu / self.samples for s in self.stages}

    # -- between two snapshots --

    def since(self, earlier: Snapshot | None) -> Snapshot:
        """The figures of the time between ``earlier`` (a snapshot of the same telemetry) and this."""
        if earlier is None:
            return self
        before = {(s.name, s.where): s.cpu for s in earlier.stages}
        stages = sorted(
            (StageCost(s.name, s.cpu - before.get((s.name, s.where), 0.0), s.where)
             for s in self.stages),
            key=lambda s: -s.cpu,
        )  # fmt: skip
        old = {w.worker: w for w in earlier.workers}
        workers = []
        for w in self.workers:
            o = old.get(w.worker)
            if o is None or o.wall > w.wall:  # a worker started again: its totals restarted
                workers.append(w)
                continue
            workers.append(
                WorkerFigures(
                    w.worker, w.wall - o.wall, w.busy - o.busy, w.cpu - o.cpu,
                    w.items - o.items, w.depth,
                )
            )  # fmt: skip
        a, b = self.storage, earlier.storage
        storage = StorageFigures(
            a.bytes_read - b.bytes_read, a.opened - b.opened, a.closed - b.closed,
            _minus(a.retries, b.retries),
        )  # fmt: skip
        return Snapshot(
            rank=self.rank,
            world_size=self.world_size,
            time=self.time,
            elapsed=self.elapsed - earlier.elapsed,
            batches=self.batches - earlier.batches,
            samples=self.samples - earlier.samples,
            wait=self.wait - earlier.wait,
            steps=self.steps - earlier.steps,
            step_time=self.step_time - earlier.step_time,
            step_wait=self.step_wait - earlier.step_wait,
            skipped=self.skipped - earlier.skipped,
            stages=tuple(stages),
            workers=tuple(workers),
            storage=storage,
            ticks=self.ticks - earlier.ticks,
            sampler_cpu=self.sampler_cpu - earlier.sampler_cpu,
        )

    # -- plain forms --

    def as_dict(self) -> dict[str, Any]:
        """A plain, JSON-compatible form (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Snapshot:
        """Inverse of :meth:`as_dict`."""
        fields = dict(state)
        fields["stages"] = tuple(StageCost(**s) for s in state.get("stages", ()))
        fields["workers"] = tuple(WorkerFigures(**w) for w in state.get("workers", ()))
        fields["storage"] = StorageFigures(**state.get("storage", {}))
        return cls(**fields)

    def flat(self, prefix: str = "data/") -> dict[str, float]:
        """Scalars by name, for loggers: ``data/wait_share``, ``data/stage_us/decode``, ...

        The names (after ``prefix``): ``wait_share``, ``wait_ms_per_batch``,
        ``wait_ms_per_step`` (per batch when no step is marked), ``samples_per_s``,
        ``batches_per_s``, ``mb_per_s``, ``open_streams``, ``retries``, ``skipped``,
        ``worker_busy`` (the mean over workers), ``worker_depth`` (their mean), and
        ``stage_us/<stage>``: sampled CPU per sample of each stage, and ``sampler_share``: what
        the sampling itself costs, as a share of the CPU it sampled.
        """
        out = {
            "wait_share": self.wait_share,
            "wait_ms_per_batch": 1e3 * self.wait_per_batch,
            "wait_ms_per_step": 1e3 * self.wait_per_step,
            "samples_per_s": self.samples_per_s,
            "batches_per_s": self.batches_per_s,
            "mb_per_s": self.bytes_per_s / 1e6,
            "open_streams": float(self.storage.open_streams),
            "retries": float(sum(self.storage.retries.values())),
            "skipped": float(self.skipped),
        }
        if self.ticks:
            out["sampler_share"] = self.sampler_share
        if self.workers:
            out["worker_busy"] = sum(w.busy_share for w in self.workers) / len(self.workers)
            out["worker_depth"] = sum(w.depth for w in self.workers) / len(self.workers)
        for name, us in self.stage_us_per_sample().items():
            out[f"stage_us/{name}"] = us
        return {prefix + k: float(v) for k, v in out.items()}
