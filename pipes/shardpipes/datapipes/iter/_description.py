"""One description of a graph, built once from the traits its stages declare.

Every question the loader (and ``fixed_length()``, the exact-length guard, ``mix()``) asks about
a graph is a query on this one value instead of a walk of its own with a list of classes: which
stages are random and on which side of the sharding point they sit, the main path from the
output down to the source, where the reader and the sharder are on it, the stages that stay in
the main process, the mixtures, what a reader's exact length is. The stages say what they are
(traits, ``datapipes/iter/base.py``); a stage a user writes and declares is seen as a built-in
one is.

The description is a snapshot: a graph the loader rewires (lean stand-ins, the id stages, the
stages a reading service adds) is described again. It is built once per graph per question
asked (an epoch's plan, a state), never per item.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.graph import DataPipeGraph, traverse_dps

from shardpipes.datapipes.iter.base import Traits, traits_of

__all__ = ["DescribedStage", "GraphDescription", "describe", "source_of"]

#: ``(batch_size, drop_last)`` of the one ``batch()`` on a reader's counted path (``None``: none).
Plan = tuple[int | None, bool]


def source_of(dp: Any) -> Any:
    """The stage ``dp`` reads from on its main path (``source_datapipe`` or ``datapipe``), or ``None``."""
    # Not `a or b`: truth-testing a DataPipe calls its __len__, which may raise.
    src = getattr(dp, "source_datapipe", None)
    return src if src is not None else getattr(dp, "datapipe", None)


@dataclass(frozen=True, eq=False)
class DescribedStage:
    """One stage of a described graph and what it declares."""

    stage: Any
    traits: Traits
    #: Positions (in :attr:`GraphDescription.nodes`) of the stages it reads from directly.
    sources: tuple[int, ...]
    #: Whether a sharding stage lies between it and the graph's sources (it reads one reader's share).
    after_sharding: bool

    @property
    def name(self) -> str:
        """The stage's class name, for messages."""
        return type(self.stage).__name__

    @property
    def index_sharder(self) -> bool:
        """Whether it is the sharding point that seeks its reads (``sharding_by_index``)."""
        return self.traits.sharding and self.traits.seeks == "reads"

    @property
    def reader(self) -> bool:
        """Whether it makes samples (its ``range_to_samples`` step yields ``"samples"``: ``webdataset()``)."""
        step = self.traits.range_to_samples
        return step is not None and step[1] == "samples"


