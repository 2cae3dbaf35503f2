"""Run part of a graph through ``torchdata.nodes`` (functional name: ``through_nodes``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterDataPipe
from torchdata.nodes import BaseNode
from torchdata.nodes import IterableWrapper as NodeIterableWrapper

from shardpipes.datapipes.iter.base import StageIterDataPipe, check_picklable_fn, register

__all__ = ["NodesAdapterIterDataPipe"]


@register("through_nodes")
class NodesAdapterIterDataPipe(StageIterDataPipe[Any]):
    """Run the items through a ``torchdata.nodes`` node built on them (functional name: ``through_nodes``).

    ``build`` receives the upstream items as a ``BaseNode`` and returns the node whose output
    this stage yields, for example a ``ParallelMapper`` that decodes images in threads.

    Args:
        source_datapipe: The source.
        build: A module-level callable (or ``functools.partial``) ``BaseNode -> BaseNode``.

    Examples:
        >>> import functools
        >>> from torchdata.nodes import ParallelMapper
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> build = functools.partial(ParallelMapper, map_fn=abs, num_workers=2, method="thread")
        >>> list(IterableWrapper([-1, -2, 3]).through_nodes(build))
        [1, 2, 3]
    """

    def __init__(
        self, source_datapipe: IterDataPipe[Any], build: Callable[[BaseNode[Any]], BaseNode[Any]]
    ) -> None:
        check_picklable_fn(build, "through_nodes build")
        self.source_datapipe = source_datapipe
        self.build = build

    def __iter__(self) -> Iterator[Any]:
        node = self.build(NodeIterableWrapper(self.source_datapipe))
        node.reset(None)
        yield from node
