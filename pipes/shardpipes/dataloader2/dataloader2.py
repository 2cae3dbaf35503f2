"""``DataLoader2``: iterate a DataPipe graph through a reading service, one epoch per ``iter()``."""

from __future__ import annotations

import copy
import itertools
import logging
import warnings
from collections.abc import Generator, Iterator
from typing import Any, Generic, TypeVar

import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.dataloader2._stats import check_epoch
from shardpipes.dataloader2.graph import (
    carries_across_epochs,
    lean_graph,
    refuse_unsupported,
    resume_shape,
)
from shardpipes.dataloader2.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
)
from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe
from shardpipes.errors import ShardingWarning
from shardpipes.handlers import SkipStats
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Segment

__all__ = ["DataLoader2"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

STATE_FORMAT = "shardpipes-loader-state"
STATE_VERSION = 2
_STATE_KEYS = ("format", "version", "seed", "epoch", "consumed", "world_size", "num_workers")


def _services(rs: ReadingServiceInterface) -> list[ReadingServiceInterface]:
    if isinstance(rs, SequentialReadingService):
        return [s for r in rs.reading_services for s in _services(r)]
    return [rs]


def _uses(rs: ReadingServiceInterface, kind: type) -> bool:
    return any(isinstance(s, kind) for s in _services(rs))


def _topology(rs: ReadingServiceInterface) -> tuple[int, int, bool]:
    """Return (world size, workers per rank, whether a DistributedReadingService is used)."""
    world = 1
    distributed = _uses(rs, DistributedReadingService)
    if distributed and dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    workers = max(
        (s.num_workers for s in _services(rs) if isinstance(s, MultiProcessingReadingService)),
        default=0,
    )
    return world, workers, distributed


def _skipped(rs: ReadingServiceInterface) -> int:
    found = rs.skipped()
    return found.samples + found.shards if found is not None else 0


class DataLoader2(Generic[T]):
    """Run a DataPipe graph with a reading service; each ``iter()`` is one epoch.

    The graph is deep-copied on the first epoch, so the caller's graph is never modified.
    Seeds are deterministic: the default seed is ``0``, each epoch gets a new order, and
    ``dl.seed(s)`` chooses another seed (and restarts the epoch count).

    Args:
        datapipe: The graph.
        reading_service: How to run it. Default: :class:`InProcessReadingService`.

    Examples:
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
        self.reading_service = (
            reading_service if reading_service is not None else InProcessReadingService()
        )
        self._seed = 0
        self._epoch = 0
        self._graph: IterDataPipe[T] | None = None
        self._active: Generator[T, None, None] | None = None
        self._closed = False
        # Progress of the current epoch, for state_dict(): which epoch, how many items yielded.
        self._current: EpochPlan | None = None
        self._consumed = 0
        self._skip = 0  # items to replay silently at the start of the next epoch (after a restore)
        # Or, with an index: the stretches of the epoch to resume by seeking (shardpipes.plan.resume).
        self._resume: tuple[Segment, ...] = ()
        self._skipped_at_start = 0
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
            refuse_unsupported(self.datapipe)  # before any reader starts
            self._graph = self.reading_service.initialize(lean_graph(copy.deepcopy(self.datapipe)))
        generator = EpochPlan(self._seed, self._epoch, resume=self._resume)
        self._epoch += 1
        skip, self._skip, self._resume = self._skip, 0, ()
        # Set now, not when the generator starts: a state taken after iter() but before the
        # first item must point at this epoch.
        self._current = generator
        self._consumed = generator.resume[-1].consumed if generator.resume else skip
        self._active = self._run(self._graph, generator, skip)
        return self._active

    def _run(
        self, graph: IterDataPipe[T], generator: EpochPlan, skip: int
    ) -> Generator[T, None, None]:
        self._skipped_at_start = _skipped(self.reading_service)
        self.reading_service.initialize_iteration(generator)
        fresh = not skip and not generator.resume  # a whole epoch: check it yields something
        before = self.reading_service.flows() if fresh else None
        yielded = 0
        try:
            it = iter(graph)
            # Replay: the epoch is deterministic, so the items after the first `skip` are
            # exactly those the interrupted run would have yielded next.
            if skip and sum(1 for _ in itertools.islice(it, skip)) < skip:
                raise ValueError(
                    f"the restored state says {skip} items of epoch {generator.epoch} were "
                    "consumed, but this epoch has fewer: is it the same graph and data?"
                )
            for item in it:
                self._consumed += 1
                yielded += 1
                yield item
            self._current = None  # the epoch is complete
            self._log_epoch(generator.epoch)
            after = self.reading_service.flows() if before is not None else None
            if before is not None and after is not None:
                carried = carries_across_epochs(self.datapipe)
                check_epoch(
                    generator.epoch, yielded, before[0], after[0], after[1], carried=carried
                )
        finally:
            self.reading_service.finalize_iteration()

    def stats(self) -> dict[str, Any]:
        """Counters of this rank so far: items yielded this epoch, what was skipped, fullsync.

        ``skipped_samples``/``skipped_shards`` count what stages with a non-raising
        ``handler`` dropped (in all worker processes), with up to 20 ``skipped_examples``
        as ``(url, reason)``; ``sync`` is the last epoch's ``fullsync`` figures on this rank
        (items yielded, own, dropped, collectives), when the graph has one.
        """
        skipped = self.reading_service.skipped() or SkipStats()
        out: dict[str, Any] = {
            "epoch": self._current.epoch if self._current is not None else self._epoch - 1,
            "yielded": self._consumed,
            "skipped_samples": skipped.samples,
            "skipped_shards": skipped.shards,
            "skipped_examples": list(skipped.examples),
        }
        if isinstance(self._graph, FullSyncIterDataPipe):
            out["sync"] = self._graph.stats.as_dict()
        return out

    def _log_epoch(self, epoch: int) -> None:
        stats = self.stats()
        skipped = stats["skipped_samples"] + stats["skipped_shards"]
        log = logger.warning if skipped else logger.info
        log(
            "epoch %d: %d items; skipped so far: %d samples, %d shards%s",
            epoch,
            stats["yielded"],
            stats["skipped_samples"],
            stats["skipped_shards"],
            f" (first: {stats['skipped_examples'][0][0]}: {stats['skipped_examples'][0][1]})"
            if skipped
            else "",
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the loader's position: a small dict to save beside the model checkpoint.

        Taken between two batches of an epoch, a new ``DataLoader2`` over the same graph,
        reading service and data, after :meth:`load_state_dict`, yields exactly the batches
        this one would have yielded next. Taken between epochs, it starts the next epoch.

        With a shard index (a graph ``sharding_by_index`` ... ``batch()``) the restore seeks
        there, and may run under another number of ranks or workers; without one it replays
        the epoch up to the saved position (see docs/checkpointing.md).

        The state is the same on every rank: ``seed``, ``epoch``, ``consumed`` (items this
        rank yielded in the epoch's current stretch), the topology, ``segments`` (earlier
        stretches of this epoch run under other topologies, as ``[ranks, workers,
        distributed, consumed]``) and ``skipped`` (what handlers skipped this epoch so far).
        """
        world, workers, distributed = _topology(self.reading_service)
        if self._current is not None and self._active is not None:
            epoch, consumed = self._current.epoch, self._consumed
            earlier = self._current.resume[:-1]
            skipped = _skipped(self.reading_service) - self._skipped_at_start
        else:  # between epochs, or restored and not iterated yet (the pending position counts)
            epoch, earlier, skipped = self._epoch, self._resume[:-1], 0
            consumed = self._resume[-1].consumed if self._resume else self._skip
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "seed": self._seed,
            "epoch": epoch,
            "consumed": consumed,
            "world_size": world,
            "num_workers": workers,
            "distributed": distributed,
            "segments": [seg.as_list() for seg in earlier],
            "skipped": skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``iter()``.

        Raises:
            KeyError: A key of the state is missing.
            ValueError: The state is from another format or version; or it was saved with
                another number of ranks or workers and the graph cannot resume by seeking (it
                needs ``sharding_by_index``, see docs/checkpointing.md), naming why.
        """
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise KeyError(f"loader state is missing {', '.join(missing)}")
        if state["format"] != STATE_FORMAT or state["version"] not in (1, STATE_VERSION):
            raise ValueError(
                f"loader state is {state['format']!r} version {state['version']}; this shardpipes "
                f"reads {STATE_FORMAT!r} versions 1 and {STATE_VERSION}"
            )
        world, workers, distributed = _topology(self.reading_service)
        saved = Segment(
            int(state["world_size"]),
            int(state["num_workers"]),
            bool(state.get("distributed", distributed)),
            int(state["consumed"]),
        )
        earlier = tuple(Segment.from_list(seg) for seg in state.get("segments", ()))
        if int(state["epoch"]) > 0 and carries_across_epochs(self.datapipe):
            raise ValueError(
                "this graph has fixed_length(), whose position carries over from one epoch to the "
                "next; exact resume after the first epoch is not supported for it yet"
            )
        shape = resume_shape(self.datapipe)
        same = (saved.world_size, saved.num_workers, saved.distributed) == (
            world,
            workers,
            distributed,
        )
        skipped = int(state.get("skipped", 0))
        resume: tuple[Segment, ...] = ()
        skip = 0
        if not same and (saved.consumed or earlier):
            if isinstance(shape, str) or skipped:
                why = (
                    shape
                    if isinstance(shape, str)
                    else (
                        f"handlers skipped {skipped} samples or shards of this epoch before the state "
                        "was taken, so positions in the index no longer match what was yielded"
                    )
                )
                raise ValueError(
                    f"loader state was saved with {saved.world_size} rank(s) x "
                    f"{saved.num_workers} worker(s), this loader runs {world} x {workers}; "
                    f"resuming with another topology needs a graph that can seek with a shard "
                    f"index, and this one cannot: {why}"
                )
            resume = (*earlier, saved, Segment(world, workers, distributed, 0))
        elif same and (saved.consumed or earlier):
            if isinstance(shape, str) or skipped:
                if earlier:
                    raise ValueError(
                        "this state continues an epoch resumed with another topology, but this "
                        "graph cannot resume by seeking (is it the same graph?)"
                    )
                skip = saved.consumed  # replay: read the epoch up to the position again
            else:
                resume = (*earlier, saved)
        if self._active is not None:
            self._active.close()
            self._active = None
        self._seed, self._epoch = int(state["seed"]), int(state["epoch"])
        self._skip, self._resume = skip, resume

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
