"""Reading services: how a graph is split across ranks and worker processes.

A reading service is a small object with four documented call times (torchdata 0.9's
protocol, minus its ``__del__``):

- ``initialize(datapipe) -> datapipe``: once, on the first epoch, with ``DataLoader2``'s own
  deep copy of the user's graph. Applies sharding, adds stages, returns the graph to iterate.
- ``initialize_iteration(seed_generator, iter_reset_fn=None)``: before each epoch's first item.
  Our services (their ``initialize_iteration`` is marked :func:`takes_plan`) are handed the
  epoch's :class:`~shardpipes.plan.epoch.EpochPlan`; a service written for torchdata 0.9 is
  handed 0.9's :class:`~shardpipes.dataloader2.random.SeedGenerator`, a facade carrying the
  same plan (:func:`handed` decides). Seeds the graph; returns the plan (or generator) for the
  next service (rank, then worker spawned). A 0.9-style service may instead return ``None`` or
  a function ``datapipe -> datapipe`` that ``DataLoader2`` applies to the graph.
- ``finalize_iteration()``: after each epoch ends, is left with ``break``, or fails.
- ``finalize()``: once, from ``DataLoader2.shutdown()``.

A service also says what it is (:mod:`shardpipes.dataloader2.protocol`): its ``topology()``
(ranks, readers per rank, their numbering), ``share_seed()``, the ``collectives()`` the loader's
checks run on, its ``parts()`` and whether it is ``checkpointable``. The loader asks these and
never which class a service is, so a service written elsewhere works as the built-in ones do
(docs/reading-services.md).
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeAlias, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import apply_sharding

from shardpipes.dataloader2._index_share import share_indexes
from shardpipes.dataloader2._stats import (
    StageFlow,
    flow_stages,
    graph_skips,
    merge_flows,
    merge_skips,
    read_flows,
    skips_from_dict,
    source_of_graph,
)
from shardpipes.dataloader2.graph import (
    apply_epoch_plan,
    describe,
    has_sharding,
    stage_name,
)
from shardpipes.dataloader2.graph.utils import _swap_in
from shardpipes.dataloader2.protocol import Collectives, Topology
from shardpipes.dataloader2.random.distributed import dist_share_seed
from shardpipes.dataloader2.random.seed_generator import SeedGenerator, as_plan, facade
from shardpipes.dataloader2.telemetry.recorder import Telemetry
from shardpipes.dataloader2.utils.worker import WorkerInfo
from shardpipes.dataloader2.workers.attachments import Attachments
from shardpipes.dataloader2.workers.bundles import Interleave
from shardpipes.dataloader2.workers.dataset import EpochSlot, WorkerDataset
from shardpipes.dataloader2.workers.pool import MainPrefetcherIterDataPipe, WorkerPoolIterDataPipe
from shardpipes.datapipes.iter._index_length import exact_length_plan
from shardpipes.datapipes.iter.base import in_main_process, traits_of
from shardpipes.datapipes.iter.prefetch import PrefetcherIterDataPipe
from shardpipes.datapipes.iter.sync import (
    ExactLengthIterDataPipe,
    FullSyncIterDataPipe,
    Policy,
    gloo_group,
    settled,
)
from shardpipes.errors import AttestationError, ShardingWarning, WorkerError
from shardpipes.handlers import SkipStats
from shardpipes.plan.epoch import EpochPlan

__all__ = [
    "CheckpointableReadingServiceInterface",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "PrototypeMultiProcessingReadingService",
    "ReadingServiceInterface",
    "SequentialReadingService",
    "handed",
    "takes_plan",
]

logger = logging.getLogger(__name__)


_F = TypeVar("_F", bound=Callable[..., Any])

#: What ``initialize_iteration`` is handed and returns for the next service: the epoch's plan
#: (our services) or 0.9's ``SeedGenerator`` facade over it (a torchdata 0.9 service).
PlanOrGenerator: TypeAlias = EpochPlan | SeedGenerator
#: 0.9's ``iter_reset_fn``: ``datapipe -> datapipe``, applied to the graph by ``DataLoader2``.
IterResetFn: TypeAlias = Callable[[Any], Any]


def takes_plan(method: _F) -> _F:
    """Mark an ``initialize_iteration`` as ours: it is handed the ``EpochPlan``, not 0.9's facade."""
    method._takes_epoch_plan = True  # type: ignore[attr-defined]
    return method


