"""Everything the loader does to a graph: rewrite it, walk it, and hand it each epoch's plan.

Also torchdata 0.9's ``dataloader2.graph`` (``find_dps``, ``list_dps``, ``remove_dp``,
``replace_dp``, ``traverse_dps``, ``set_graph_random_seed``, ... in ``utils.py`` and
``settings.py``).

The one module that walks or rewrites a user's DataPipe graph (torch's ``traverse_dps``):

- :func:`lean_graph`: swap torch's ``shuffle``/``batch``/``map``/``filter`` for the lean stages
  (``datapipes/iter/_lean.py``) in the loader's deep copy;
- :func:`random_stages`, :func:`has_sharding`: which stages are random, and on which side of the
  sharding stage they sit;
- :func:`apply_epoch_plan`: hand one reader's graph its :class:`~shardpipes.plan.epoch.EpochPlan`
  for an epoch: seeds for every random stage and, for a resumed epoch, the same
  :class:`~shardpipes.plan.epoch.Resume` value to ``sharding_by_index`` and the sample shuffle;
- :func:`resume_shape`: whether (and how) an epoch of this graph can be resumed by seeking;
- :func:`refuse_unsupported`: the combinations that would yield wrong data, refused with why.

Seeds: stages *before* ``sharding_filter`` (shard-order shuffles) get ``[seed, epoch, stage, 0]``,
the same on every rank and worker, so all readers agree on the shard order; stages *after* it
(sample buffers) get ``[seed, epoch, stage, 1, rank, worker]``, distinct per reader. ``stage``
numbers the random stages from the source side of the graph (the reverse of a depth-first walk
from the output), the same in every process that holds a copy of the graph. So in the usual
graph, ``IterableWrapper(urls).shuffle().sharding_filter()...``, the shard-level shuffle is stage
0 whatever follows it, and ``shardpipes splits`` can preview its order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Filter, Mapper, Shuffler
from torch.utils.data.datapipes.iter.sharding import _ShardingIterDataPipe
from torch.utils.data.graph import DataPipe, DataPipeGraph, traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes.dataloader2.graph.mixing import apply_mix_plan, mixture_shape
from shardpipes.dataloader2.graph.settings import set_datapipes_seed, set_graph_random_seed
from shardpipes.dataloader2.graph.utils import find_dps, list_dps, remove_dp, replace_dp
from shardpipes.datapipes.iter._index_length import exact_length_plan, source_of
from shardpipes.datapipes.iter._lean import (
    LeanBatcherIterDataPipe,
    LeanFilterIterDataPipe,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
)
from shardpipes.datapipes.iter._unhooked import torch_kind
from shardpipes.datapipes.iter.base import in_main_process, is_resumable
from shardpipes.datapipes.iter.cache import OnDiskCacheHolderIterDataPipe
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.datapipes.iter.length import FixedLengthIterDataPipe
from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe
from shardpipes.plan.epoch import EpochPlan, Resume
from shardpipes.plan.resume import Shape

__all__ = [
    # torchdata 0.9's dataloader2.graph
    "DataPipe",
    "DataPipeGraph",
    # ours
    "apply_epoch_plan",
    "carries_across_epochs",
    "find_dps",
    "has_sharding",
    "lean_graph",
    "list_dps",
    "random_stages",
    "refuse_unsupported",
    "remove_dp",
    "replace_dp",
    "resume_shape",
    "set_datapipes_seed",
    "set_graph_random_seed",
    "stages_of",
    "traverse_dps",
]


def stages_of(datapipe: IterDataPipe[Any]) -> list[Any]:
    """Every stage of the graph that ends in ``datapipe`` (each once)."""
    return list(get_all_graph_pipes(traverse_dps(datapipe)))


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


def apply_epoch_plan(datapipe: IterDataPipe[Any], plan: EpochPlan) -> IterDataPipe[Any]:
    """Hand one reader's graph its plan for an epoch; return it.

    Seeds every random stage. When the plan resumes a saved epoch, gives ``sharding_by_index``
    and the resumable stages after it (the sample shuffle, a counter) one :class:`Resume` value
    (they then continue where the epoch stopped); otherwise tells them to start afresh.
    """
    for stage, (dp, after) in enumerate(random_stages(datapipe)):
        dp.set_seed(plan.reader_seed(stage) if after else plan.shared_seed(stage))
    # (torch's own shuffle is resumable through its lean stand-in, swapped in by lean_graph)
    resumable = [dp for dp in stages_of(datapipe) if is_resumable(dp)]
    for dp in resumable:
        if callable(getattr(dp, "set_resume", None)):
            dp.set_resume(None)
    sharders = [dp for dp in resumable if isinstance(dp, IndexSharderIterDataPipe)]
    if apply_mix_plan(datapipe, plan, random_stages):  # a mixture: mix() plans its sources' reads
        return datapipe
    if plan.resume:
        found = resume_shape(datapipe)
        if isinstance(found, str) or len(sharders) != 1:
            raise ValueError(f"this graph cannot resume an epoch by seeking: {found}")
        shape, shuffler = found
        resume = Resume(plan.resume, shape, plan.seed, plan.epoch, plan.after)
        sharders[0].set_resume(resume)
        if shuffler is not None:
            shuffler.set_resume(resume)
        for dp in _counters(datapipe):
            dp.set_resume(resume)
    return datapipe


def _name(dp: Any) -> str:
    return (
        "sharding_by_index()" if isinstance(dp, IndexSharderIterDataPipe) else "sharding_filter()"
    )


def _first(graph: DataPipeGraph, kind: type | tuple[type, ...]) -> Any:
    for dp, sources in graph.values():
        if isinstance(dp, kind):
            return dp
        found = _first(sources, kind)
        if found is not None:
            return found
    return None


def refuse_unsupported(datapipe: IterDataPipe[Any]) -> None:
    """Raise ``ValueError`` for a graph shape that would yield wrong data, saying why and what to write.

    - two sharding stages on one path (``sharding_filter`` twice, or with ``sharding_by_index``):
      each reader would keep its share of its share, and most samples would never be read;
    - ``on_disk_cache`` before ``sharding_by_index``: the index names the shards by the URLs
      it was built from, not by cached paths.
    """

    def walk(graph: DataPipeGraph) -> None:
        for dp, sources in graph.values():
            if isinstance(dp, _ShardingIterDataPipe):
                inner = _first(sources, _ShardingIterDataPipe)
                if inner is not None:
                    raise ValueError(
                        f"the graph shards twice on one path ({_name(dp)} after {_name(inner)}): "
                        "each reader would keep only its share of its share, and most samples "
                        "would never be read; keep one sharding stage: sharding_filter() after "
                        "the shard-level stages, or sharding_by_index() in its place"
                    )
                cached = _first(sources, OnDiskCacheHolderIterDataPipe)
                if isinstance(dp, IndexSharderIterDataPipe) and cached is not None:
                    raise ValueError(
                        "on_disk_cache() before sharding_by_index(): the index names the shards "
                        "by their URLs, not by cached paths; put on_disk_cache() after "
                        "sharding_by_index() (it caches whole shards and keeps each reader's "
                        "sample ranges)"
                    )
            walk(sources)

    walk(traverse_dps(datapipe))


def carries_across_epochs(datapipe: IterDataPipe[Any]) -> bool:
    """Whether a stage of the graph continues from one epoch into the next (``fixed_length``)."""
    return any(isinstance(dp, FixedLengthIterDataPipe) for dp in stages_of(datapipe))


def _counters(datapipe: IterDataPipe[Any]) -> list[Any]:
    """The resumable stages between the sharder and the output that are not random (counters)."""
    out = []
    node: Any = datapipe
    while node is not None and not isinstance(node, IndexSharderIterDataPipe):
        if is_resumable(node) and not callable(getattr(node, "set_seed", None)):
            out.append(node)
        node = source_of(node)
    return out


def resume_shape(
    datapipe: IterDataPipe[Any],
) -> tuple[Shape, LeanShufflerIterDataPipe[Any] | Shuffler[Any] | None] | str:
    """``(shape, sample shuffle stage or None)`` when an epoch of this graph can be resumed by seeking.

    That is the graph of :func:`exact_length_plan` (``sharding_by_index`` ... one-to-one stages,
    at most one ``batch()``) under the stages that run in the main process (trait
    ``main_process``: the worker pool, ``pin_memory``, the main read-ahead), with no random
    stage after the sharder other than at most one ``shuffle()`` before the ``batch()``, and any
    other stage that keeps a position between items (trait ``resumable``: ``enumerate()``) after
    that shuffle and before the ``batch()``. Otherwise, the reason it cannot, for error messages.
    """
    mixed = mixture_shape(datapipe, random_stages)
    if mixed is not None:
        return mixed
    node: Any = datapipe
    while in_main_process(node):
        if isinstance(node, FullSyncIterDataPipe):
            return "fullsync() evens out the ranks by dropping or repeating items as they come"
        node = source_of(node)
    plan = exact_length_plan(node)
    if plan is None:
        refusal = next(
            (r for dp in stages_of(node) if (r := getattr(dp, "seek_refusal", None))), None
        )
        if refusal:
            return str(refusal)
        return (
            "the graph is not sharding_by_index -> open_files_by_fsspec -> load_from_tar -> "
            "webdataset followed only by one-to-one stages and at most one batch()"
        )
    shuffler = None
    below_batch = plan[0] is None  # walking from the output: the batch() comes first
    stage = node
    while not isinstance(stage, IndexSharderIterDataPipe):
        kind = type(stage).__name__
        if isinstance(stage, Batcher | LeanBatcherIterDataPipe):
            below_batch = True
        elif callable(getattr(stage, "set_seed", None)):
            if not is_resumable(stage) or not below_batch:
                return f"{kind} after the batch() draws per batch and cannot be repositioned"
            if shuffler is not None:
                return "two shuffle() stages after sharding_by_index"
            shuffler = stage
        elif is_resumable(stage) and (not below_batch or shuffler is not None):
            where = "after the batch()" if not below_batch else "before the shuffle()"
            return f"{kind} {where} counts items in an order a resumed epoch does not repeat"
        stage = source_of(stage)
    stages = [dp for dp, _ in random_stages(datapipe)]
    number = next((i for i, dp in enumerate(stages) if dp is shuffler), None)
    buffer = None
    if shuffler is not None and shuffler._enabled:
        buffer = shuffler.buffer_size
    return Shape(plan[0], plan[1], buffer, number if buffer else None), (
        shuffler if buffer else None
    )


def _lean(dp: Any) -> Any:
    """The lean replacement of ``dp``, or ``None`` when it has none (or uses columns)."""
    kind = torch_kind(type(dp))  # the stage dp.shuffle() builds is a subclass of torch's
    if kind is Shuffler:
        return LeanShufflerIterDataPipe(dp.datapipe, dp.buffer_size, dp._enabled, dp._seed)
    if kind is Batcher:
        return LeanBatcherIterDataPipe(dp.datapipe, dp.batch_size, dp.drop_last, dp.wrapper_class)
    if kind is Mapper and dp.input_col is None and dp.output_col is None:
        return LeanMapperIterDataPipe(dp.datapipe, dp.fn)
    if kind is Filter and dp.input_col is None:
        return LeanFilterIterDataPipe(dp.datapipe, dp.filter_fn)
    return None


def _swap(value: Any, new: dict[int, Any]) -> Any:
    if isinstance(value, IterDataPipe):
        return new.get(id(value), value)
    if isinstance(value, list | tuple) and any(id(v) in new for v in value):
        return type(value)(new.get(id(v), v) for v in value)
    return value


def lean_graph(datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
    """Replace torch's ``shuffle``/``batch``/``map``/``filter`` stages of ``datapipe`` in place; return the root.

    Only for a graph the caller owns (a deep copy): the stages are rewired, not copied.
    """
    nodes = get_all_graph_pipes(traverse_dps(datapipe))
    new = {id(dp): lean for dp in nodes if (lean := _lean(dp)) is not None}
    if not new:
        return datapipe
    for dp in [*nodes, *new.values()]:
        for attr, value in list(vars(dp).items()):
            swapped = _swap(value, new)
            if swapped is not value:
                setattr(dp, attr, swapped)
    root: IterDataPipe[Any] = new.get(id(datapipe), datapipe)
    return root
