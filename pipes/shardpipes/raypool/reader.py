"""One logical reader's items, from any item on: what a Ray reader actor runs for a lease.

A rank's graph is read by ``V`` logical readers, numbered as ``MultiProcessingReadingService``
numbers its workers: reader ``w`` is the graph sharded as worker ``w`` of ``V`` and handed the
rank's epoch plan spawned to ``w``. Its items are a pure function of that plan, so any process
can make them, and, with a graph that resumes by seeking, start after its own first ``k`` items
(:func:`shardpipes.plan.resume.lease_start`) without reading them. A graph that cannot seek can
start there by replay (reading and dropping the first ``k``), when the caller allows it.

Nothing here imports Ray: the actor calls :func:`logical_items`, and the tests call it in process.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2._stats import (
    flow_stages,
    flows_to_list,
    merge_skips,
    read_flows,
    skip_counters,
    skips_to_dict,
)
from shardpipes.dataloader2.graph import apply_epoch_plan, resume_shape
from shardpipes.dataloader2.random import SeedGenerator
from shardpipes.dataloader2.telemetry.reporter import SharedStorage, WorkerReporter
from shardpipes.dataloader2.utils.dispatch import shard_for_worker
from shardpipes.dataloader2.utils.worker import WorkerInfo
from shardpipes.dataloader2.workers.graph_copy import copy_graph
from shardpipes.handlers import SkipStats
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Segment

__all__ = [
    "Bundle",
    "ReaderGraph",
    "logical_items",
    "logical_reader",
    "reader_bundles",
    "seek_refusal",
]

#: ``fn(datapipe, worker_info) -> datapipe``, as ``MultiProcessingReadingService`` takes it.
InitFn = Callable[[IterDataPipe[Any], Any], IterDataPipe[Any]]
#: ``fn(datapipe, worker_info, seed_generator) -> datapipe``, as the worker pool takes it.
ResetFn = Callable[[IterDataPipe[Any], Any, Any], IterDataPipe[Any]]
#: Telemetry's ``(stack-sample interval or None, budget)`` when it is on, as a worker gets it.
TelemetryOn = tuple[float | None, float]


def seek_refusal(core: IterDataPipe[Any]) -> str | None:
    """Why a logical reader of ``core`` cannot start after its first items by seeking; ``None`` if it can."""
    found = resume_shape(core)
    return found if isinstance(found, str) else None


def reader_plan_for(
    plan: EpochPlan, reader: int, num_readers: int, world_size: int, after: int
) -> EpochPlan:
    """The plan of logical ``reader`` (``plan`` is the rank's), starting after its own ``after`` items.

    ``after > 0`` needs the epoch's segments; a run from the epoch's start has one, with
    nothing consumed, under this topology (what the worker pool's run is).
    """
    spawned = plan.spawn(reader)
    if not after:
        return spawned
    segments = plan.resume or (Segment(world_size, num_readers, len(plan.path) == 1, 0),)
    return dataclasses.replace(spawned, resume=segments, after=after)


def logical_items(
    core: IterDataPipe[Any],
    plan: EpochPlan,
    reader: int,
    num_readers: int,
    *,
    world_size: int = 1,
    after: int = 0,
    replay: bool = False,
) -> Iterator[Any]:
    """The items of logical ``reader`` of ``num_readers`` in this epoch, after its own first ``after``.

    ``core`` is the rank's graph (sharded by rank, not by worker), ``plan`` the rank's epoch
    plan (path ``(rank,)`` under ``DistributedReadingService``, else ``()``). With ``replay``
    the reader reads and drops its first ``after`` items instead of seeking.
    """
    items, _ = logical_reader(
        core, plan, reader, num_readers, world_size=world_size, after=after, replay=replay
    )
    return items


@dataclasses.dataclass
class ReaderGraph:
    """What a lease's bundles read of its reader's graph besides the items, found once.

    ``counters``: the stages' skip counters; ``flows``: the stages that count what they drop
    (:func:`~shardpipes.dataloader2._stats.flow_stages`); ``reporter``: telemetry's worker side,
    when it is on (made in the thread that iterates the graph; :meth:`close` stops it).
    """

    counters: list[SkipStats]
    flows: list[Any]
    reporter: WorkerReporter | None = None

    def close(self) -> None:
        """Stop the reporter's stack sampler."""
        if self.reporter is not None:
            self.reporter.close()


def logical_reader(
    core: IterDataPipe[Any],
    plan: EpochPlan,
    reader: int,
    num_readers: int,
    *,
    world_size: int = 1,
    after: int = 0,
    replay: bool = False,
    init_fn: InitFn | None = None,
    reset_fn: ResetFn | None = None,
    telemetry: TelemetryOn | None = None,
) -> tuple[Iterator[Any], ReaderGraph]:
    """:func:`logical_items`, with what else the lease reads of the reader's graph, and the user's hooks.

    ``init_fn`` and ``reset_fn`` are the worker pool's ``worker_init_fn`` and
    ``worker_reset_fn``, called as a worker process calls them for worker ``reader`` (after
    the sharding; after the epoch's plan, with the reader's seed generator), once for each
    lease: every lease makes its own copy of the graph. ``telemetry``: make the graph's
    reporter, in this thread (call this in the thread that will iterate the items).
    """
    info = WorkerInfo(num_readers, reader)
    with _GRAPHS:
        graph = shard_for_worker(copy_graph(core), num_readers, reader)
        if init_fn is not None:
            graph = init_fn(graph, info)
        spawned = plan.spawn(reader)
        if replay:
            apply_epoch_plan(graph, spawned)
        else:
            apply_epoch_plan(graph, reader_plan_for(plan, reader, num_readers, world_size, after))
        if reset_fn is not None:
            graph = reset_fn(graph, info, SeedGenerator.from_plan(spawned))
        found = ReaderGraph(skip_counters(graph), flow_stages(graph))
        if telemetry is not None:
            # Ray's code sends the bundles in this thread, between the graph's items
            found.reporter = WorkerReporter(
                graph, *telemetry, shared=_shared_storage(), task_thread=True
            )
        items = _one_at_a_time(iter(graph))
    return (itertools.islice(items, after, None) if replay else items), found


_SHARED: list[SharedStorage] = []


def _shared_storage() -> SharedStorage:
    """The process's storage counters, shared out among its leases' reporters (made once)."""
    if not _SHARED:  # under _GRAPHS: one thread at a time
        _SHARED.append(SharedStorage())
    return _SHARED[0]


# torch's graph walk (traverse_dps) sets a class-wide pickling hook while it runs, so two threads
# walking or copying graphs at once break each other ("Attempt to override existing
# reduce_ex_hook"); a stage may walk its graph when it starts (mix() finds its sharders). A
# reader actor runs several logical readers in threads: one of them at a time touches a graph.
_GRAPHS = threading.Lock()


def _one_at_a_time(items: Iterator[Any]) -> Iterator[Any]:
    while True:
        with _GRAPHS:
            try:
                item = next(items)
            except StopIteration:
                return
        yield item


@dataclasses.dataclass(frozen=True)
class Bundle:
    """Consecutive items of one lease: items ``start`` .. ``start + len(items) - 1`` of its reader.

    ``end`` is the reader's item count when its epoch ends after these items, else ``-1``.
    ``skips``: ``(n, counters)`` when the reader's skip counters moved: as of its first ``n``
    items, they were ``counters`` (a :func:`~shardpipes.dataloader2._stats.skips_to_dict`).
    ``flows``: with the end, the drop totals of the lease's stages over the reader's epoch
    (:func:`~shardpipes.dataloader2._stats.flows_to_list`), as a worker sends them at its end.
    ``figures``: telemetry's report of the lease, every so often when it is on.
    """

    reader: int
    fence: int
    start: int
    items: list[Any]
    end: int = -1
    skips: tuple[tuple[int, dict[str, Any]], ...] = ()
    flows: list[list[Any]] | None = None
    figures: dict[str, Any] | None = None


def reader_bundles(
    items: Iterator[Any],
    reader: int,
    fence: int,
    start: int,
    size: int,
    counters: list[SkipStats] | None = None,
    *,
    flows: list[Any] | None = None,
    report: Callable[[float, int, bool], dict[str, Any] | None] | None = None,
) -> Iterator[Bundle]:
    """``items`` (those of ``reader`` from item ``start`` on) in bundles of ``size``, the last marked ``end``.

    ``counters``: the skip counters of the graph making ``items``, read after every item (and
    at the end); a bundle carries them as of each item after which their sum moved.
    ``flows``: the graph's stages that count their drops, whose totals the last bundle carries.
    ``report``: telemetry's worker side, given each bundle's making time and size (as a
    worker's bundle loop gives it, ``dataloader2/workers/bundles.py``).
    """
    counters = counters or []
    seen = 0
    at = start
    while True:
        out: list[Any] = []
        skips: list[tuple[int, dict[str, Any]]] = []
        ended = False
        began = time.perf_counter()
        for item in items:
            out.append(item)
            if counters:
                total = sum(c.samples + c.shards for c in counters)
                if total != seen:
                    seen = total
                    skips.append((at + len(out), skips_to_dict(merge_skips(counters))))
            if len(out) == size:
                break
        else:
            ended = True
            total = sum(c.samples + c.shards for c in counters)
            if total != seen:  # skipped after the reader's last item
                skips.append((at + len(out), skips_to_dict(merge_skips(counters))))
        took = time.perf_counter() - began
        figures = report(took, len(out), ended) if report is not None else None
        if ended:
            totals = flows_to_list(read_flows(flows)) if flows is not None else None
            yield Bundle(reader, fence, at, out, at + len(out), tuple(skips), totals, figures)
            return
        yield Bundle(reader, fence, at, out, -1, tuple(skips), None, figures)
        at += len(out)