def handed(
    service: ReadingServiceInterface, plan: EpochPlan | SeedGenerator
) -> EpochPlan | SeedGenerator:
    """What ``service.initialize_iteration`` is given: the plan for ours, a ``SeedGenerator`` for 0.9's.

    A service is ours when the ``initialize_iteration`` its class uses is marked
    :func:`takes_plan`; a subclass that overrides it (0.9 code) gets the facade, and its
    ``super()`` call reaches ours with the facade, which ours accept too.
    """
    if getattr(type(service).initialize_iteration, "_takes_epoch_plan", False):
        return as_plan(plan)
    return facade(plan)


class ReadingServiceInterface(ABC):
    """Base class of reading services; see the module docstring for when each method is called.

    The defaults describe a service that runs the graph in the calling process, on one rank:
    override ``topology()``, ``share_seed()`` and ``collectives()`` when yours does otherwise.
    """

    #: Whether ``checkpoint()``/``restore()`` exist (``CheckpointableReadingServiceInterface``).
    checkpointable: ClassVar[bool] = False

    @abstractmethod
    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Prepare the graph once; return the graph ``DataLoader2`` iterates."""

    @takes_plan
    def initialize_iteration(
        self, seed_generator: PlanOrGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> Any:
        """Prepare one epoch; return the seed generator for the next service."""
        return seed_generator

    def finalize_iteration(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Clean up after one epoch (ended, abandoned or failed)."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release everything (processes, process groups); called by ``DataLoader2.shutdown``."""

    def skipped(self) -> SkipStats | None:
        """What the stages this service runs have skipped so far; ``None`` if it runs none."""
        return None

    def flows(self) -> tuple[list[StageFlow], str] | None:
        """Totals of the dropping stages this service runs, and its graph's source; ``None`` if none."""
        return None

    def fetch_figures(self) -> dict[int, dict[str, Any]] | None:
        """Each worker's latest fetch figures by worker id; ``None`` if its stages run here (or none)."""
        return None

    def topology(self) -> Topology:
        """Ranks, readers per rank and their numbering. Default: one rank, read in this process."""
        return Topology()

    def share_seed(self, seed: int) -> int:
        """The seed all ranks use for an epoch whose seed each drew (rank 0's). Default: ``seed``."""
        return seed

    def collectives(self) -> Collectives | None:
        """The process group of the loader's checks across ranks; ``None`` (default) with one rank."""
        return None

    def parts(self) -> tuple[ReadingServiceInterface, ...]:
        """The services this one is made of, outermost first. Default: itself."""
        return (self,)

    def watch(self, telemetry: Telemetry) -> None:  # noqa: B027 - optional hook
        """Report the figures of the stages this service runs in other processes to ``telemetry``.

        Called by ``DataLoader2.watch()`` before the first epoch; a service that runs stages
        elsewhere has them report with what it already sends (docs/telemetry.md).
        """


class CheckpointableReadingServiceInterface(ReadingServiceInterface):
    """A reading service with a state of its own (torchdata 0.9's interface).

    ``DataLoader2.state_dict()`` stores ``checkpoint()`` under ``"reading_service_state"``;
    a loader given that state calls ``restore(datapipe, state)`` in place of ``initialize``.
    """

    checkpointable: ClassVar[bool] = True

    @abstractmethod
    def checkpoint(self) -> bytes:
        """Return the service's state."""

    @abstractmethod
    def restore(self, datapipe: IterDataPipe[Any], serialized_state: bytes) -> IterDataPipe[Any]:
        """Prepare the graph from a saved state; return the graph ``DataLoader2`` iterates."""


def _child(seed_generator: SeedGenerator | EpochPlan, index: int) -> SeedGenerator | EpochPlan:
    """The generator (or plan) of child ``index``: a rank or a worker."""
    return seed_generator.spawn(index)


def _warn_unsharded(datapipe: IterDataPipe[Any], readers: int, who: str) -> None:
    if readers > 1 and not has_sharding(traverse_dps(datapipe)):
        warnings.warn(
            f"{who}: the graph has no sharding_filter, so each of the {readers} readers yields "
            "all of the data; add .sharding_filter() after the shard-level stages",
            ShardingWarning,
            stacklevel=4,
        )


