"""Epoch lengths known from the shard index: which graphs allow it, and the length.

With ``sharding_by_index`` every reader gets the same number of samples, known once the sharder
has partitioned the epoch. Through one-to-one stages and at most one ``batch()`` that number
becomes the reader's item count, used by ``DistributedReadingService`` (exact equal lengths
without per-chunk synchronisation) and by ``fixed_length()`` without a length.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Mapper, Shuffler
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes.datapipes.iter._lean import (
    LeanBatcherIterDataPipe,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
)
from shardpipes.datapipes.iter.batch import InBatchShufflerIterDataPipe
from shardpipes.datapipes.iter.decode import DecoderIterDataPipe
from shardpipes.datapipes.iter.fsspec import FSSpecFileOpenerIterDataPipe
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.datapipes.iter.prefetch import PrefetcherIterDataPipe
from shardpipes.datapipes.iter.tar import TarArchiveLoaderIterDataPipe
from shardpipes.datapipes.iter.threadpool import ThreadPoolMapperIterDataPipe
from shardpipes.datapipes.iter.webdataset import WebDatasetIterDataPipe
from shardpipes.plan.readers import batches

__all__ = ["ONE_TO_ONE", "exact_length_plan", "index_length", "source_of"]

Plan = tuple[int | None, bool]

# Stages that yield exactly one item per item they read (decode may skip under a handler;
# the exact-length guard then pads).
ONE_TO_ONE = (
    Mapper,
    Shuffler,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
    DecoderIterDataPipe,
    PrefetcherIterDataPipe,
    ThreadPoolMapperIterDataPipe,
    InBatchShufflerIterDataPipe,
)
# From sample ranges to samples: each range of k samples becomes k samples.
_RANGE_TO_SAMPLES = (
    WebDatasetIterDataPipe,
    TarArchiveLoaderIterDataPipe,
    FSSpecFileOpenerIterDataPipe,
    IndexSharderIterDataPipe,
)


def source_of(dp: Any) -> Any:
    # Not `a or b`: truth-testing a DataPipe calls its __len__, which may raise.
    src = getattr(dp, "source_datapipe", None)
    return src if src is not None else getattr(dp, "datapipe", None)


def exact_length_plan(datapipe: IterDataPipe[Any]) -> Plan | None:
    """``(batch_size, drop_last)`` when every reader's length is known from the index, else ``None``.

    That is when the graph is ``sharding_by_index -> open -> load_from_tar -> webdataset``
    followed only by one-to-one stages and at most one ``batch()``.
    """
    node: Any = datapipe
    batch: Plan = (None, False)
    while isinstance(node, (*ONE_TO_ONE, Batcher, LeanBatcherIterDataPipe)):
        if isinstance(node, Batcher | LeanBatcherIterDataPipe):
            if batch[0] is not None:
                return None  # two batch() stages: counts no longer follow from the index
            batch = (node.batch_size, node.drop_last)
        node = source_of(node)
    for kind in _RANGE_TO_SAMPLES:
        if not isinstance(node, kind):
            return None
        node = source_of(node)
    return batch


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
