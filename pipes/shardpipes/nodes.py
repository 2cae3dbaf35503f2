"""Interoperation with ``torchdata.nodes`` (torchdata >= 0.10).

- :func:`as_node` wraps a shardpipes graph as a ``torchdata.nodes.BaseNode``, so
  ``torchdata.nodes.Loader`` (and anything built on nodes) can drive it, with the same
  sharding, seeding and equal-length guarantees as ``DataLoader2``, and exact checkpoints.
- ``.through_nodes(build)`` (:class:`~shardpipes.datapipes.iter.nodes.NodesAdapterIterDataPipe`)
  runs a piece of a graph through nodes, e.g. a ``ParallelMapper`` decoding images in threads.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch.distributed as dist
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph_settings import apply_sharding
from torchdata.nodes import BaseNode

from shardpipes.dataloader2._stats import check_epoch, flow_stages, read_flows, source_of_graph
from shardpipes.dataloader2.graph import (
    apply_epoch_plan,
    carries_across_epochs,
    lean_graph,
    refuse_unsupported,
)
from shardpipes.datapipes.iter.base import traits_of
from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe, gloo_group
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.restore import Topology

__all__ = ["DataPipeNode", "World", "as_node"]


@dataclass(frozen=True)
class World:
    """Which reader this process is, as the reading services of ``DataLoader2`` would make it.

    ``rank`` of ``world_size``; ``distributed``: whether a ``DistributedReadingService`` would
    run it (it spawns the rank into the seed path even on one rank); ``worker`` of
    ``num_workers`` worker processes (``0``: the rank's own process, no worker part).
    :attr:`topology` is the same split as the loader's one topology value
    (:class:`~shardpipes.plan.restore.Topology`, what reading services answer and states record).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 0
    distributed: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank({self.rank}) should be in [0, world_size({self.world_size}))")
        if self.num_workers < 0 or not 0 <= self.worker < max(self.num_workers, 1):
            raise ValueError(
                f"worker({self.worker}) should be in [0, max(num_workers({self.num_workers}), 1))"
            )

    @property
    def topology(self) -> Topology:
        """This split as the loader's :class:`~shardpipes.plan.restore.Topology`."""
        return Topology(
            ranks=self.world_size,
            readers_per_rank=self.num_workers,
            distributed=self.distributed,
            rank=self.rank,
        )

    @classmethod
    def detect(cls) -> World:
        """Rank and world size from the default ``torch.distributed`` group, if initialised."""
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), distributed=True)
        return cls()

    def seed_generator(self, seed: int, epoch: int) -> EpochPlan:
        """The plan ``DataLoader2`` gives this reader (``EpochPlan.for_reader``: one rule)."""
        t = self.topology
        return EpochPlan.for_reader(
            seed,
            epoch,
            t.rank,
            self.worker,
            distributed=t.distributed,
            num_workers=t.readers_per_rank,
        )