class InProcessReadingService(ReadingServiceInterface):
    """Run the whole graph in the calling process, seeded per epoch. The default service.

    Args:
        prefetch_cnt: Items a background thread keeps ready at the end of the graph; ``0``
            (default) for none.
        init_fn: ``fn(datapipe, worker_info) -> datapipe``, applied once.
        reset_fn: ``fn(datapipe, worker_info, seed_generator) -> datapipe``, called at the
            start of every epoch after the graph was seeded.
    """

    def __init__(
        self,
        prefetch_cnt: int = 0,
        init_fn: Callable[[IterDataPipe[Any], Any], IterDataPipe[Any]] | None = None,
        reset_fn: Callable[[IterDataPipe[Any], Any, Any], IterDataPipe[Any]] | None = None,
    ) -> None:
        if prefetch_cnt < 0:
            raise ValueError(f"prefetch_cnt should be >= 0, got {prefetch_cnt!r}")
        self.prefetch_cnt = prefetch_cnt
        self.init_fn = init_fn
        self.reset_fn = reset_fn

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Keep the graph as it is (after ``init_fn``, with the prefetch stage)."""
        if self.init_fn is not None:
            datapipe = self.init_fn(datapipe, WorkerInfo(1, 0))
        self._datapipe = datapipe
        if self.prefetch_cnt:
            return PrefetcherIterDataPipe(datapipe, self.prefetch_cnt)
        return datapipe

    @takes_plan
    def initialize_iteration(
        self, seed_generator: PlanOrGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> Any:
        """Seed the graph for this epoch."""
        apply_epoch_plan(self._datapipe, as_plan(seed_generator))
        if self.reset_fn is not None:
            self.reset_fn(self._datapipe, WorkerInfo(1, 0), facade(seed_generator))
        return seed_generator

    def skipped(self) -> SkipStats:
        """Skip counters of the graph's stages."""
        return graph_skips(self._datapipe)

    def flows(self) -> tuple[list[StageFlow], str]:
        """Totals of the graph's dropping stages, and its source."""
        return _local_flows(self, self._datapipe)


def _local_flows(service: Any, datapipe: IterDataPipe[Any]) -> tuple[list[StageFlow], str]:
    found = getattr(service, "_flow_found", None)
    if found is None or found[0] is not datapipe:  # the graph walk, once per graph
        found = (datapipe, flow_stages(datapipe), source_of_graph(datapipe))
        service._flow_found = found
    return read_flows(found[1]), found[2]


def _stays_in_main(dp: Any, non_replicable: bool) -> bool:
    if in_main_process(dp):  # fullsync, pin_memory: their trait (datapipes/iter/base.py)
        return True
    check = getattr(dp, "is_replicable", None)
    return non_replicable and callable(check) and not check()


def _split_tail(
    datapipe: IterDataPipe[Any], *, non_replicable: bool = False
) -> tuple[list[tuple[Any, Any]], IterDataPipe[Any]]:
    """Peel the main-process stages off the output end: return (tail, outermost first), core.

    ``tail`` holds ``(stage, its source)``. With ``non_replicable``, stages whose
    ``is_replicable()`` is ``False`` (0.9's protocol) stay in the main process too.
    """
    tail: list[tuple[Any, Any]] = []
    while _stays_in_main(datapipe, non_replicable):
        sources = traverse_dps(datapipe)[id(datapipe)][1]
        if len(sources) != 1:
            break
        source: Any = next(iter(sources.values()))[0]
        tail.append((datapipe, source))
        datapipe = source
    return tail, datapipe


def _reattach(tail: list[tuple[Any, Any]], core: IterDataPipe[Any]) -> IterDataPipe[Any]:
    for stage, source in reversed(tail):
        if source is not core:
            _swap_in(stage, source, core)
        core = stage
    return core


_TORCH_WORDING = "in DataLoader worker process"


def _as_is(item: Any) -> Any:
    return item


