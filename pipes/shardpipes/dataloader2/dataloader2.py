"""``DataLoader2``: iterate a DataPipe graph through a reading service, one epoch per ``iter()``."""

from __future__ import annotations

import itertools
import logging
import pickle
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe, MapDataPipe

from shardpipes.dataloader2 import _binding
from shardpipes.dataloader2._attest import Attestor, Policy
from shardpipes.dataloader2._consumers import (
    Consumer,
    lightning_probe,
    loader_length,
    own_state,
)
from shardpipes.dataloader2._copy import copy_graph
from shardpipes.dataloader2._stats import check_epoch
from shardpipes.dataloader2.adapter import Adapter
from shardpipes.dataloader2.error import PauseIteration
from shardpipes.dataloader2.graph import (
    carries_across_epochs,
    lean_graph,
    refuse_unsupported,
    resume_shape,
)
from shardpipes.dataloader2.graph.identity import carry_ids
from shardpipes.dataloader2.graph.mixing import check_mixture_state, mixture_state
from shardpipes.dataloader2.random.seed_generator import SeedGenerator, int64_seed
from shardpipes.dataloader2.reading_service import (
    CheckpointableReadingServiceInterface,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
    handed,
)
from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe
from shardpipes.errors import AttestationWarning, ShardingWarning, StateMismatchError
from shardpipes.handlers import SkipStats
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Segment

