"""Everything the loader does to a graph: rewrite it, ask about it, and hand it each epoch's plan.

Also torchdata 0.9's ``dataloader2.graph`` (``find_dps``, ``list_dps``, ``remove_dp``,
``replace_dp``, ``traverse_dps``, ``set_graph_random_seed``, ... in ``utils.py`` and
``settings.py``).

Every question is a query on the graph's one description (:func:`describe`, built from the
traits the stages declare, ``datapipes/iter/_description.py``); the functions here take a graph
or a description already built, and no module keeps a list of stage classes:

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

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Filter, Mapper, Shuffler
from torch.utils.data.graph import DataPipe, DataPipeGraph, traverse_dps

from shardpipes.dataloader2.graph.mixing import apply_mix_plan, mixture_shape
from shardpipes.dataloader2.graph.settings import set_datapipes_seed, set_graph_random_seed
from shardpipes.dataloader2.graph.utils import find_dps, list_dps, remove_dp, replace_dp
from shardpipes.datapipes.iter._description import (
    DescribedStage,
    GraphDescription,
    describe,
)
from shardpipes.datapipes.iter._lean import (
    LeanBatcherIterDataPipe,
    LeanFilterIterDataPipe,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
)
from shardpipes.datapipes.iter._unhooked import torch_kind
from shardpipes.datapipes.iter.base import traits_of
from shardpipes.plan.epoch import EpochPlan, Resume
from shardpipes.plan.resume import Shape

__all__ = [
    # torchdata 0.9's dataloader2.graph
    "DataPipe",
    "DataPipeGraph",
    # ours
    "GraphDescription",
    "apply_epoch_plan",
    "carries_across_epochs",
    "describe",
    "find_dps",
    "has_sharding",
    "lean_graph",
    "list_dps",
    "random_stages",
    "refuse_unsupported",
    "registered_names",
    "remove_dp",
    "replace_dp",
    "resume_shape",
    "set_datapipes_seed",
    "set_graph_random_seed",
    "stage_name",
    "stages_of",
    "traverse_dps",
]

Graph = IterDataPipe[Any] | GraphDescription


def registered_names() -> dict[type, str]:
    """Each registered stage class and its functional name (the first, if it has several)."""
    names: dict[type, str] = {}
    for name, fn in IterDataPipe.functions.items():
        args = getattr(fn, "args", None)
        cls = args[0] if args else None
        if isinstance(cls, type):
            names.setdefault(cls, name)
    return names


def stage_name(dp: Any, registered: dict[type, str] | None = None) -> str:
    """``dp``'s functional name (``map``, ``decode``), also for the loader's lean stand-ins.

    The one rule for naming a stage, in warnings, telemetry and ``shardpipes bench --profile``:
    a stage's registered name, or the name of the stage it declares it stands for
    (``stands_for``), or its nearest registered base's. A stage without one is named by its
    class, less ``IterDataPipe`` (``IterableWrapper``). ``registered``: :func:`registered_names`,
    when the caller names many stages.
    """
    names = registered if registered is not None else registered_names()
    kind = type(dp)
    if kind in names:
        return names[kind]
    replaced = getattr(kind, "stands_for", None)
    if isinstance(replaced, type):  # a lean stand-in: the name of the stage it replaces
        if replaced in names:
            return names[replaced]
        # torch's stage runs as our unhooked subclass of it, registered under its name
        found = [name for cls, name in names.items() if torch_kind(cls) is replaced]
        if found:
            return found[0]
    for k in kind.__mro__[1:]:
        if k is not IterDataPipe and k in names:
            return names[k]
    return kind.__name__.removesuffix("IterDataPipe")


def _described(graph: Graph) -> GraphDescription:
    return graph if isinstance(graph, GraphDescription) else describe(graph)


def stages_of(datapipe: Graph) -> list[Any]:
    """Every stage of the graph that ends in ``datapipe`` (each once)."""
    return _described(datapipe).stages


def has_sharding(graph: DataPipeGraph | GraphDescription) -> bool:
    """Whether a sharding stage (``sharding_filter``, ``sharding_by_index``) is in ``graph``.

    ``graph`` is a description, or torch's ``traverse_dps`` graph (0.9's form).
    """
    if isinstance(graph, GraphDescription):
        return graph.has_sharding
    return any(traits_of(dp).sharding or has_sharding(sources) for dp, sources in graph.values())


def random_stages(datapipe: Graph) -> list[tuple[Any, bool]]:
    """Return ``(stage, after_sharding)`` for every stage with ``set_seed``, in a stable order.

    A stage reachable along several paths (after ``fork``) is listed once.
    """
    return _described(datapipe).random_stages()


def apply_epoch_plan(datapipe: IterDataPipe[Any], plan: EpochPlan) -> IterDataPipe[Any]:
    """Hand one reader's graph its plan for an epoch; return it.

    Seeds every random stage. When the plan resumes a saved epoch, gives ``sharding_by_index``
    and the resumable stages after it (the sample shuffle, a counter) one :class:`Resume` value
    (they then continue where the epoch stopped); otherwise tells them to start afresh.
    """
    graph = describe(datapipe)  # one walk per reader and epoch
    for stage, (dp, after) in enumerate(graph.random_stages()):
        dp.set_seed(plan.reader_seed(stage) if after else plan.shared_seed(stage))
    # (torch's own shuffle is resumable through its lean stand-in, swapped in by lean_graph)
    for node in graph.nodes:
        if node.traits.resumable and callable(getattr(node.stage, "set_resume", None)):
            node.stage.set_resume(None)
    if apply_mix_plan(graph, plan):  # a mixture: mix() plans its sources' reads
        return datapipe
    if plan.resume:
        sharders = graph.index_sharders()
        found = resume_shape(graph)
        if isinstance(found, str) or len(sharders) != 1:
            raise ValueError(f"this graph cannot resume an epoch by seeking: {found}")
        shape, shuffler = found
        resume = Resume(plan.resume, shape, plan.seed, plan.epoch, plan.after)
        sharders[0].set_resume(resume)
        if shuffler is not None:
            shuffler.set_resume(resume)
        for dp in _counters(graph):
            dp.set_resume(resume)
    return datapipe


def _name(node: DescribedStage) -> str:
    return "sharding_by_index()" if node.index_sharder else "sharding_filter()"


def _first_below(graph: GraphDescription, at: int, wanted: Any) -> DescribedStage | None:
    # The first stage below nodes[at] (in the description's order) that ``wanted`` accepts.
    below = graph.below(at)
    return next(
        (n for i, n in enumerate(graph.nodes) if i in below and wanted(n)),
        None,
    )


def refuse_unsupported(datapipe: Graph) -> None:
    """Raise ``ValueError`` for a graph shape that would yield wrong data, saying why and what to write.

    - two sharding stages on one path (``sharding_filter`` twice, or with ``sharding_by_index``):
      each reader would keep its share of its share, and most samples would never be read;
    - a stage that ``rewrites_urls`` (``on_disk_cache``) before ``sharding_by_index``: the
      index names the shards by the URLs it was built from, not by cached paths.
    """
    graph = _described(datapipe)
    for at, node in enumerate(graph.nodes):
        if not node.traits.sharding:
            continue
        inner = _first_below(graph, at, lambda n: n.traits.sharding)
        if inner is not None:
            raise ValueError(
                f"the graph shards twice on one path ({_name(node)} after {_name(inner)}): "
                "each reader would keep only its share of its share, and most samples "
                "would never be read; keep one sharding stage: sharding_filter() after "
                "the shard-level stages, or sharding_by_index() in its place"
            )
        cached = _first_below(graph, at, lambda n: n.traits.rewrites_urls)
        if node.index_sharder and cached is not None:
            raise ValueError(
                "on_disk_cache() before sharding_by_index(): the index names the shards "
                "by their URLs, not by cached paths; put on_disk_cache() after "
                "sharding_by_index() (it caches whole shards and keeps each reader's "
                f"sample ranges; the stage that yields cached paths: {cached.name})"
            )


def carries_across_epochs(datapipe: Graph) -> bool:
    """Whether a stage of the graph continues from one epoch into the next (``fixed_length``)."""
    return _described(datapipe).spans_epochs


def _counters(graph: GraphDescription) -> list[Any]:
    """The stages between the sharder and the output that continue a count (``seeks="count"``)."""
    out = []
    for node in graph.path():
        if node.index_sharder:
            break
        if node.traits.seeks == "count":
            out.append(node.stage)
    return out


def resume_shape(
    datapipe: Graph,
) -> tuple[Shape, LeanShufflerIterDataPipe[Any] | Shuffler[Any] | None] | str:
    """``(shape, sample shuffle stage or None)`` when an epoch of this graph can be resumed by seeking.

    That is the graph of :func:`~shardpipes.datapipes.iter._index_length.exact_length_plan`
    (``sharding_by_index`` ... one-to-one stages, at most one ``batch()``) under the stages
    that run in the main process (trait ``main_process``: the worker pool, ``pin_memory``, the
    main read-ahead), with no random stage after the sharder other than at most one buffered
    shuffle (``seeks="buffer"``) before the ``batch()``, and any other stage that keeps a
    position between items (``seeks="count"``: ``enumerate()``) after that shuffle and before
    the ``batch()``. Otherwise, the reason it cannot, for error messages.
    """
    graph = _described(datapipe)
    mixed = mixture_shape(graph)
    if mixed is not None:
        return mixed
    tail = graph.main_tail()
    for node in tail:
        if node.traits.seek_refusal or node.traits.syncs_ranks:
            return node.traits.seek_refusal or (
                f"{node.name} evens out the ranks by dropping or repeating items as they come"
            )
    plan = graph.exact_length_plan(len(tail))
    if plan is None:
        start = graph.chain[len(tail)] if len(tail) < len(graph.chain) else None
        inside = graph.below(start) | {start} if start is not None else set()
        refusal = next(
            (
                n.traits.seek_refusal
                for i, n in enumerate(graph.nodes)
                if i in inside and n.traits.seek_refusal
            ),
            None,
        )
        if refusal:
            return refusal
        return (
            "the graph is not sharding_by_index -> open_files_by_fsspec -> load_from_tar -> "
            "webdataset followed only by one-to-one stages and at most one batch()"
        )
    shuffler: DescribedStage | None = None
    below_batch = plan[0] is None  # walking from the output: the batch() comes first
    for node in graph.path(len(tail)):
        if node.index_sharder:
            break
        traits = node.traits
        if traits.batches:
            below_batch = True
        elif traits.random:
            if traits.seeks != "buffer" or not below_batch:
                return f"{node.name} after the batch() draws per batch and cannot be repositioned"
            if shuffler is not None:
                return "two shuffle() stages after sharding_by_index"
            shuffler = node
        elif traits.resumable and (not below_batch or shuffler is not None):
            where = "after the batch()" if not below_batch else "before the shuffle()"
            return f"{node.name} {where} counts items in an order a resumed epoch does not repeat"
    buffer = _buffer(shuffler)
    if shuffler is None or not buffer:
        return Shape(plan[0], plan[1], None, None), None
    return Shape(plan[0], plan[1], buffer, _number(graph, shuffler.stage)), shuffler.stage


def _buffer(shuffler: DescribedStage | None) -> int | None:
    """The buffer size of a buffered shuffle (``seeks="buffer"``), ``None`` when it is off."""
    if shuffler is None or not getattr(shuffler.stage, "_enabled", True):
        return None
    size: int = shuffler.stage.buffer_size
    return size


def _number(graph: GraphDescription, stage: Any) -> int:
    """``stage``'s number among the graph's random stages (as the loader seeds them)."""
    return next(i for i, (dp, _) in enumerate(graph.random_stages()) if dp is stage)


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
    nodes = describe(datapipe).stages
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
