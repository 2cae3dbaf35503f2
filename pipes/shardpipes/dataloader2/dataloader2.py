"""``DataLoader2``: iterate a DataPipe graph through a reading service, one epoch per ``iter()``.

The loader keeps the graph, the service and the position; each concern it has lives in a module
of its own: the epoch (:mod:`._epoch`), the state in and out and the restore (:mod:`._checkpoint`,
:mod:`.state`, :mod:`shardpipes.plan.restore`), what a state is bound to (:mod:`._binding`),
the ranks' checks (:mod:`._attest`). It asks the reading service only through its protocol
(:mod:`.protocol`).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, TypeVar

from torch.utils.data import IterDataPipe, MapDataPipe

from shardpipes.dataloader2 import _binding, _checkpoint, _epoch
from shardpipes.dataloader2._attest import Attestor, Policy
from shardpipes.dataloader2._consumers import Consumer, length, lightning_probe, own_state
from shardpipes.dataloader2._iterator import DataLoader2Iterator
from shardpipes.dataloader2.adapter import Adapter
from shardpipes.dataloader2.reading_service import InProcessReadingService, ReadingServiceInterface
from shardpipes.dataloader2.state import (
    RANDOMNESS_STATE_KEY_NAME,
    READING_SERVICE_STATE_KEY_NAME,
    SERIALIZED_DATAPIPE_KEY_NAME,
)
from shardpipes.dataloader2.telemetry import BUDGET, DEFAULT_INTERVAL, Telemetry
from shardpipes.dataloader2.workers.graph_copy import copy_graph
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
T_co = TypeVar("T_co", covariant=True)  # a name of 0.9's module, which 0.9 code imports


def _serialize(datapipe: Any) -> bytes | None:
    try:
        return pickle.dumps(datapipe)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None  # a lambda or a local function: the graph cannot travel in the state


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
        #: A checkpointable reading service's state from :meth:`load_state_dict`.
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
        self.telemetry: Telemetry | None = None  # dl.watch(): figures while it runs
        self._described = False
        self._consumer: Consumer | None = None  # the loop iterating this epoch, if Lightning's
        self._length: tuple[int, int] | None = None  # (epochs run, len()) once computed
        _epoch.warn_unsplit(self.reading_service)

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

    def watch(
        self, *, interval: float | None = DEFAULT_INTERVAL, budget: float = BUDGET
    ) -> Telemetry:
        """Turn telemetry on (before the first epoch) and return it; ``.snapshot()`` gives the figures.

        See docs/telemetry.md: the training loop's wait per batch and share of step time,
        throughput, CPU per stage (sampled every ``interval`` seconds in each process at most,
        less often when a sampler's own CPU would pass ``budget`` of what it samples; ``None``
        for none), workers' busy time and queue depth, storage bytes, streams and retries.
        Calling it again returns the same :class:`~shardpipes.dataloader2.telemetry.Telemetry`.
        """
        if self.telemetry is None:
            if self._graph is not None:
                raise RuntimeError("watch() must be called before the loader's first epoch")
            self.telemetry = Telemetry(
                interval, budget=budget, skipped=lambda: _epoch.skipped_total(self.reading_service)
            )
            self.reading_service.watch(self.telemetry)
        return self.telemetry

    def _describe(self) -> None:
        if not self._described and self.datapipe is not None:
            _checkpoint.describe(self)
            self._described = True

    def _pause(self) -> None:
        """Stop yielding until :meth:`_resume` (torchdata 0.9's); the epoch stays open."""
        self._is_paused = True

    def _resume(self) -> None:
        """Yield again after :meth:`_pause`."""
        self._is_paused = False

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
            self._graph = _epoch.make_graph(self)
        self._active = _epoch.start(self)
        self.valid_iterator_id = 0 if self.valid_iterator_id is None else self.valid_iterator_id + 1
        self._consumer = Consumer.find(self._state)
        return DataLoader2Iterator(self, self.valid_iterator_id)

    def __len__(self) -> int:
        """Items this rank yields in an epoch, when known exactly (else ``TypeError``).

        Known with a shard index (``sharding_by_index`` then one-to-one stages and at most one
        ``batch()``, any ranks and workers) and for a graph with a length read in-process.
        """
        return length(self)

    def __bool__(self) -> bool:
        return True  # a loader is true whatever its length (0.9's had none; truth never asks it)

    def stats(self) -> dict[str, Any]:
        """Counters of this rank so far: items yielded this epoch, what was skipped, fullsync.

        ``skipped_samples``/``skipped_shards`` count what stages with a non-raising
        ``handler`` dropped (in all worker processes), with up to 20 ``skipped_examples``
        as ``(url, reason)``; ``sync`` is the last epoch's ``fullsync`` figures on this rank
        (items yielded, own, dropped, collectives), when the graph has one. ``fetch``, once
        remote objects were read: one dict per reader (each worker process learns its own;
        ``worker`` is ``None`` in-process) with the requests in flight it learnt
        (``requests``), its last measured ``mb_per_s``, and its peaks against the read-ahead
        budget (``storage.pool.fetch_figures``).
        """
        return _epoch.stats(self)

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
        if graph and self._serialized is None and self.datapipe is not None:
            self._serialized = _serialize(self.datapipe)
        skipped = _epoch.skipped_total(self.reading_service) if self._active is not None else 0
        serialized = self._serialized if graph else None
        return _checkpoint.take(self, skipped, serialized).to_dict()

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
        # this rank's own state, of a checkpoint that holds every rank's (Lightning's)
        _checkpoint.load_dict(self, own_state(state_dict), on_change)

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
            if self.telemetry is not None:
                self.telemetry.close()

    def __enter__(self) -> DataLoader2[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