class DataPipeNode(BaseNode[Any]):  # type: ignore[misc]  # torchdata ships no type hints
    """A shardpipes graph as a ``torchdata.nodes.BaseNode``; build it with :func:`as_node`.

    Every ``reset()`` without a state starts a new epoch (with a new order); its state is
    ``{"seed", "epoch", "consumed"}``, restored by replaying the deterministic epoch.
    """

    SEED_KEY, EPOCH_KEY, CONSUMED_KEY = "seed", "epoch", "consumed"

    def __init__(self, datapipe: IterDataPipe[Any], world: World, seed: int) -> None:
        super().__init__()
        self.datapipe = datapipe
        self.world = world
        self.seed = seed
        self._next_epoch = 0
        self._epoch = 0
        self._consumed = 0
        self._it: Iterator[Any] | None = None
        self._flow_stages = flow_stages(datapipe)  # filters and handlers: the empty-epoch check
        self._source = source_of_graph(datapipe)
        self._flows_before: list[Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start the next epoch, or continue from ``initial_state``."""
        super().reset(initial_state)
        skip = 0
        if initial_state is not None:
            missing = {self.SEED_KEY, self.EPOCH_KEY, self.CONSUMED_KEY} - initial_state.keys()
            if missing:
                raise KeyError(f"node state is missing {', '.join(sorted(missing))}")
            if initial_state[self.SEED_KEY] != self.seed:
                raise ValueError(
                    f"node state has seed {initial_state[self.SEED_KEY]}, this node has seed {self.seed}"
                )
            self._next_epoch = int(initial_state[self.EPOCH_KEY])
            skip = int(initial_state[self.CONSUMED_KEY])
        self._epoch = self._next_epoch
        self._next_epoch += 1
        apply_epoch_plan(self.datapipe, self.world.seed_generator(self.seed, self._epoch))
        self._flows_before = read_flows(self._flow_stages) if not skip else None
        self._it = iter(self.datapipe)
        self._consumed = 0
        for _ in itertools.islice(self._it, skip):
            self._consumed += 1
        if self._consumed < skip:
            raise ValueError(
                f"node state says {skip} items were consumed, but epoch {self._epoch} has fewer"
            )

    def next(self) -> Any:
        """Return the next item of the epoch."""
        if self._it is None:
            raise RuntimeError("reset() was not called")
        try:
            item = next(self._it)
        except StopIteration:
            before, self._flows_before = self._flows_before, None
            if before is not None:  # a whole epoch (not a replayed one): did it yield anything?
                after = read_flows(self._flow_stages)
                carried = carries_across_epochs(self.datapipe)
                check_epoch(
                    self._epoch, self._consumed, before, after, self._source, carried=carried
                )
            raise
        self._consumed += 1
        return item

    def get_state(self) -> dict[str, Any]:
        """Return ``{"seed", "epoch", "consumed"}``."""
        return {
            self.SEED_KEY: self.seed,
            self.EPOCH_KEY: self._epoch,
            self.CONSUMED_KEY: self._consumed,
        }


def as_node(
    datapipe: IterDataPipe[Any],
    *,
    rank: int | None = None,
    world_size: int | None = None,
    worker: int = 0,
    num_workers: int = 0,
    distributed: bool | None = None,
    seed: int = 0,
    equal_length: Literal["stop", "pad"] | None = "stop",
    timeout: float = 1800,
) -> DataPipeNode:
    """Wrap a shardpipes graph as a ``torchdata.nodes.BaseNode``.

    The graph is copied, its ``sharding_filter`` applied for this reader (distributed
    priority with ``rank``/``world_size``, multiprocessing priority with
    ``worker``/``num_workers``), random stages seeded per epoch exactly as ``DataLoader2``
    seeds them, and, on several ranks, ``fullsync`` added so every rank yields the same
    number of items.

    Args:
        datapipe: The graph.
        rank: This process's rank. Default: from ``torch.distributed``, else 0.
        world_size: Number of ranks. Default: from ``torch.distributed``, else 1.
        worker: This reader's index among ``num_workers`` on the rank. Default: ``0``.
        num_workers: Readers per rank sharing the graph, as
            ``MultiProcessingReadingService(num_workers)`` would run them (``0``, the default:
            the rank reads in its own process; ``1``: one worker, seeded as a worker).
        distributed: Seed as under ``DistributedReadingService`` (the rank is part of every
            reader's seed path, even on one rank). Default: when ``torch.distributed`` is
            initialised or ``world_size > 1``.
        seed: The loader seed. Default: ``0``.
        equal_length: ``"stop"`` (default), ``"pad"``, or ``None`` to skip the synchronisation.
        timeout: Seconds to wait for other ranks when synchronising. Default: ``1800``.

    Returns:
        DataPipeNode: A node for ``torchdata.nodes.Loader`` or other nodes.

    Examples:
        >>> from torchdata.nodes import Loader
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> from shardpipes.nodes import as_node
        >>> loader = Loader(as_node(IterableWrapper(range(6)).shuffle().batch(3), seed=1))
        >>> sorted(x for batch in loader for x in batch)
        [0, 1, 2, 3, 4, 5]
    """
    detected = World.detect()
    world = World(
        rank=detected.rank if rank is None else rank,
        world_size=detected.world_size if world_size is None else world_size,
        worker=worker,
        num_workers=num_workers,
        distributed=(
            detected.distributed or (world_size or 1) > 1 if distributed is None else distributed
        ),
    )
    topology = world.topology
    refuse_unsupported(datapipe)
    graph = lean_graph(copy.deepcopy(datapipe))
    # apply_sharding configures the graph in place (it returns the same root).
    if topology.ranks > 1:
        apply_sharding(graph, topology.ranks, topology.rank, SHARDING_PRIORITIES.DISTRIBUTED)
    if topology.readers_per_rank > 1:
        workers = topology.readers_per_rank
        apply_sharding(graph, workers, world.worker, SHARDING_PRIORITIES.MULTIPROCESSING)
    if equal_length is not None and topology.ranks > 1 and not traits_of(graph).syncs_ranks:
        graph = FullSyncIterDataPipe(graph, timeout, policy=equal_length)
        graph.set_process_group(gloo_group(timeout))
    if not isinstance(graph, IterDataPipe):
        raise TypeError(f"as_node needs an IterDataPipe graph, got {type(graph).__name__}")
    return DataPipeNode(graph, world, seed)