__all__ = [
    "RANDOMNESS_STATE_KEY_NAME",
    "READING_SERVICE_STATE_KEY_NAME",
    "SERIALIZED_DATAPIPE_KEY_NAME",
    "DataLoader2",
    "DataLoader2Iterator",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

logger = logging.getLogger(__name__)

STATE_FORMAT = "shardpipes-loader-state"
STATE_VERSION = 2
_STATE_KEYS = ("format", "version", "seed", "epoch", "consumed", "world_size", "num_workers")
#: torchdata 0.9's keys, also in our state: the pickled graph (after the adapters, before the
#: reading service) and a ``CheckpointableReadingServiceInterface``'s own state.
SERIALIZED_DATAPIPE_KEY_NAME = "serialized_datapipe"
READING_SERVICE_STATE_KEY_NAME = "reading_service_state"
#: 0.9's key of the seed generator's state; ours keeps the seed and epoch under "seed"/"epoch".
RANDOMNESS_STATE_KEY_NAME = "randomness_state"


def _serialize(datapipe: Any) -> bytes | None:
    try:
        return pickle.dumps(datapipe)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None  # a lambda or a local function: the graph cannot travel in the state


class DataLoader2Iterator(Iterator[T]):
    """The iterator of one epoch of a :class:`DataLoader2` (torchdata 0.9's).

    Only the newest iterator of a loader is valid: ``next()`` on an older one raises
    ``RuntimeError``. Other attributes are those of the graph's own iterator.
    """

    def __init__(self, dataloader: DataLoader2[T], iterator_id: int) -> None:
        self.dataloader = dataloader
        self.iterator_id = iterator_id
        self.limit_counter: int | None = None
        self.limit_threshold: int | None = None

    def __next__(self) -> T:
        dl = self.dataloader
        if self.iterator_id != dl.valid_iterator_id or dl._active is None:
            if self.iterator_id != dl.valid_iterator_id:
                raise RuntimeError(
                    "This iterator has been invalidated because another iterator has been created "
                    "from the same DataLoader2"
                )
            raise StopIteration
        if dl._is_paused:
            raise PauseIteration  # ends this loop; the epoch continues after resume()
        item = next(dl._active)
        if dl._consumer is not None:  # Lightning's fetcher: its state after each batch (_consumers)
            dl._consumer.handed_out(dl._state())
        if self.limit_threshold is not None:
            self.limit_counter = (self.limit_counter or 0) + 1
            if self.limit_counter >= self.limit_threshold:
                self._pause()
        return item

    def _pause(self) -> None:
        self.dataloader._pause()
        self.limit_counter = 0

    def resume(self) -> None:
        """Continue after a pause (:meth:`limit` reached, or ``DataLoader2._pause()``)."""
        self.dataloader._resume()

    def limit(self, num_batches: int | None) -> None:
        """Pause after ``num_batches`` more items; ``None`` removes the limit.

        Counted from now, and again after each ``resume()``. A paused iterator ends its
        ``for`` loop; ``resume()`` continues the same epoch.
        """
        self.limit_counter = 0
        self.limit_threshold = num_batches

    def __getattr__(self, name: str) -> Any:
        dl = self.__dict__.get("dataloader")
        if dl is None or dl._datapipe_iter is None:
            raise AttributeError(name)
        return getattr(dl._datapipe_iter, name)


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
    Seeds: after ``dl.seed(s)`` (any integer) epoch ``e`` of the loader runs the plan of
    ``(s, e)``, and ``seed()`` again restarts the epoch count. Without ``seed()``, as in torchdata
    0.9, each epoch draws its seed from torch's default generator (so ``torch.manual_seed``
    decides the order; with ``DistributedReadingService`` rank 0's draw is used on every rank).
    Worker processes seed their ``random``, ``numpy`` and ``torch`` from the epoch's plan.

    Args:
        datapipe: The graph (``None`` when :meth:`load_state_dict` brings it).
        datapipe_adapter_fn: An :class:`~shardpipes.dataloader2.adapter.Adapter` (or a list),
            applied in order to the loader's copy of the graph.
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
        datapipe: IterDataPipe[T] | MapDataPipe[T] | None,
        datapipe_adapter_fn: Iterable[Adapter] | Adapter | None = None,
        reading_service: ReadingServiceInterface | None = None,
    ) -> None:
        if datapipe_adapter_fn is None:
            self.datapipe_adapter_fns: list[Callable[[Any], Any]] | None = None
        elif isinstance(datapipe_adapter_fn, Iterable):
            self.datapipe_adapter_fns = list(datapipe_adapter_fn)
        else:
            self.datapipe_adapter_fns = [datapipe_adapter_fn]
        self.datapipe: IterDataPipe[T] | None = None
        if datapipe is not None:
            self.datapipe = self._adapt(datapipe)
        self.reading_service = (
            reading_service if reading_service is not None else InProcessReadingService()
        )
        #: A ``CheckpointableReadingServiceInterface``'s state from :meth:`load_state_dict`.
        self.reading_service_state: Any = None
        self._serialized: bytes | None = None
        self.valid_iterator_id: int | None = None
        self._datapipe_iter: Iterator[T] | None = None
        self._open_iteration = False
        self._seed: int | None = None  # set by seed(); None: draw each epoch's from torch
        self._epoch = 0
        self._pending: tuple[int, int] | None = None  # a restored epoch of a drawn seed
        self._epochs_run = 0
        self._is_paused = False
        self._graph: IterDataPipe[T] | None = None
        self._active: Generator[T, None, None] | None = None
        self._closed = False
        # Progress of the current epoch, for state_dict(): which epoch, how many items yielded.
        self._current: EpochPlan | None = None
        self._consumed = 0
        self._skip = 0  # items to replay silently at the start of the next epoch (after a restore)
        # Or, with an index: the stretches of the epoch to resume by seeking (shardpipes.plan.resume).
        self._resume_segments: tuple[Segment, ...] = ()
        self._skipped_at_start = 0
        self._attest = Attestor()  # ids, the ranks' check, what a state is bound to
        self._consumer: Consumer | None = None  # the loop iterating this epoch, if Lightning's
        self._length: tuple[int, int] | None = None  # (epochs run, len()) once computed
        self._described = False
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

    def _adapt(self, datapipe: Any) -> IterDataPipe[T]:
        if isinstance(datapipe, MapDataPipe):
            datapipe = datapipe.to_iter_datapipe()
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"DataLoader2 needs an IterDataPipe, got {type(datapipe).__name__}")
        if self.datapipe_adapter_fns:
            datapipe = copy_graph(datapipe)  # adapters change the graph in place
            for adapter in self.datapipe_adapter_fns:
                datapipe = adapter(datapipe)
        adapted: IterDataPipe[T] = datapipe
        return adapted

    def seed(self, seed: int) -> None:
        """Use ``seed`` (any integer) from the next epoch on, and count epochs from 0 again."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed should be an int, got {seed!r}")
        if self._resume_segments or self._skip:
            raise ValueError(
                f"seed({seed}) would discard the position restored by load_state_dict() (batch "
                f"{self._resume_segments[-1].consumed if self._resume_segments else self._skip} "
                "of a started epoch) and start over at zero; call seed() before "
                "load_state_dict(), or not at all when resuming"
            )
        self._seed = seed
        self._epoch = 0
        self._pending = None

    def attest(
        self, *, every: int | None = 64, policy: Policy = "raise", log_dir: str | None = None
    ) -> None:
        """Turn on the ranks' check of the samples they yield (see docs/attestation.md).

        Without this call the ranks check their run, data, plan and position once per epoch
        (one collective, at its start) and fold no ids: the per-batch cost of folding was
        measured above 1% of a small-sample loader's time (``benchmarks/attest_cost.py``).

        With ``every`` or ``log_dir``, the graph the loader makes at its first epoch carries each
        sample's id from the reader to its batch, beside the sample (``batch.ids``), so the ids
        survive a ``map`` that drops ``__url__`` and ``__key__``: call this before the first
        epoch. Where a stage between ``webdataset()`` and ``batch()`` could drop, add or reorder
        samples (``filter``, ``flatmap``, a stage of your own), an ``AttestationWarning`` says
        the ids are not carried, and batches are checked by their samples' keys if they keep
        them, else by position only.

        Args:
            every: Batches between two checks (``None``: only at epoch starts). Default: ``64``.
            policy: ``"raise"`` (default), ``"warn"`` or ``"off"``.
            log_dir: A folder where each rank appends the ids of its batches
                (``ids-rank{R}.bin``), for ``shardpipes verify``. Default: no log.
        """
        self._attest.configure(every, policy, log_dir)

    def _describe(self) -> None:
        if not self._described and self.datapipe is not None:
            # The running graph once there is one: its sharders hold the index the reading
            # service shared (one read of the descriptor per job); else the user's graph (also
            # when a 0.9 service's iter_reset_fn made the graph something else).
            graph = self._graph if isinstance(self._graph, IterDataPipe) else self.datapipe
            self._attest.data = _binding.describe_data(graph)
            self._attest.plan = _binding.describe_plan(
                self.datapipe, _services(self.reading_service)
            )
            self._described = True

    def _pause(self) -> None:
        """Stop yielding until :meth:`_resume` (torchdata 0.9's); the epoch stays open."""
        self._is_paused = True

    def _resume(self) -> None:
        """Yield again after :meth:`_pause`."""
        self._is_paused = False

    def _next_seed(self) -> tuple[int, int]:
        """The (seed, epoch) of the epoch that starts now."""
        if self._pending is not None:
            found, self._pending = self._pending, None
            return found
        if self._seed is not None:
            self._epoch += 1
            return self._seed, self._epoch - 1
        # No seed(): torch's default generator decides (moved on, so each epoch differs).
        drawn = int(torch.randint(0, 2**63 - 1, ()).item())
        for rs in _services(self.reading_service):
            if isinstance(rs, DistributedReadingService):
                drawn = rs.share_seed(drawn)
        return drawn, 0

    def _end_iteration(self) -> None:
        if self._open_iteration:
            self._open_iteration = False
            self.reading_service.finalize_iteration()

    def _close_active(self) -> None:
        try:
            if self._active is not None:
                self._active.close()  # an abandoned epoch: finalise it before the next begins
                self._active = None
        finally:
            self._end_iteration()
            self._datapipe_iter = None
            self._consumer = None

    def __iter__(self) -> DataLoader2Iterator[T]:
        if self._closed:
            raise RuntimeError("DataLoader2 was shut down; create a new one")
        if self.datapipe is None:
            raise RuntimeError(
                "Please provide datapipe or use load_state_dict to load datapipe from state"
            )
        if lightning_probe():  # Lightning checks that iter() works: no epoch starts for it
            return DataLoader2Iterator(self, -1)
        self._close_active()
        self._is_paused = False
        if self._graph is None:
            refuse_unsupported(self.datapipe)  # before any reader starts
            graph = lean_graph(copy_graph(self.datapipe))
            if self._attest.wants_ids:  # ids beside the samples, to their batches (batch.ids)
                graph, note = carry_ids(graph)
                if note is not None:
                    warnings.warn(note, AttestationWarning, stacklevel=2)
            if self.reading_service_state is not None:
                if not isinstance(self.reading_service, CheckpointableReadingServiceInterface):
                    raise TypeError("Cannot restore from non-checkpointable reading service")
                self._graph = self.reading_service.restore(graph, self.reading_service_state)
            else:
                self._graph = self.reading_service.initialize(graph)
        seed, epoch = self._next_seed()
        self._seeded_epoch = self._seed is not None
        generator = EpochPlan(int64_seed(seed), epoch, resume=self._resume_segments)
        self._epoch_seed = seed
        self._epochs_run += 1
        skip, self._skip, self._resume_segments = self._skip, 0, ()
        # Set now, not when the generator starts: a state taken after iter() but before the
        # first item must point at this epoch.
        self._current = generator
        self._consumed = generator.resume[-1].consumed if generator.resume else skip
        self._skipped_at_start = _skipped(self.reading_service)
        self._open_iteration = True
        try:
            found = self.reading_service.initialize_iteration(
                handed(self.reading_service, generator)
            )
            if callable(found) and not isinstance(found, SeedGenerator | EpochPlan):
                self._graph = found(self._graph)  # a 0.9 service's iter_reset_fn
            self._start_attest(seed, generator.epoch)
            fresh = not skip and not generator.resume  # a whole epoch: check it yields something
            before = self.reading_service.flows() if fresh else None
            self._datapipe_iter = iter(self._graph)
        except BaseException:
            self._end_iteration()
            raise
        self._active = self._run(self._datapipe_iter, generator, skip, before)
        self.valid_iterator_id = 0 if self.valid_iterator_id is None else self.valid_iterator_id + 1
        self._consumer = Consumer.find(self._state)
        return DataLoader2Iterator(self, self.valid_iterator_id)

    def __len__(self) -> int:
        """Items this rank yields in an epoch, when known exactly (else ``TypeError``).

        Known with a shard index (``sharding_by_index`` then one-to-one stages and at most one
        ``batch()``, any ranks and workers) and for a graph with a length read in-process.
        """
        if self._length is None or self._length[0] != self._epochs_run:  # once an epoch
            self._length = (
                self._epochs_run,
                loader_length(self.datapipe, self._graph, *_topology(self.reading_service)),
            )
        return self._length[1]

    def __bool__(self) -> bool:
        return True  # a loader is true whatever its length (0.9's had none; truth never asks it)

    def _start_attest(self, seed: int, epoch: int) -> None:
        self._describe()
        dist_rs = [
            s for s in _services(self.reading_service) if isinstance(s, DistributedReadingService)
        ]
        distributed = bool(dist_rs) and dist.is_available() and dist.is_initialized()
        group = dist_rs[0]._group if dist_rs else None
        timeout = dist_rs[0].timeout if dist_rs else 1800.0
        world, workers, _ = _topology(self.reading_service)
        self._attest.source = self.datapipe
        self._attest.start_epoch(
            group, distributed, seed, epoch, self._consumed, timeout, world * max(workers, 1)
        )

    def _run(
        self, it: Iterator[T], generator: EpochPlan, skip: int, before: Any
    ) -> Generator[T, None, None]:
        yielded = 0
        try:
            # Replay: the epoch is deterministic, so the items after the first `skip` are
            # exactly those the interrupted run would have yielded next.
            if skip and sum(1 for _ in itertools.islice(it, skip)) < skip:
                raise ValueError(
                    f"the restored state says {skip} items of epoch {generator.epoch} were "
                    "consumed, but this epoch has fewer: is it the same graph and data?"
                )
            attest = self._attest.yielded
            for item in it:
                self._consumed += 1
                yielded += 1
                attest(item, self._consumed)
                yield item
            self._attest.end_epoch(self._epoch_seed, generator.epoch, self._consumed)
            self._current = None  # the epoch is complete
            self._log_epoch(self._epochs_run - 1)
            after = self.reading_service.flows() if before is not None else None
            if before is not None and after is not None:
                carried = self.datapipe is not None and carries_across_epochs(self.datapipe)
                check_epoch(
                    generator.epoch, yielded, before[0], after[0], after[1], carried=carried
                )
        finally:
            self._end_iteration()

    def stats(self) -> dict[str, Any]:
        """Counters of this rank so far: items yielded this epoch, what was skipped, fullsync.

        ``skipped_samples``/``skipped_shards`` count what stages with a non-raising
        ``handler`` dropped (in all worker processes), with up to 20 ``skipped_examples``
        as ``(url, reason)``; ``sync`` is the last epoch's ``fullsync`` figures on this rank
        (items yielded, own, dropped, collectives), when the graph has one.
        """
        skipped = self.reading_service.skipped() or SkipStats()
        out: dict[str, Any] = {
            "epoch": self._epochs_run - 1,
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

    def state_dict(self, *, graph: bool = False) -> dict[str, Any]:
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

        torchdata 0.9's keys are there too: ``reading_service_state`` (a
        ``CheckpointableReadingServiceInterface``'s ``checkpoint()``, else ``None``) and
        ``serialized_datapipe``: the pickled graph with ``graph=True`` (what
        :meth:`from_state` and a loader made with ``datapipe=None`` need), else ``None``, so
        the state stays small and JSON-compatible.

        While PyTorch Lightning's fit loop iterates the loader, the state is that after the last
        batch Lightning passed on to a step (it fetches one ahead), and a checkpoint holds every
        rank's (``dataloader2/_consumers.py``).
        """
        state = self._state(graph=graph)
        return state if self._consumer is None else self._consumer.state(state)

    def _state(self, *, graph: bool = False) -> dict[str, Any]:
        world, workers, distributed = _topology(self.reading_service)
        seed: int | None
        current = self._current if self._active is not None else None
        in_epoch = current is not None
        if current is not None:
            seed, seeded = self._epoch_seed, self._seeded_epoch
            epoch, consumed = current.epoch, self._consumed
            earlier = current.resume[:-1]
            skipped = _skipped(self.reading_service) - self._skipped_at_start
        else:  # between epochs, or restored and not iterated yet (the pending position counts)
            if self._pending is not None:
                (seed, epoch), seeded = self._pending, False
            else:
                seed, epoch, seeded = self._seed, self._epoch, self._seed is not None
            earlier, skipped = self._resume_segments[:-1], 0
            consumed = self._resume_segments[-1].consumed if self._resume_segments else self._skip
        if graph and self._serialized is None and self.datapipe is not None:
            self._serialized = _serialize(self.datapipe)
        self._describe()
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "seed": seed,
            "seeded": seeded,
            "epoch": epoch,
            "consumed": consumed,
            "world_size": world,
            "num_workers": workers,
            "distributed": distributed,
            "segments": [seg.as_list() for seg in earlier],
            "skipped": skipped,
            "epochs_run": self._epochs_run - (1 if in_epoch else 0),
            "mixture": mixture_state(self._graph if self._graph is not None else self.datapipe),
            _binding.KEY: self._attest.binding(seed, epoch),
            SERIALIZED_DATAPIPE_KEY_NAME: self._serialized if graph else None,
            READING_SERVICE_STATE_KEY_NAME: (
                self.reading_service.checkpoint()
                if isinstance(self.reading_service, CheckpointableReadingServiceInterface)
                else self.reading_service_state
            ),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], reading_service: ReadingServiceInterface | None = None
    ) -> DataLoader2[Any]:
        """A new loader over the graph saved in ``state``, continuing from it (torchdata 0.9's)."""
        loader: DataLoader2[Any] = cls(None, reading_service=reading_service)
        loader.load_state_dict(state)
        return loader

    def load_state_dict(
        self, state_dict: dict[str, Any], *, on_change: _binding.OnChange = "raise"
    ) -> None:
        """Continue from ``state_dict`` (from :meth:`state_dict`) at the next ``iter()``.

        A loader made with ``datapipe=None`` takes the graph saved in the state (it is saved
        when it can be pickled). A state of torchdata 0.9 brings only its graph.

        The state is bound to the data and the plan it was taken with (docs/attestation.md):
        with a shard index, loading it over other shards (added, removed, resized, rewritten)
        or another plan (another ``shuffle`` buffer, ``batch`` size, policy) raises, unless
        ``on_change`` says how to continue: ``"restart_epoch"`` starts the state's epoch
        again from its first batch on the new data, ``"next_epoch"`` starts the epoch after it.
        A state saved by another rank (on the same number of ranks) is refused whatever
        ``on_change`` says; states of another run are found by the ranks' first check.

        Raises:
            StateMismatchError: The data or the plan changed, or the state is another rank's,
                or its position contradicts itself (reset to zero, an epoch skipped); the
                message says what.
            KeyError: A key of the state is missing.
            ValueError: The state is from another format or version; or it was saved with
                another number of ranks or workers and the graph cannot resume by seeking (it
                needs ``sharding_by_index``, see docs/checkpointing.md), naming why.
        """
        state = own_state(state_dict)  # this rank's, of a checkpoint with every rank's
        if state.get(SERIALIZED_DATAPIPE_KEY_NAME) is not None:
            if self.datapipe is None:
                self.datapipe = self._adapt(pickle.loads(state[SERIALIZED_DATAPIPE_KEY_NAME]))
            self._serialized = state[SERIALIZED_DATAPIPE_KEY_NAME]
        if READING_SERVICE_STATE_KEY_NAME in state:
            self.reading_service_state = state[READING_SERVICE_STATE_KEY_NAME]
        if "format" not in state and SERIALIZED_DATAPIPE_KEY_NAME in state:
            return  # torchdata 0.9's state: the graph only
        if self.datapipe is None:
            raise ValueError(
                "this loader has no graph and the state does not carry one: take the state with "
                "state_dict(graph=True), or build the graph and pass it to DataLoader2"
            )
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise KeyError(f"loader state is missing {', '.join(missing)}")
        if state["format"] != STATE_FORMAT or state["version"] not in (1, STATE_VERSION):
            raise ValueError(
                f"loader state is {state['format']!r} version {state['version']}; this shardpipes "
                f"reads {STATE_FORMAT!r} versions 1 and {STATE_VERSION}"
            )
        check_mixture_state(self.datapipe, state.get("mixture"))
        world, workers, distributed = _topology(self.reading_service)
        restart = self._check_binding(state, on_change, (world, workers, distributed))
        if restart is not None:
            state = restart
        saved = Segment(
            int(state["world_size"]),
            int(state["num_workers"]),
            bool(state.get("distributed", distributed)),
            int(state["consumed"]),
        )
        earlier = tuple(Segment.from_list(seg) for seg in state.get("segments", ()))
        epochs_run = int(state.get("epochs_run", state["epoch"]))
        if max(int(state["epoch"]), epochs_run) > 0 and carries_across_epochs(self.datapipe):
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
        self._close_active()
        if state["seed"] is None:  # between epochs of a loader without seed()
            self._seed, self._epoch, self._pending = None, 0, None
        elif state.get("seeded", True):
            self._seed, self._epoch, self._pending = int(state["seed"]), int(state["epoch"]), None
        else:  # an epoch whose seed was drawn: replay it, then draw again
            self._seed, self._epoch = None, 0
            self._pending = (int(state["seed"]), int(state["epoch"]))
        self._skip, self._resume_segments = skip, resume
        self._epochs_run = epochs_run
        self._attest.restore(state.get(_binding.KEY) or {})

    def _check_binding(
        self, state: dict[str, Any], on_change: str, topology: tuple[int, int, bool]
    ) -> dict[str, Any] | None:
        """Refuse a state bound to other data, plan or rank; return the state to continue from."""
        if on_change not in _binding.ON_CHANGE:
            raise ValueError(
                f"on_change {on_change!r} is not known; must be one of {', '.join(_binding.ON_CHANGE)}"
            )
        binding = state.get(_binding.KEY)
        if not binding:
            return None  # a state of an earlier shardpipes: not bound
        faults = _binding.position_faults(state)
        if faults:
            raise StateMismatchError(
                "this loader state contradicts itself: " + "; ".join(faults), changes=tuple(faults)
            )
        world, _, distributed = topology
        rank = dist.get_rank() if distributed and dist.is_initialized() else 0
        saved_world = int(state["world_size"])
        if binding.get("rank", rank) != rank and saved_world == world:
            raise StateMismatchError(
                f"this loader state was saved by rank {binding['rank']} and is loaded on rank "
                f"{rank} of the same {world} ranks: each rank loads the state it saved (only "
                "when the job restarts with another number of ranks may a rank load any rank's)",
                changes=(f"rank {binding['rank']} -> {rank}",),
            )
        self._describe()
        found = _binding.changes(binding, self._attest.data, self._attest.plan)
        if not found:
            return None
        if on_change == "raise":
            raise StateMismatchError(
                "this loader state was taken with other data or another plan: "
                + "; ".join(found)
                + ". Resuming by position would yield the wrong samples; pass "
                "load_state_dict(state, on_change='restart_epoch' or 'next_epoch') to continue "
                "on the new data",
                changes=tuple(found),
            )
        logger.warning(
            "loader state: %s; continuing with on_change=%r", "; ".join(found), on_change
        )
        epoch = int(state["epoch"]) + (1 if on_change == "next_epoch" else 0)
        moved = {**state, "epoch": epoch, "consumed": 0, "segments": [], "skipped": 0}
        moved[_binding.KEY] = {**binding, "steps": binding.get("before", 0)}
        return moved

    def shutdown(self) -> None:
        """End the current epoch, stop workers and release process groups. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close_active()
        finally:
            self.reading_service.finalize()
            self._attest.close()

    def __enter__(self) -> DataLoader2[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
