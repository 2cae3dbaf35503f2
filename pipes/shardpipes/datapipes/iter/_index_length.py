"""Epoch lengths known from the shard index: which graphs allow it, and the length.

With ``sharding_by_index`` every reader gets the same number of samples, known once the sharder
has partitioned the epoch. Through one-to-one stages (each declares it: the trait ``one_to_one``
of ``datapipes/iter/base.py``) and at most one ``batch()`` that number
becomes the reader's item count, used by ``DistributedReadingService`` (exact equal lengths
without per-chunk synchronisation) and by ``fixed_length()`` without a length.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes.datapipes.iter._lean import LeanBatcherIterDataPipe
from shardpipes.datapipes.iter.base import is_one_to_one, range_step
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.plan.readers import batches

__all__ = ["exact_length_plan", "index_length", "source_of"]

Plan = tuple[int | None, bool]


def source_of(dp: Any) -> Any:
    # Not `a or b`: truth-testing a DataPipe calls its __len__, which may raise.
    src = getattr(dp, "source_datapipe", None)
    return src if src is not None else getattr(dp, "datapipe", None)


def exact_length_plan(datapipe: IterDataPipe[Any]) -> Plan | None:
    """``(batch_size, drop_last)`` when every reader's length is known from the index, else ``None``.

    That is when the graph is ``sharding_by_index -> open -> load_from_tar -> webdataset`` (the
    stages whose trait ``range_to_samples`` leads from ranges to samples) followed only by
    one-to-one stages (trait ``one_to_one``) and at most one ``batch()``.
    """
    node: Any = datapipe
    batch: Plan = (None, False)
    while is_one_to_one(node) or isinstance(node, Batcher | LeanBatcherIterDataPipe):
        if isinstance(node, Batcher | LeanBatcherIterDataPipe):
            if batch[0] is not None:
                return None  # two batch() stages: counts no longer follow from the index
            batch = (node.batch_size, node.drop_last)
        node = source_of(node)
    # Down the steps that turn each range of k samples into k samples (trait range_to_samples),
    # to the sharder: webdataset <- load_from_tar <- open_files_by_fsspec <- sharding_by_index.
    wanted = "samples"
    while (step := range_step(node)) is not None and step[1] == wanted:
        if isinstance(node, IndexSharderIterDataPipe):
            return batch
        wanted = step[0]
        node = source_of(node)
    return None


def index_length(datapipe: IterDataPipe[Any], plan: Plan) -> int:
    """This reader's item count for the epoch the graph's ``sharding_by_index`` has partitioned.

    Raises:
        RuntimeError: The graph has no (or several) ``sharding_by_index``, or it has not
            partitioned this epoch yet (nothing was pulled through it).
    """
    sharders = [
        dp
        for dp in get_all_graph_pipes(traverse_dps(datapipe))
        if isinstance(dp, IndexSharderIterDataPipe)
    ]
    if len(sharders) != 1 or sharders[0].per_reader is None:
        raise RuntimeError(
            "an index length needs exactly one sharding_by_index stage, iterated first"
        )
    return batches(sharders[0].per_reader, *plan)
