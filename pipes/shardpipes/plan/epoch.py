"""The epoch plan: one value, made by the loader, that tells a reader's stages how to run an epoch.

The loader makes an :class:`EpochPlan` per epoch from its seed, the epoch number and any
restored state; reading services extend its path as they split the work (``spawn`` the rank,
then the worker) and hand it to the graph of each reader. There every random stage gets its
seed from it, and, when the epoch resumes a saved state with a shard index, the stages that
take part in the resume (``sharding_by_index`` and the sample ``shuffle()`` after it) are given
the same :class:`Resume` value. Nothing else reaches the stages: no stage reads another stage's
attributes or writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardpipes.plan.readers import reader_path
from shardpipes.plan.resume import ReaderPlan, Segment, Shape, reader_plan
from shardpipes.plan.seeds import derive_seed, reader_stage_seed

__all__ = ["EpochPlan", "Resume"]


@dataclass(frozen=True)
class EpochPlan:
    """The loader seed and epoch, the reader path spawned so far, and the resumed stretches.

    Reading services pass it down: ``DistributedReadingService`` spawns the rank,
    ``MultiProcessingReadingService`` the worker (:func:`shardpipes.plan.readers.reader_path`
    is the same rule written once).
    """

    seed: int
    epoch: int
    path: tuple[int, ...] = ()
    #: For an epoch resumed from a loader state with a shard index: its stretches so far
    #: (``shardpipes.plan.resume``); empty otherwise.
    resume: tuple[Segment, ...] = ()
    #: The reader starts after its own first ``after`` items of this run (a reader moved to
    #: another process, :func:`shardpipes.plan.resume.lease_start`); ``0`` otherwise. Needs
    #: ``resume`` (a run from the start has one segment with nothing consumed). Not spawned.
    after: int = 0

    def spawn(self, index: int) -> EpochPlan:
        """Return the plan of child ``index`` (a rank, then a worker)."""
        return EpochPlan(self.seed, self.epoch, (*self.path, index), self.resume)

    @classmethod
    def for_reader(
        cls,
        seed: int,
        epoch: int,
        rank: int,
        worker: int,
        *,
        distributed: bool,
        num_workers: int,
    ) -> EpochPlan:
        """The plan the reading services give reader ``(rank, worker)``."""
        path = reader_path(rank, worker, distributed=distributed, num_workers=num_workers)
        return cls(seed, epoch, path)

    def shared_seed(self, stage: int) -> int:
        """Seed for random stage ``stage`` before ``sharding_filter``: equal on all readers."""
        return derive_seed([self.seed, self.epoch, stage, 0])

    def reader_seed(self, stage: int) -> int:
        """Seed for random stage ``stage`` after ``sharding_filter``: distinct per reader."""
        return reader_stage_seed(self.seed, self.epoch, stage, self.path)

    def process_seeds(self) -> tuple[int, int, int]:
        """Seeds for a reader process's ``random``, ``torch`` and ``numpy`` generators this epoch."""
        return tuple(  # type: ignore[return-value]
            derive_seed([self.seed, self.epoch, 2**32 - 2, kind, *self.path]) for kind in range(3)
        )

    def torch_seed(self) -> int:
        """Seed for the ``torch.Generator`` handed to worker processes (their global RNGs)."""
        return derive_seed([self.seed, self.epoch, 2**32 - 1, *self.path])


@dataclass
class Resume:
    """How a resumed epoch ran so far: handed by the loader, for one epoch, to the stages that resume.

    ``segments``: the stretches of the epoch so far (the last is the one being resumed);
    ``shape``: what the graph does after the sharder; ``seed``/``epoch``: the loader's, for the
    readers' shuffle seeds; ``after``: the reader's own items of this run it starts after.

    The reader's part needs the epoch's sample count, which only ``sharding_by_index`` learns
    (from the shard URLs and the index). It calls :meth:`plan_reader` once it knows; the sample
    shuffle after it, handed the same value, reads :meth:`shuffle_start` when it makes its first
    draw, which is after the sharder has yielded its first range.
    """

    segments: tuple[Segment, ...]
    shape: Shape
    seed: int
    epoch: int
    after: int = 0
    _reader: ReaderPlan | None = field(default=None, repr=False)

    def reader_seed(self, path: tuple[int, ...]) -> int:
        """The epoch seed of the sample shuffle of the reader at ``path`` (as seeding gives it)."""
        return reader_stage_seed(self.seed, self.epoch, self.shape.shuffle_stage or 0, path)

    def plan_reader(self, total: int, policy: str, readers: int, reader: int) -> ReaderPlan:
        """What ``reader`` of ``readers`` reads of this epoch's ``total`` samples (kept for the shuffle)."""
        if self.segments[-1].readers != readers:
            raise RuntimeError(
                f"the resumed state is for {self.segments[-1].readers} readers but this "
                f"sharding_by_index was sharded for {readers}"
            )
        self._reader = reader_plan(
            total, policy, self.segments, reader, self.shape, self.reader_seed, self.after
        )
        return self._reader

    def yielded(self) -> int:
        """Samples the reader had yielded (after its shuffle) before this resume; ``0`` until planned.

        Where a counting stage (``enumerate()``) continues. After an elastic resume the reader's
        part is new, and it counts from ``0``.
        """
        return 0 if self._reader is None else self._reader.first_draw

    def shuffle_start(self) -> tuple[int, int, list[int]] | None:
        """``(seed, first draw, buffer slots)`` where the reader's sample shuffle continues.

        ``None`` until the sharder has planned the reader (then the shuffle starts afresh).
        """
        if self._reader is None:
            return None
        plan = self._reader
        return plan.seed, plan.first_draw, plan.read_order()[1]
