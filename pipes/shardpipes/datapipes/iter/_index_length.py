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

from shardpipes._resume import Shape
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

__all__ = ["exact_length_plan", "index_length", "resume_shape"]

Plan = tuple[int | None, bool]

# Stages that yield exactly one item per item they read (decode may skip under a handler;
# the exact-length guard then pads).
_ONE_TO_ONE = (
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


def _source(dp: Any) -> Any:
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
    while isinstance(node, (*_ONE_TO_ONE, Batcher, LeanBatcherIterDataPipe)):
        if isinstance(node, Batcher | LeanBatcherIterDataPipe):
            if batch[0] is not None:
                return None  # two batch() stages: counts no longer follow from the index
            batch = (node.batch_size, node.drop_last)
        node = _source(node)
    for kind in _RANGE_TO_SAMPLES:
        if not isinstance(node, kind):
            return None
        node = _source(node)
    return batch


def _main_side(dp: Any) -> bool:
    # Stages the reading services add around the reader's graph (they pass items through).
    from shardpipes.dataloader2._worker import WorkerPoolIterDataPipe
    from shardpipes.datapipes.iter.prefetch import PinMemoryIterDataPipe
    from shardpipes.datapipes.iter.sync import ExactLengthIterDataPipe

    if isinstance(dp, PrefetcherIterDataPipe):  # main_prefetch_cnt's, over the worker pool
        return isinstance(dp.source_datapipe, WorkerPoolIterDataPipe)
    return isinstance(dp, ExactLengthIterDataPipe | PinMemoryIterDataPipe | WorkerPoolIterDataPipe)


def resume_shape(datapipe: IterDataPipe[Any]) -> tuple[Shape, Any] | str:
    """``(shape, sample shuffle stage or None)`` when an epoch of this graph can be resumed by seeking.

    That is the graph of :func:`exact_length_plan` (``sharding_by_index`` ... one-to-one stages,
    at most one ``batch()``) with no random stage after the sharder other than at most one
    ``shuffle()`` before the ``batch()``. Otherwise, the reason it cannot, for error messages.
    """
    from shardpipes.dataloader2.seeding import random_stages
    from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe

    node: Any = datapipe
    while _main_side(node) or isinstance(node, FullSyncIterDataPipe):
        if isinstance(node, FullSyncIterDataPipe):
            return "fullsync() evens out the ranks by dropping or repeating items as they come"
        node = _source(node)
    plan = exact_length_plan(node)
    if plan is None:
        return (
            "the graph is not sharding_by_index -> open_files_by_fsspec -> load_from_tar -> "
            "webdataset followed only by one-to-one stages and at most one batch()"
        )
    shuffler = None
    below_batch = plan[0] is None  # walking from the output: the batch() comes first
    stage = node
    while not isinstance(stage, IndexSharderIterDataPipe):
        if isinstance(stage, Batcher | LeanBatcherIterDataPipe):
            below_batch = True
        elif callable(getattr(stage, "set_seed", None)):
            kind = type(stage).__name__
            if not isinstance(stage, Shuffler | LeanShufflerIterDataPipe) or not below_batch:
                return f"{kind} after the batch() draws per batch and cannot be repositioned"
            if shuffler is not None:
                return "two shuffle() stages after sharding_by_index"
            shuffler = stage
        stage = _source(stage)
    stages = [dp for dp, _ in random_stages(datapipe)]
    number = next((i for i, dp in enumerate(stages) if dp is shuffler), None)
    buffer = None
    if shuffler is not None and shuffler._enabled:
        buffer = shuffler.buffer_size
    return Shape(plan[0], plan[1], buffer, number if buffer else None), (
        shuffler if buffer else None
    )


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
    per = sharders[0].per_reader
    batch_size, drop_last = plan
    if batch_size is None:
        return per
    return per // batch_size if drop_last else -(-per // batch_size)
