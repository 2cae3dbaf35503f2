"""``RayReadingService``: a rank's logical readers run on a pool of Ray actors, dealt in the worker pool's order.

The trainer process keeps the ``V`` logical readers of its rank (``num_workers``, what states
and plans see) and leases each to a reader actor of a shared pool. Each lease is a streaming
generator call (:meth:`ReaderActor.run <shardpipes.raypool.actors.ReaderActor.run>`) yielding
bundles of items; the :class:`~shardpipes.raypool.lease.Dealer` yields them in the order
``MultiProcessingReadingService(num_workers=V)`` yields its workers' items. When an actor dies
(or its node), its readers are leased again from their next item; when the pool changes size,
readers move make-before-break. The batches are those of the worker pool whatever the pool did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.dataloader2._stats import (
    StageFlow,
    flows_to_list,
    merge_flows,
    merge_skips,
    skips_from_dict,
    source_of_graph,
)
from shardpipes.dataloader2.reading_service import MultiProcessingReadingService
from shardpipes.errors import WorkerError
from shardpipes.handlers import SkipStats
from shardpipes.raypool.figures import ReaderFigures
from shardpipes.raypool.lease import Dealer, Lease, LeaseTable
from shardpipes.raypool.membership import PoolClient
from shardpipes.raypool.membership import import_ray as _ray
from shardpipes.raypool.reader import InitFn, ResetFn, seek_refusal
from shardpipes.raypool.sizing import SizingPolicy, WaitWindow

__all__ = ["RayReadingService", "SeekRefused"]

logger = logging.getLogger(__name__)


class SeekRefused(ValueError):
    """The graph cannot start a logical reader after its first items by seeking (and replay was not asked)."""


#: Leases of one logical reader lost at the same item before the trainer gives up.
MAX_LOSSES = 4


class RayReadingService(MultiProcessingReadingService):
    """Run a rank's ``num_workers`` logical readers on a pool of Ray reader actors.

    The rank yields exactly the items ``MultiProcessingReadingService(num_workers)`` yields,
    in the same order, whatever the pool does: readers that die are leased again from their
    next item, and :meth:`scale` moves readers between actors without a pause. States record
    ``num_workers``; a state taken under this service resumes under the worker pool and back.
    What the readers' stages skip and drop reaches ``dl.stats()`` and the loader's empty-epoch
    check, and under ``dl.watch()`` their figures reach telemetry, one worker per logical reader,
    as a worker process's do.

    Ray must be initialised (``ray.init(address=...)``) in the trainer process before the
    first epoch. Combine with ``DistributedReadingService`` as the worker pool is:
    ``SequentialReadingService(DistributedReadingService(), RayReadingService(4))``.

    Args:
        num_workers: Logical readers per rank (``V``).
        pool: Name of the reader pool; trainers of one job share it. Default: ``"shardpipes"``.
        readers: Reader actors the pool starts with, if it does not exist. Default: ``num_workers``.
        reader_options: Ray actor options of a reader (``num_cpus``, ``resources``,
            ``scheduling_strategy``). Default: ``{"num_cpus": 1}``.
        bundle: Items per message from a reader. Default: ``4``.
        prefetch: Messages a reader makes ahead of the trainer, per logical reader. Default: ``4``.
        replay: Allow a graph that cannot seek: a moved reader reads and drops its first items.
            Default: ``False`` (such a graph is refused, saying why).
        timeout: Seconds without a message from a reader before it is taken as lost and its
            logical reader leased again. Default: ``60``.
        check_every: Messages between two looks at the pool's membership. Default: ``16``.
        sizing: Resize the pool from the trainer's wait for readers (rank 0 decides, every
            ``sizing.window`` items); ``None`` (default) leaves the size to :meth:`scale`.
        worker_init_fn: ``fn(datapipe, worker_info) -> datapipe``, as the worker pool takes it:
            run in the reader actor for logical reader ``worker_info.worker_id`` after its
            sharding, each time the reader starts on an actor (a lease). Default: ``None``.
        worker_reset_fn: ``fn(datapipe, worker_info, seed_generator) -> datapipe``: run for
            the logical reader at the start of each lease, after the epoch's plan, with the
            reader's seed generator (the one its worker process would get). Default: ``None``.

    Raises:
        ImportError: Ray is not installed, naming the extra.
        SeekRefused: The graph cannot seek and ``replay`` is false, saying why.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        pool: str = "shardpipes",
        readers: int | None = None,
        reader_options: dict[str, Any] | None = None,
        bundle: int = 4,
        prefetch: int = 4,
        replay: bool = False,
        timeout: float = 60,
        check_every: int = 16,
        sizing: SizingPolicy | None = None,
        worker_init_fn: InitFn | None = None,
        worker_reset_fn: ResetFn | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers should be >= 1, got {num_workers!r}")
        if bundle < 1 or prefetch < 1 or check_every < 1:
            raise ValueError(
                f"bundle ({bundle}), prefetch ({prefetch}) and check_every ({check_every}) "
                "should be >= 1"
            )
        super().__init__(
            num_workers, worker_init_fn=worker_init_fn, worker_reset_fn=worker_reset_fn
        )
        self.pool = pool
        self.readers = readers or num_workers
        self.reader_options = {"num_cpus": 1, "max_concurrency": 64, **(reader_options or {})}
        self.bundle = bundle
        self.prefetch = prefetch
        self.replay = replay
        self.lease_timeout = timeout
        self.check_every = check_every
        self.sizing = sizing
        self._window = WaitWindow(sizing.window) if sizing is not None else None
        self._members = PoolClient(pool, self.readers, self.reader_options, timeout)
        self._graph_ref: Any = None
        self._gens: dict[int, Any] = {}  # fence -> the lease's streaming generator
        self._losses: dict[tuple[int, int], int] = {}  # (reader, item) -> leases lost there
        self._dealer: Dealer | None = None  # this epoch's
        self._skips_before = SkipStats()  # what the readers skipped in the epochs before
        self._flows_before: list[list[Any]] = []  # their stages' drop totals in those epochs
        # (core, its source): what the empty-epoch warning says of an epoch of nothing
        self._source: tuple[Any, str] | None = None
        self._figures = ReaderFigures()  # telemetry's worker figures, per logical reader
        self._unchecked: set[int] = set()  # fences of moved leases that seek (see _checked)
        #: Counters: ``items``, ``messages``, ``wait_s`` (trainer time waiting for readers),
        #: ``released`` (leases replaced after a death), ``moved``, ``dropped`` (late items),
        #: ``replayed`` (leases started by replay because their reader had skipped samples),
        #: ``wait_share`` (with ``sizing``: the last window's share of the trainer's time spent
        #: waiting, what the policy decided on). The wait per step is ``wait_s / items``.
        self.stats: dict[str, float] = dict.fromkeys(
            ("items", "messages", "wait_s", "released", "moved", "dropped", "replayed"), 0
        )
        self.stats["wait_share"] = 0.0

    # --- the loader's calls -------------------------------------------------------------------

    def initialize(self, datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Move all but the main-process tail of the graph to the reader pool (refuse a graph that cannot seek)."""
        _ray()
        out = super().initialize(datapipe)
        refusal = seek_refusal(self._core) if self._core is not None else None
        if refusal is not None and not self.replay:
            raise SeekRefused(
                "RayReadingService moves logical readers between actors by starting them after "
                f"their first items, and this graph cannot seek: {refusal}; add a shard index "
                "(sharding_by_index) or pass replay=True to read and drop the items instead"
            )
        self._seek = refusal is None
        return out

    def skipped(self) -> SkipStats | None:
        """What the stages skipped in the reader actors, as of the items yielded (all epochs)."""
        if self._core is None:
            return None
        dealer = self._dealer
        now = [skips_from_dict(m) for m in dealer.marks if m] if dealer is not None else []
        return merge_skips([self._skips_before, *now])

    def flows(self) -> tuple[list[StageFlow], str] | None:
        """Totals of the dropping stages in the reader actors, over the readers' ended epochs.

        Each logical reader's totals come with its end, from the lease that made its last item,
        as a worker sends them at its epoch's end: the loader's empty-epoch check names the stage.
        """
        if self._core is None:
            return None
        if self._source is None or self._source[0] is not self._core:
            self._source = (self._core, source_of_graph(self._core))
        dealer = self._dealer
        now = [f for f in dealer.at_end if f is not None] if dealer is not None else []
        return merge_flows([self._flows_before, *now]), self._source[1]

    def scale(self, readers: int) -> list[str]:
        """Make the reader pool ``readers`` actors (from any trainer); return the active names."""
        return self._members.scale(readers)

    def finalize(self) -> None:
        """Stop this trainer's leases; the last trainer of the pool stops its readers."""
        self._cancel_all()
        self._members.bye()
        super().finalize()

    # --- one epoch ----------------------------------------------------------------------------

    def _iterate_pool(self) -> Iterator[Any]:
        ray = _ray()
        if self._core is None or self._generator is None:
            raise RuntimeError("initialize() and initialize_iteration() were not called")
        if self._graph_ref is None:
            self._graph_ref = ray.put(self._core)
        world = dist.get_world_size() if len(self._generator.path) == 1 else 1
        table = LeaseTable(self.num_workers)
        dealer = self._dealer = Dealer(table)
        self._unchecked.clear()
        active, _ = self._members.membership()
        for reader in range(self.num_workers):
            self._start(table.grant(reader, active[reader % len(active)]), world)
        pulls = 0
        try:
            while True:
                for item in dealer.deal():
                    self.stats["items"] += 1
                    if self.sizing is not None:
                        self._size(table)
                    yield item
                waiting = dealer.waiting_for()
                if waiting is None:
                    break
                lease = table.maker(waiting, dealer.wanted(waiting))
                assert lease is not None  # a reader always has a lease for its next item
                if lease.fence in self._unchecked:
                    lease = self._checked(lease, table, dealer, world)
                self._pull(lease, table, dealer, world)
                self._drop_retired(table)
                pulls += 1
                if pulls % self.check_every == 0:
                    self._rebalance(table, dealer, world)
        finally:
            self._cancel_all()
            self.stats["dropped"] = dealer.dropped
            self._skips_before = merge_skips(
                [self._skips_before, *(skips_from_dict(m) for m in dealer.marks if m)]
            )
            ended = [f for f in dealer.at_end if f is not None]
            self._flows_before = flows_to_list(merge_flows([self._flows_before, *ended]))
            self._figures.close()
            self._dealer = None

    def _must_replay(self, dealer: Dealer, reader: int) -> bool:
        """Whether ``reader`` skipped samples before its next item: then a lease starts by replay.

        A seek counts positions in the index, and a sample skipped by a handler shifts every
        item after it (docs/checkpointing.md); replay reproduces the skips.
        """
        seen = dealer.seen[reader]
        return bool(seen and (seen["samples"] or seen["shards"]))

    def _checked(self, lease: Lease, table: LeaseTable, dealer: Dealer, world: int) -> Lease:
        """A moved lease that seeks, once its old lease delivered up to its switch item.

        The move seeked to the switch item when its reader had skipped nothing; if the old
        lease skipped samples before the switch, the seek is off: lease again by replay.
        """
        self._unchecked.discard(lease.fence)
        if not self._must_replay(dealer, lease.reader):
            return lease
        self._cancel(lease.fence)
        self.stats["replayed"] += 1
        lease = table.replace(lease, lease.member, dealer.wanted(lease.reader))
        self._start(lease, world, replay=True)
        return lease

    def _size(self, table: LeaseTable) -> None:
        """Rank 0, every ``sizing.window`` items: resize the pool by the share of time it waited."""
        assert self.sizing is not None and self._generator is not None
        if self._generator.path[:1] not in ((), (0,)):
            return
        assert self._window is not None
        share = self._window.add(
            time.perf_counter(), self.stats["wait_s"], int(self.stats["items"])
        )
        if share is None:
            return
        self.stats["wait_share"] = share
        current = len({le.member for le in table.all()})
        want = self.sizing.next_size(current, waited=share)
        if want != current:
            if want > current:  # the machines first, where Ray's autoscaler runs
                from ray.autoscaler.sdk import request_resources

                request_resources(bundles=[_bundle_of(self.reader_options)] * want)
            logger.info(
                "reader pool %s: %d -> %d readers (waited %.0f%%)",
                self.pool,
                current,
                want,
                100 * share,
            )
            self._members.actor().scale.remote(want)

    def _start(self, lease: Lease, world: int, *, replay: bool = False) -> None:
        assert self._generator is not None
        handle = self._members.handle(lease.member)
        self._gens[lease.fence] = handle.run.options(
            num_returns="streaming", _generator_backpressure_num_objects=self.prefetch
        ).remote(
            self._graph_ref,
            self._generator,
            lease.reader,
            self.num_workers,
            world,
            lease.start,
            lease.fence,
            self.bundle,
            replay or not self._seek,
            (self.worker_init_fn, self.worker_reset_fn),
            (tel.interval, tel.budget) if (tel := self._telemetry) is not None else None,
        )

    def _pull(self, lease: Lease, table: LeaseTable, dealer: Dealer, world: int) -> None:
        """Take the next message of ``lease``; on a lost reader, lease its reader again."""
        ray = _ray()
        gen = self._gens[lease.fence]
        start = time.perf_counter()
        try:
            # next(gen) has no time-out: wait on the generator first (ready when its next
            # message is here, or when its stream ended or failed), unless it is ready already
            if not gen.next_ready():
                ready, _ = ray.wait([gen], timeout=self.lease_timeout)
                if not ready:
                    raise TimeoutError(f"no message in {self.lease_timeout} s")
            bundle = ray.get(next(gen), timeout=self.lease_timeout)
        except StopIteration:  # a reader always sends its end: the actor went with the stream
            self._lost(lease, ConnectionError("the stream ended early"), table, dealer, world)
            return
        except Exception as exc:
            if _graph_error(ray, exc):
                cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
                cause.add_note(f"(in logical reader {lease.reader}, on Ray actor {lease.member})")
                raise cause from None
            self._lost(lease, exc, table, dealer, world)
            return
        finally:
            self.stats["wait_s"] += time.perf_counter() - start
        self.stats["messages"] += 1
        dealer.offer(lease, bundle.start, bundle.items, bundle.end, bundle.skips, bundle.flows)
        if bundle.figures is not None and self._telemetry is not None:  # a fenced lease's too
            figures = self._figures.take(lease.reader, lease.fence, bundle.figures)
            self._telemetry.take(lease.reader, figures, dealer.ready(lease.reader))

    def _lost(
        self, lease: Lease, exc: Exception, table: LeaseTable, dealer: Dealer, world: int
    ) -> None:
        ray = _ray()
        logger.warning(
            "logical reader %d: reader actor %s lost (%s: %s); leased again from item %d",
            lease.reader,
            lease.member,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            dealer.wanted(lease.reader),
        )
        self._cancel(lease.fence)
        at = (lease.reader, dealer.wanted(lease.reader))
        self._losses[at] = self._losses.get(at, 0) + 1
        if self._losses[at] > MAX_LOSSES:  # not the actors: the item itself kills its reader
            raise WorkerError(
                f"logical reader {lease.reader} was lost {MAX_LOSSES + 1} times at its item "
                f"{at[1]}, on different reader actors; the last: {type(exc).__name__}: {exc}"
            ) from exc
        dead = {lease.member}
        try:
            self._members.actor().dead.remote(lease.member)
        except Exception:  # the pool restarting: the trainers rebuild it
            pass
        for _ in range(3):
            active, _leaving = self._members.membership()
            live = [m for m in active if m not in dead]
            if live:
                break
            time.sleep(1)
            ray.get(self._members.actor().scale.remote(self.readers))
        else:
            raise WorkerError(f"reader pool {self.pool}: no live reader actor left") from exc
        self._members.known.discard(lease.member)
        member = _least_loaded(live, table)
        self.stats["released"] += 1
        replay = self._must_replay(dealer, lease.reader)
        self.stats["replayed"] += replay
        self._start(table.replace(lease, member, dealer.wanted(lease.reader)), world, replay=replay)

    def _rebalance(self, table: LeaseTable, dealer: Dealer, world: int) -> None:
        """Move readers off leaving actors and onto new ones, make-before-break."""
        ray = _ray()
        try:
            active, leaving = self._members.membership()
        except Exception as exc:  # the pool is restarting: look again next time
            logger.info("reader pool %s: membership not available (%s)", self.pool, exc)
            return
        if not active:
            return
        load = {m: 0 for m in active}
        for held in (table.leases(r) for r in range(table.readers)):
            if held and held[-1].member in load:
                load[held[-1].member] += 1
        for reader in range(table.readers):
            held = table.leases(reader)
            if len(held) != 1 or dealer.ended(reader):
                continue  # a move in progress, or nothing left to make
            member = held[0].member
            least = min(active, key=lambda m: (load[m], active.index(m)))
            off = member not in load  # leaving (or gone)
            if not off and load[member] - load[least] < 2:
                continue
            switch = dealer.wanted(reader) + self.bundle * 2
            moved = table.move(reader, least, switch)
            replay = self._must_replay(dealer, reader)
            if not replay and self._seek:  # checked when its turn comes (_checked)
                self._unchecked.add(moved.fence)
            self.stats["replayed"] += replay
            self._start(moved, world, replay=replay)
            load[least] += 1
            if not off:
                load[member] -= 1
            self.stats["moved"] += 1
        for name in leaving:
            if not table.on(name):
                ray.get(self._members.actor().drained.remote(name, self._members.trainer))

    def _drop_retired(self, table: LeaseTable) -> None:
        current = {le.fence for le in table.all()}
        for fence in [f for f in self._gens if f not in current]:
            self._cancel(fence)

    def _cancel(self, fence: int) -> None:
        gen = self._gens.pop(fence, None)
        if gen is not None:
            try:
                _ray().cancel(gen)
            except Exception as exc:  # an actor already gone
                logger.debug("cancel of lease %d: %s", fence, exc)

    def _cancel_all(self) -> None:
        for fence in list(self._gens):
            self._cancel(fence)


def _bundle_of(options: dict[str, Any]) -> dict[str, float]:
    """The resources one reader actor asks for, as an autoscaler bundle."""
    bundle = {"CPU": float(options.get("num_cpus", 1))}
    bundle.update(options.get("resources") or {})
    return bundle


def _least_loaded(members: list[str], table: LeaseTable) -> str:
    load = {m: 0 for m in members}
    for lease in table.all():
        if lease.member in load:
            load[lease.member] += 1
    return min(members, key=lambda m: (load[m], members.index(m)))


def _graph_error(ray: Any, exc: Exception) -> bool:
    """Whether ``exc`` is the graph's own error (raised to the user), not a lost reader."""
    return isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(
        exc, ray.exceptions.RayActorError | ray.exceptions.TaskCancelledError
    )
