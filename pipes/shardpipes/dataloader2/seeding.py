"""Seeds for every random stage of a graph, from one loader seed.

The only source of randomness is the loader's seed and the epoch number. Each random stage
(anything with ``set_seed``) gets a seed made by ``numpy.random.SeedSequence`` from structured
parts, never by adding numbers:

- stages *before* ``sharding_filter`` (shard-order shuffles): ``[seed, epoch, stage, 0]``,
  the same on every rank and worker, so all readers agree on the shard order;
- stages *after* it (sample buffers): ``[seed, epoch, stage, 1, rank, worker]``, distinct per
  reader.

``stage`` numbers the random stages from the source side of the graph (the reverse of a
depth-first walk from the output), the same in every process that holds a copy of the graph.
So in the usual graph, ``IterableWrapper(urls).shuffle().sharding_filter()...``, the
shard-level shuffle is stage 0 whatever follows it, and ``shardpipes splits`` can preview its
order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import _ShardingIterDataPipe
from torch.utils.data.graph import DataPipeGraph, traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes._resume import Segment
from shardpipes._seeds import derive_seed, reader_stage_seed

__all__ = ["SeedGenerator", "has_sharding", "random_stages", "seed_graph"]


@dataclass(frozen=True)
class SeedGenerator:
    """The loader seed and epoch, plus the reader path (rank, worker) spawned so far.

    Reading services pass it down: ``DistributedReadingService`` spawns the rank,
    ``MultiProcessingReadingService`` the worker.
    """

    seed: int
    epoch: int
    path: tuple[int, ...] = ()
    #: For an epoch resumed from a loader state with a shard index: its stretches so far
    #: (``shardpipes._resume``); empty otherwise.
    resume: tuple[Segment, ...] = ()

    def spawn(self, index: int) -> SeedGenerator:
        """Return the generator of child ``index`` (a rank, then a worker)."""
        return SeedGenerator(self.seed, self.epoch, (*self.path, index), self.resume)

    def shared_seed(self, stage: int) -> int:
        """Seed for random stage ``stage`` before ``sharding_filter``: equal on all readers."""
        return derive_seed([self.seed, self.epoch, stage, 0])

    def reader_seed(self, stage: int) -> int:
        """Seed for random stage ``stage`` after ``sharding_filter``: distinct per reader."""
        return reader_stage_seed(self.seed, self.epoch, stage, self.path)

    def torch_seed(self) -> int:
        """Seed for the ``torch.Generator`` handed to worker processes (their global RNGs)."""
        return derive_seed([self.seed, self.epoch, 2**32 - 1, *self.path])


def _walk(graph: DataPipeGraph) -> Iterator[tuple[Any, bool]]:
    # graph maps id -> (datapipe, subgraph of its sources). A stage is "after sharding" when a
    # sharding stage lies between it and the sources, i.e. somewhere in its own subgraph.
    for dp, sources in graph.values():
        below = has_sharding(sources)
        yield dp, below
        yield from _walk(sources)


def has_sharding(graph: DataPipeGraph) -> bool:
    """Whether a sharding stage (``sharding_filter``, ``sharding_by_index``) is in ``graph``."""
    return any(
        isinstance(dp, _ShardingIterDataPipe) or has_sharding(sources)
        for dp, sources in graph.values()
    )


def random_stages(datapipe: IterDataPipe[Any]) -> list[tuple[Any, bool]]:
    """Return ``(stage, after_sharding)`` for every stage with ``set_seed``, in a stable order.

    A stage reachable along several paths (after ``fork``) is listed once.
    """
    seen: set[int] = set()
    out = []
    for dp, after in _walk(traverse_dps(datapipe)):
        if id(dp) in seen or not callable(getattr(dp, "set_seed", None)):
            continue
        seen.add(id(dp))
        out.append((dp, after))
    out.reverse()  # number from the source side
    return out


def seed_graph(datapipe: IterDataPipe[Any], generator: SeedGenerator) -> IterDataPipe[Any]:
    """Seed every random stage of ``datapipe`` for one epoch on one reader; return it.

    When the generator carries a resumed epoch, also tell the graph's ``sharding_by_index``
    where that epoch stopped (it then seeks there instead of starting over).
    """
    for stage, (dp, after) in enumerate(random_stages(datapipe)):
        dp.set_seed(generator.reader_seed(stage) if after else generator.shared_seed(stage))
    from shardpipes.datapipes.iter._index_length import resume_shape
    from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe, Resume

    sharders = [
        dp
        for dp in get_all_graph_pipes(traverse_dps(datapipe))
        if isinstance(dp, IndexSharderIterDataPipe)
    ]
    for sharder in sharders:
        sharder.resume = None
    if generator.resume:
        found = resume_shape(datapipe)
        if isinstance(found, str) or len(sharders) != 1:
            raise ValueError(f"this graph cannot resume an epoch by seeking: {found}")
        shape, shuffler = found
        sharders[0].resume = Resume(
            generator.resume, shape, shuffler, generator.seed, generator.epoch
        )
    return datapipe
