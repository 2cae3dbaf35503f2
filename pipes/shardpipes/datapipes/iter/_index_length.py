"""Epoch lengths known from the shard index: which graphs allow it, and the length.

With ``sharding_by_index`` every reader gets the same number of samples, known once the sharder
has partitioned the epoch. Through one-to-one stages (each declares it: the trait ``one_to_one``
of ``datapipes/iter/base.py``) and at most one stage that ``batches`` that number becomes the
reader's item count, used by ``DistributedReadingService`` (exact equal lengths without
per-chunk synchronisation) and by ``fixed_length()`` without a length. Both are queries on the
graph's description (``_description.py``).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import GraphDescription, Plan, describe, source_of
from shardpipes.plan.readers import batches

__all__ = ["exact_length_plan", "index_length", "source_of"]


def _described(graph: IterDataPipe[Any] | GraphDescription) -> GraphDescription:
    return graph if isinstance(graph, GraphDescription) else describe(graph)


def exact_length_plan(datapipe: IterDataPipe[Any] | GraphDescription) -> Plan | None:
    """``(batch_size, drop_last)`` when every reader's length is known from the index, else ``None``.

    That is when the graph is ``sharding_by_index -> open -> load_from_tar -> webdataset`` (the
    stages whose trait ``range_to_samples`` leads from ranges to samples) followed only by
    one-to-one stages (trait ``one_to_one``) and at most one ``batch()`` (trait ``batches``).
    """
    graph = (
        datapipe if isinstance(datapipe, GraphDescription) else describe(datapipe, main_path=True)
    )
    return graph.exact_length_plan()


def index_length(datapipe: IterDataPipe[Any] | GraphDescription, plan: Plan) -> int:
    """This reader's item count for the epoch the graph's ``sharding_by_index`` has partitioned.

    Raises:
        RuntimeError: The graph has no (or several) ``sharding_by_index``, or it has not
            partitioned this epoch yet (nothing was pulled through it).
    """
    sharders = _described(datapipe).index_sharders()
    if len(sharders) != 1 or sharders[0].per_reader is None:
        raise RuntimeError(
            "an index length needs exactly one sharding_by_index stage, iterated first"
        )
    return batches(sharders[0].per_reader, *plan)
