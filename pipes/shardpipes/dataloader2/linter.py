"""torchdata 0.9's graph lints: checks a loader can make on a graph before it runs it."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.graph import DataPipeGraph, traverse_dps

from shardpipes.datapipes.iter.base import traits_of

__all__ = ["_check_shuffle_before_sharding"]


def _every_path_shuffled(graph: DataPipeGraph) -> bool:
    # True when every path from here down to a source passes a shuffle stage (a buffered
    # shuffle: trait seeks="buffer", which torch's shuffle takes from its lean stand-in).
    if not graph:
        return False  # a source reached with no shuffle on the way
    return all(
        traits_of(dp).seeks == "buffer" or _every_path_shuffled(sources)
        for dp, sources in graph.values()
    )


def _sharding_shuffled(graph: DataPipeGraph) -> bool:
    return all(
        (not traits_of(dp).sharding or _every_path_shuffled(sources))
        and _sharding_shuffled(sources)
        for dp, sources in graph.values()
    )


def _check_shuffle_before_sharding(datapipe: IterDataPipe[Any]) -> bool:
    """Whether every sharding stage has a shuffle on every path between it and the sources.

    Without one, each reader's share of an epoch is the same every epoch (0.9's lint; a graph
    with no sharding stage passes).
    """
    return _sharding_shuffled(traverse_dps(datapipe))