@dataclass(frozen=True, eq=False)
class GraphDescription:
    """A graph as its stages declare it: each stage once, with its traits and sources.

    Attributes:
        nodes: Every stage once, depth first from the output (the output first), each listed
            where it is first reached.
        chain: The main path: positions of the output, its source, that stage's source, ...
            (``source_datapipe`` or ``datapipe``) down to a stage without one.
    """

    nodes: tuple[DescribedStage, ...]
    chain: tuple[int, ...]
    _where: dict[int, int] = field(repr=False)
    _reach: dict[int, frozenset[int]] = field(default_factory=dict, repr=False)

    @property
    def root(self) -> Any:
        """The output stage."""
        return self.nodes[0].stage if self.nodes else None

    @property
    def stages(self) -> list[Any]:
        """Every stage once, in the order of :attr:`nodes`."""
        return [n.stage for n in self.nodes]

    def position(self, stage: Any) -> int | None:
        """Where ``stage`` is in :attr:`nodes`, or ``None`` when it is not in the graph."""
        return self._where.get(id(stage))

    def node(self, stage: Any) -> DescribedStage | None:
        """The node of ``stage``, or ``None``."""
        at = self.position(stage)
        return None if at is None else self.nodes[at]

    def below(self, at: int) -> frozenset[int]:
        """Positions of every stage ``nodes[at]`` reads from, directly or not (not itself)."""
        found = self._reach.get(at)
        if found is None:
            out: set[int] = set()
            todo = list(self.nodes[at].sources)
            while todo:
                i = todo.pop()
                if i not in out:
                    out.add(i)
                    todo.extend(self.nodes[i].sources)
            found = self._reach[at] = frozenset(out)
        return found

    def within(self, stage: Any) -> list[DescribedStage]:
        """The nodes of the graph that ends in ``stage`` (with it), in the order of :attr:`nodes`."""
        at = self.position(stage)
        if at is None:
            return []
        inside = self.below(at) | {at}
        return [n for i, n in enumerate(self.nodes) if i in inside]

    # --- what the loader asks -------------------------------------------------------------

    @property
    def has_sharding(self) -> bool:
        """Whether the graph has a sharding point (``sharding_filter``, ``sharding_by_index``)."""
        return any(n.traits.sharding for n in self.nodes)

    def random_stages(self) -> list[tuple[Any, bool]]:
        """``(stage, after_sharding)`` for every random stage, numbered from the source side.

        The order is the reverse of :attr:`nodes` (a depth-first walk from the output), the
        same in every process that holds a copy of the graph: the loader's seed numbering.
        """
        return [(n.stage, n.after_sharding) for n in reversed(self.nodes) if n.traits.random]

    def index_sharders(self) -> list[Any]:
        """The ``sharding_by_index`` stages (trait: a sharding point that seeks its reads)."""
        return [n.stage for n in self.nodes if n.index_sharder]

    def mixers(self) -> list[Any]:
        """The ``mix()`` stages (trait ``plans_mixture``)."""
        return [n.stage for n in self.nodes if n.traits.plans_mixture]

    @property
    def spans_epochs(self) -> bool:
        """Whether a stage continues from one epoch into the next (trait ``spans_epochs``)."""
        return any(n.traits.spans_epochs for n in self.nodes)

    def path(self, start: int = 0) -> Iterator[DescribedStage]:
        """The nodes of the main path from its ``start``-th stage down."""
        return (self.nodes[i] for i in self.chain[start:])

    def main_tail(self) -> list[DescribedStage]:
        """The stages at the output end of the main path that stay in the main process."""
        tail = []
        for n in self.path():
            if not n.traits.main_process:
                break
            tail.append(n)
        return tail

    def reader_path(self) -> list[DescribedStage]:
        """The main path from the output down to the reader (the reader last), or ``[]``."""
        out = []
        for n in self.path():
            out.append(n)
            if n.reader:
                return out
        return []

    def counts_from_index(self) -> bool:
        """Whether the main path is ``sharding_by_index`` -> stages that keep the count (a ``mix()`` source).

        Every stage above the sharder is one-to-one or a step of ``range_to_samples``.
        """
        for n in self.path():
            if n.index_sharder:
                return True
            if not (n.traits.one_to_one or n.traits.range_to_samples is not None):
                return False
        return False

    def exact_length_plan(self, start: int = 0) -> Plan | None:
        """``(batch_size, drop_last)`` when a reader's length below ``chain[start]`` follows from the index.

        That is when the main path is ``sharding_by_index`` -> the steps of ``range_to_samples``
        -> one-to-one stages and at most one stage that ``batches``; else ``None``.
        """
        path = list(self.path(start))
        batch: Plan = (None, False)
        i = 0
        while i < len(path) and (path[i].traits.one_to_one or path[i].traits.batches):
            if path[i].traits.batches:
                if batch[0] is not None:
                    return None  # two batch() stages: counts no longer follow from the index
                batch = (path[i].stage.batch_size, path[i].stage.drop_last)
            i += 1
        # Down the steps that turn each range of k samples into k samples, to the sharder:
        # webdataset <- load_from_tar <- open_files_by_fsspec <- sharding_by_index.
        wanted = "samples"
        while i < len(path) and (step := path[i].traits.range_to_samples) and step[1] == wanted:
            if path[i].index_sharder:
                return batch
            wanted = step[0]
            i += 1
        return None


def _visit(
    graph: DataPipeGraph, where: dict[int, int], stages: list[Any], below: list[DataPipeGraph]
) -> None:
    # Depth first, each stage where it is first reached: the order of torch's
    # get_all_graph_pipes, and the one the loader has always numbered random stages by.
    for key, (dp, sources) in graph.items():
        if key in where:
            continue
        where[key] = len(stages)
        stages.append(dp)
        below.append(sources)
        _visit(sources, where, stages, below)


def describe(datapipe: Any, *, main_path: bool = False) -> GraphDescription:
    """Describe the graph that ends in ``datapipe``: one walk, each stage's traits read once.

    With ``main_path``, only the main path (what the length questions follow): no walk of the
    whole graph, so it also describes a graph torch cannot walk (it walks by pickling, and a
    stage class defined inside a function does not pickle without dill).
    """
    where: dict[int, int] = {}
    stages: list[Any] = []
    below: list[DataPipeGraph] = []
    if not isinstance(datapipe, IterDataPipe | MapDataPipe):
        # What a reading service written for 0.9 may return in place of a graph: no stages.
        return GraphDescription((), (), where)
    if main_path:
        node: Any = datapipe
        while node is not None and id(node) not in where:
            where[id(node)] = len(stages)
            stages.append(node)
            node = source_of(node)
        sources: list[tuple[int, ...]] = [(i + 1,) for i in range(len(stages) - 1)] + [()]
    else:
        _visit(traverse_dps(datapipe), where, stages, below)
        sources = [tuple(where[k] for k in graph) for graph in below]
    traits = [traits_of(dp) for dp in stages]
    after: dict[int, bool] = {}

    def sharded_below(i: int) -> bool:
        if i not in after:
            after[i] = False  # a graph is acyclic; this only guards a malformed one
            after[i] = any(traits[j].sharding or sharded_below(j) for j in sources[i])
        return after[i]

    nodes = tuple(
        DescribedStage(dp, traits[i], sources[i], sharded_below(i)) for i, dp in enumerate(stages)
    )
    chain = []
    node = datapipe
    seen: set[int] = set()
    while node is not None and id(node) in where and id(node) not in seen:
        seen.add(id(node))
        chain.append(where[id(node)])
        node = source_of(node)
    return GraphDescription(nodes, tuple(chain), where)