class MultiProcessingReadingService(ReadingServiceInterface):
    """Run the graph in ``num_workers`` worker processes, each reading its own part.

    The ``sharding_filter`` of the graph is applied per worker (after any distributed
    sharding, so a reader is ``rank * num_workers + worker``); batches made in workers travel
    to the main process whole (several to a message when they are cheap), and are yielded in a
    deterministic round-robin order, one worker's batch after another's. Workers persist across
    epochs. ``fullsync`` and ``pin_memory`` at the end of the graph stay in the main process.
    With ``num_workers=0`` the graph runs in the main process.

    Args:
        num_workers: Worker processes. Default: ``0``.
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or ``None`` (the
            platform default).
        worker_prefetch_cnt: Messages each worker keeps ready (``0`` is taken as ``1``); a
            message holds one item, or up to 16 when items are cheap and small (see
            docs/worker-pool.md). Default: ``2``.
        main_prefetch_cnt: Items a main-process thread keeps ready; ``0`` for none. Default: ``0``.
        worker_init_fn: ``fn(datapipe, worker_info) -> datapipe``, applied once in each worker
            after its sharding. ``worker_info`` is a
            :class:`~shardpipes.dataloader2.utils.WorkerInfo`: the worker id as an ``int``, with
            ``worker_id`` and ``num_workers``.
        worker_reset_fn: ``fn(datapipe, worker_info, seed_generator) -> datapipe``, called in
            each worker at the start of every epoch, after the graph and the worker's
            ``random``/``numpy``/``torch`` generators were seeded.
        pin_memory: Pin tensors in the main process (when an accelerator exists).
        timeout: Seconds to wait for a worker's next item before failing; ``0`` waits as long
            as the workers live. With a timeout, workers send one item per message. Default:
            ``0``.

    Raises:
        WorkerError: A worker died (killed by a signal, out of memory), naming it.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
        >>> dp = IterableWrapper(range(8)).sharding_filter().batch(2)
        >>> with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        ...     sorted(x for batch in dl for x in batch)
        [0, 1, 2, 3, 4, 5, 6, 7]
    """

    def __init__(
        self,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
        worker_prefetch_cnt: int = 2,
        main_prefetch_cnt: int = 0,
        worker_init_fn: Callable[[IterDataPipe[Any], Any], IterDataPipe[Any]] | None = None,
        worker_reset_fn: Callable[[IterDataPipe[Any], Any, Any], IterDataPipe[Any]] | None = None,
        *,
        pin_memory: bool = False,
        timeout: float = 0,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers should be >= 0, got {num_workers!r}")
        if worker_prefetch_cnt < 0 or main_prefetch_cnt < 0:
            raise ValueError(
                f"worker_prefetch_cnt ({worker_prefetch_cnt}) should be >= 0 and "
                f"main_prefetch_cnt ({main_prefetch_cnt}) >= 0"
            )
        if multiprocessing_context not in (None, *torch.multiprocessing.get_all_start_methods()):
            raise ValueError(
                f"multiprocessing_context {multiprocessing_context!r} is not available; must be one "
                f"of {', '.join(torch.multiprocessing.get_all_start_methods())} or None"
            )
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context
        self.worker_prefetch_cnt = worker_prefetch_cnt
        self.main_prefetch_cnt = main_prefetch_cnt
        self.worker_init_fn = worker_init_fn
        self.worker_reset_fn = worker_reset_fn
        self.pin_memory = pin_memory
        self.timeout = timeout
        self._core: IterDataPipe[Any] | None = None
        self._slot: EpochSlot | None = None
        self._loader: Any = None
        # stops the workers of a service dropped without shutdown() (see _iterate_pool)
        self._reaper: weakref.finalize[[Any, int | None], Any] | None = None
        self._generator: EpochPlan | None = None
        self._attached = Attachments()  # shared-memory blocks of the workers' large values
        # Deals the workers' bundles out one item at a time; their skip and drop totals.
        self._interleave: Interleave | None = None
        self._telemetry: Telemetry | None = None

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Move all but the main-process tail of the graph into the worker pool."""
        tail, core = _split_tail(datapipe, non_replicable=True)
        self._core = core
        self._end_datapipe = datapipe
        if self.num_workers == 0:
            self._core = datapipe  # all of it runs here: seed all of it
            return datapipe
        _warn_unsharded(core, self.num_workers, "MultiProcessingReadingService")
        self._slot = EpochSlot()
        self._interleave = Interleave(self._slot.bundle, self._attached, grow=not self.timeout)
        self._interleave.watch = self._telemetry.take if self._telemetry is not None else None
        pool: IterDataPipe[Any] = WorkerPoolIterDataPipe(core, self)
        if self.main_prefetch_cnt:
            pool = MainPrefetcherIterDataPipe(pool, self.main_prefetch_cnt)
        self._end_datapipe = _reattach(tail, pool)  # 0.9's name for the graph iterated
        return self._end_datapipe

    @takes_plan
    def initialize_iteration(
        self, seed_generator: PlanOrGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> Any:
        """Publish this epoch's seeds to the workers (or seed the in-process graph)."""
        plan = as_plan(seed_generator)
        self._generator = plan
        if self.num_workers == 0:
            if self._core is None:
                raise RuntimeError("initialize() was not called")
            apply_epoch_plan(self._core, plan)
        elif self._slot is not None:
            self._slot.write(plan)
        return seed_generator

    def topology(self) -> Topology:
        """One rank; ``num_workers`` readers (``0``: the graph runs in this process)."""
        return Topology(readers_per_rank=self.num_workers)

    def _make_loader(self) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        if self._core is None or self._slot is None or self._generator is None:
            raise RuntimeError("initialize() and initialize_iteration() were not called")
        generator = torch.Generator()
        generator.manual_seed(self._generator.torch_seed())
        with warnings.catch_warnings():
            # torchdata 0.11 calls the deprecated torch.set_vital on every construction.
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            return self._construct(StatefulDataLoader, generator)

    def _construct(self, loader_cls: Any, generator: torch.Generator) -> Any:
        if self._core is None or self._slot is None:
            raise RuntimeError("initialize() was not called")
        return loader_cls(
            WorkerDataset(
                self._core,
                self._slot,
                self.worker_init_fn,
                shm_blocks=self._attached.make(self.num_workers, self.worker_prefetch_cnt + 2),
                user_reset=self.worker_reset_fn,
                shm_owner=self._attached.owner,
                # torch's pin thread pins the tensors it receives; ours would arrive unpinned
                shm_tensors=not self.pin_memory,
                telemetry=(
                    (self._telemetry.interval, self._telemetry.budget)
                    if self._telemetry is not None
                    else None
                ),
            ),
            batch_size=None,
            num_workers=self.num_workers,
            multiprocessing_context=self.multiprocessing_context,
            prefetch_factor=max(self.worker_prefetch_cnt, 1),
            persistent_workers=True,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            generator=generator,
            in_order=True,
            # The skip counters come with the bundles (workers/bundles.py), not in torch's snapshots.
            snapshot_every_n_steps=0,
            # Items cross from workers as they are: torch's default would turn numpy arrays
            # into tensors with workers but not without them.
            collate_fn=_as_is,
            # Forked workers never collect what they inherited: shardpipes/_fork.py's hooks.
        )

    def _iterate_pool(self) -> Iterator[Any]:
        if self._interleave is None:
            raise RuntimeError("initialize() was not called")
        if self._loader is None:
            self._loader = self._make_loader()
            self._interleave.skips.clear()  # new workers count from zero
        self._interleave.start_epoch()
        try:
            it = iter(self._loader)  # starts (or resets) the workers
            if self._reaper is None and getattr(self._loader, "_iterator", None) is not None:
                # A loader dropped without shutdown() is freed by the cyclic garbage collector,
                # which finalizes its queues' feeder threads before torch's iterator runs its
                # __del__: the stop message never reaches the workers, and torch waits 5 s for
                # each. This finalizer holds the iterator, so the collector frees this service
                # first, and the workers are stopped while their queues still work.
                self._reaper = weakref.finalize(
                    self, _stop_workers, self._loader._iterator, os.getpid()
                )
                self._reaper.atexit = False  # at exit torch's own shutdown applies
            yield from self._interleave.items(it, self.num_workers)
        except Exception as exc:
            raise self._explain(exc) from None

    def _explain(self, exc: Exception) -> Exception:
        """Name the rank in a worker's error; turn a dead worker into a ``WorkerError``."""
        gen = self._generator
        where = f"rank {gen.path[0]}" if gen is not None and gen.path else ""
        text = str(exc)
        if exc.args and isinstance(exc.args[0], str) and _TORCH_WORDING in exc.args[0]:
            # torchdata 0.9's wording of an error re-raised from a worker
            exc.args = (exc.args[0].replace(_TORCH_WORDING, "in worker process"), *exc.args[1:])
        if (
            isinstance(exc, RuntimeError)
            and "DataLoader worker" in text
            and ("exited unexpectedly" in text or "killed by signal" in text)
        ):
            err = WorkerError(f"{where + ': ' if where else ''}a worker process died: {text}")
            err.__cause__ = exc
            return err
        if where:
            exc.add_note(f"(in the data loader of {where})")
        return exc

    def skipped(self) -> SkipStats | None:
        """Skip counters of the stages, summed over the workers (as of their latest batch)."""
        if self._core is None:
            return None
        if self.num_workers == 0:
            return graph_skips(self._core)
        if self._loader is None:
            return SkipStats()
        if self._interleave is None:
            return SkipStats()
        return merge_skips(skips_from_dict(s) for _, s in sorted(self._interleave.skips.items()))

    def flows(self) -> tuple[list[StageFlow], str] | None:
        """Totals of the dropping stages, summed over the workers (as of their latest batch)."""
        if self._core is None:
            return None
        if self.num_workers == 0:
            return _local_flows(self, self._core)
        source = _local_flows(self, self._core)[1]
        flows = self._interleave.flows if self._interleave is not None else {}
        return merge_flows(f for _, f in sorted(flows.items())), source

    def fetch_figures(self) -> dict[int, dict[str, Any]] | None:
        """Each worker's fetch figures, as of its latest bundle (``None`` in-process)."""
        if self.num_workers == 0 or self._interleave is None:
            return None
        return dict(self._interleave.fetch)

    def watch(self, telemetry: Telemetry) -> None:
        """Have the workers attach their figures to their bundles, for ``telemetry``."""
        self._telemetry = telemetry
        if self._interleave is not None:
            self._interleave.watch = telemetry.take

    def finalize(self) -> None:
        """Stop the worker processes."""
        loader, self._loader = self._loader, None
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.detach()
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            # StatefulDataLoader keeps persistent workers on this iterator; stopping them
            # here, not in a __del__, is what makes shutdown deterministic.
            _stop_workers(iterator)
        self._attached.close()


def _stop_workers(iterator: Any, owner: int | None = None) -> None:
    """Stop the workers of a pool's iterator and wait for its queues' feeder threads.

    ``owner``: the process that started them; elsewhere (a forked child that frees its copy)
    nothing is done.
    """
    if owner is not None and owner != os.getpid():
        return
    iterator._shutdown_workers()
    _join_feeders(iterator)


def _join_feeders(iterator: Any) -> None:
    """Wait for the feeder threads of a stopped pool's closed queues to end.

    They end on their own soon after ``close()``; a thread still ending when the next loader
    forks its workers can leave a forked child stuck before it runs any Python (CPython 3.11
    tears the parent's threads down in the child under a lock that thread may hold: seen once,
    a worker of the second loader of a rank hung in ``PyOS_AfterFork_Child``).
    """
    queues = [
        *getattr(iterator, "_index_queues", ()),
        getattr(iterator, "_worker_result_queue", None),
    ]
    for q in queues:
        thread = getattr(q, "_thread", None)
        if thread is not None and getattr(q, "_closed", False):
            thread.join(timeout=10)


class DistributedReadingService(ReadingServiceInterface):
    """Split the graph across the ranks of ``torch.distributed`` and equalise their lengths.

    Uses the default process group however it was started (``init_process_group``, torchrun,
    Lightning, Ray), with a gloo group of its own for its few CPU collectives. The graph's
    ``sharding_filter`` is applied with the rank; ``fullsync`` is added at the end so every
    rank yields the same number of items each epoch without knowing the data size. Before each
    epoch the ranks check that they agree on the seed and epoch.

    Args:
        timeout: Seconds to wait for other ranks at a synchronisation. Default: ``1800``.
        policy: ``"stop"`` (default: all ranks stop when the first runs out) or ``"pad"``
            (short ranks repeat their own recent items until the longest rank ends).
        sync_every: Largest number of items between synchronisations. Default: ``16``.
        equalize: ``False`` only splits by rank and leaves the ranks' lengths to the caller
            (``shardpipes.webdataset.WebLoader`` evens them out after its main-process stages).
            Default: ``True``.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised, with the fix.
        AttestationError: The ranks disagree on the seed or epoch (``fault="out-of-step"``; an
            ``AttestationError`` is a ``WorkerError``).
        WorkerError: Another rank died or failed.
    """

    def __init__(
        self,
        timeout: float = 1800,
        *,
        policy: Policy = "stop",
        sync_every: int = 16,
        equalize: bool = True,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout should be positive, got {timeout!r}")
        if policy not in ("stop", "pad"):
            raise ValueError(f"policy {policy!r} is not known; must be one of 'stop', 'pad'")
        self.timeout = timeout
        self.policy = policy
        self.sync_every = sync_every
        self.equalize = equalize
        self._group: Any = None
        self._rank = 0
        self._world_size = 1
        self._datapipe: IterDataPipe[Any] | None = None

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Apply distributed sharding and add ``fullsync`` at the end of the graph."""
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "DistributedReadingService needs torch.distributed to be initialised: call "
                "torch.distributed.init_process_group(...) first, or launch with torchrun"
            )
        self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
        self._group = gloo_group(self.timeout)  # gloo even when training uses NCCL
        _warn_unsharded(datapipe, self._world_size, "DistributedReadingService")
        apply_sharding(datapipe, self._world_size, self._rank, SHARDING_PRIORITIES.DISTRIBUTED)
        share_indexes(datapipe, self._group, self._rank)  # one read of each index per job
        if not self.equalize:
            self._datapipe = datapipe
            return datapipe
        tail, core = _split_tail(datapipe)
        plan = None if any(traits_of(t).syncs_ranks for t, _ in tail) else exact_length_plan(core)
        if plan is not None:
            # With an index every rank's length is known: guard it in place of fullsync, so an
            # epoch costs one collective (the seed check below), not one per chunk.
            self._datapipe = _reattach(tail, ExactLengthIterDataPipe(core, *plan))
            return self._datapipe
        if not traits_of(datapipe).syncs_ranks:  # the user's own last stage may even them out
            datapipe = FullSyncIterDataPipe(
                datapipe, self.timeout, policy=self.policy, sync_every=self.sync_every
            )
        inner = [n.stage for n in describe(datapipe).nodes[1:] if n.traits.syncs_ranks]
        if inner:
            name = stage_name(inner[0])
            raise ValueError(
                f"{name}() may only be the last stage of the graph (it synchronises ranks in the "
                f"main process); remove the inner {name}()"
            )
        datapipe.set_process_group(self._group)
        self._datapipe = datapipe
        return datapipe

    def share_seed(self, seed: int) -> int:
        """Rank 0's ``seed`` on every rank (for a seed drawn from each rank's own generator)."""
        if not (dist.is_available() and dist.is_initialized()):
            return seed  # one process: its own draw
        return dist_share_seed(seed, self._group)

    def topology(self) -> Topology:
        """The ranks of ``torch.distributed`` (one when it is not initialised), split by rank."""
        if dist.is_available() and dist.is_initialized():
            return Topology(dist.get_world_size(), 0, True, dist.get_rank())
        return Topology(distributed=True)

    def collectives(self) -> Collectives | None:
        """This service's gloo group (made by ``initialize``), ``None`` before it or without ranks."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return Collectives(self._group, self.timeout)

    @takes_plan
    def initialize_iteration(
        self, seed_generator: PlanOrGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> Any:
        """Check that all ranks agree on seed and epoch; seed the graph for this rank."""
        plan = as_plan(seed_generator)
        values = [plan.seed & (2**62 - 1), plan.epoch]
        t = torch.tensor([v for x in values for v in (x, -x)], dtype=torch.int64)
        settled(
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group, async_op=True),
            [t],
            self.timeout,
        )
        hi_seed, neg_lo_seed, hi_epoch, neg_lo_epoch = (int(v) for v in t.tolist())
        if hi_seed != -neg_lo_seed or hi_epoch != -neg_lo_epoch:
            # The fault the ranks' check (``_attest.py``) names for ranks in other seeds or
            # epochs; an AttestationError is a WorkerError, so code catching either sees it.
            raise AttestationError(
                f"rank {self._rank}: epoch {values[1]}: out-of-step: the ranks disagree on the "
                f"loader seed or epoch (this rank: "
                f"seed {values[0]}, epoch {values[1]}; seeds across ranks {-neg_lo_seed}..{hi_seed}, "
                f"epochs {-neg_lo_epoch}..{hi_epoch}); call dl.seed() with the same value on every "
                "rank and iterate the same number of epochs",
                fault="out-of-step",
            )
        rank_generator = _child(seed_generator, self._rank)
        if self._datapipe is not None:
            apply_epoch_plan(self._datapipe, as_plan(rank_generator))
        return rank_generator

    def flows(self) -> tuple[list[StageFlow], str] | None:
        """Totals of the graph's dropping stages (when no worker pool runs them)."""
        return None if self._datapipe is None else _local_flows(self, self._datapipe)

    def finalize(self) -> None:
        """Destroy the gloo group this service created."""
        group, self._group = self._group, None
        if group is not None and dist.is_initialized():
            dist.destroy_process_group(group)


class SequentialReadingService(ReadingServiceInterface):
    """Combine services, typically ``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``.

    Each call is passed to the services in order (``finalize*`` in reverse order), and the
    seed generator returned by one is given to the next: the distributed service spawns the
    rank, the multiprocessing service the worker.

    Args:
        *reading_services: The services, outermost first.
    """

    def __init__(self, *reading_services: ReadingServiceInterface) -> None:
        if not reading_services:
            raise ValueError("SequentialReadingService needs at least one reading service")
        self.reading_services = reading_services

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Initialise each service in order."""
        for rs in self.reading_services:
            datapipe = rs.initialize(datapipe)
        return datapipe

    @takes_plan
    def initialize_iteration(
        self, seed_generator: PlanOrGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> Any:
        """Pass the seed generator through each service in order.

        A service that returns a generator hands it to the next; one that returns a function
        (0.9's ``iter_reset_fn``) has it composed with the others' and returned.
        """
        reset_fns = [iter_reset_fn] if iter_reset_fn is not None else []
        current: SeedGenerator | EpochPlan = seed_generator
        for rs in self.reading_services:
            found = rs.initialize_iteration(handed(rs, current))
            if isinstance(found, SeedGenerator | EpochPlan):
                current = found
            elif callable(found):
                reset_fns.append(found)
        if not reset_fns:
            return current

        def reset(datapipe: Any) -> Any:
            for fn in reset_fns:
                datapipe = fn(datapipe)
            return datapipe

        return reset

    def parts(self) -> tuple[ReadingServiceInterface, ...]:
        """The parts of each service, in order."""
        return tuple(p for rs in self.reading_services for p in rs.parts())

    def topology(self) -> Topology:
        """The parts' answers composed: ranks from the one that splits by rank, readers from the others."""
        found = [rs.topology() for rs in self.reading_services]
        ranked = next((t for t in found if t.distributed or t.ranks > 1), Topology())
        numbering = {t.numbering for t in found}
        if len(numbering) > 1:
            raise ValueError(f"the parts of this service number readers differently: {numbering}")
        return Topology(
            ranked.ranks,
            max(t.readers_per_rank for t in found),
            any(t.distributed for t in found),
            ranked.rank,
            numbering.pop(),
        )

    def share_seed(self, seed: int) -> int:
        """The seed passed through each part in order."""
        for rs in self.reading_services:
            seed = rs.share_seed(seed)
        return seed

    def collectives(self) -> Collectives | None:
        """The first part's collectives that has some."""
        return next(
            (c for rs in self.reading_services if (c := rs.collectives()) is not None), None
        )

    def skipped(self) -> SkipStats | None:
        """Skip counters from the innermost service that runs stages."""
        for rs in reversed(self.reading_services):
            found = rs.skipped()
            if found is not None:
                return found
        return None

    def flows(self) -> tuple[list[StageFlow], str] | None:
        """Drop totals from the innermost service that runs stages."""
        for rs in reversed(self.reading_services):
            found = rs.flows()
            if found is not None:
                return found
        return None

    def fetch_figures(self) -> dict[int, dict[str, Any]] | None:
        """Fetch figures from the innermost service that runs stages in workers."""
        for rs in reversed(self.reading_services):
            found = rs.fetch_figures()
            if found is not None:
                return found
        return None

    def watch(self, telemetry: Telemetry) -> None:
        """Pass ``telemetry`` to each service."""
        for rs in self.reading_services:
            rs.watch(telemetry)

    def finalize_iteration(self) -> None:
        """Finalise the epoch in each service, in reverse order."""
        for rs in reversed(self.reading_services):
            rs.finalize_iteration()

    def finalize(self) -> None:
        """Finalise each service, in reverse order."""
        for rs in reversed(self.reading_services):
            rs.finalize()


#: torchdata 0.9's name of the multiprocessing service while it was a prototype.
PrototypeMultiProcessingReadingService = MultiProcessingReadingService
