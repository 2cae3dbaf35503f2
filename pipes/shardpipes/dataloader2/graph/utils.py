"""torchdata 0.9's graph helpers: find, list, replace and remove stages of a ``traverse_dps`` graph.

A graph is what ``torch.utils.data.graph.traverse_dps`` returns: ``{id(dp): (dp, graph of its
sources)}``. Replacing or removing rewires the attributes that hold the stage (directly or in
a list, tuple or dict), in place; the functions return the graph of the (possibly new) output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.graph import DataPipe, DataPipeGraph, traverse_dps

from shardpipes.datapipes.iter._unhooked import torch_kind

__all__ = ["find_dps", "list_dps", "remove_dp", "replace_dp"]


def _walk_once(graph: DataPipeGraph) -> Iterator[tuple[DataPipe, DataPipeGraph]]:
    """``(stage, graph of its sources)`` for every stage of ``graph``, each once."""
    seen: set[int] = set()
    todo = [graph]
    while todo:
        for dp_id, (dp, sources) in todo.pop().items():
            if dp_id in seen:
                continue
            seen.add(dp_id)
            yield dp, sources
            todo.append(sources)


def find_dps(graph: DataPipeGraph, dp_type: type) -> list[DataPipe]:
    """Stages of exactly type ``dp_type`` in ``graph`` (each once; subclasses do not count, as in 0.9).

    torch's ``Shuffler``, ``Mapper`` and ``Filter`` and the classes ``shuffle``, ``map`` and
    ``filter`` build (their unhooked subclasses, ``_unhooked.py``) count as one type.
    """
    kind = torch_kind(dp_type)
    found: list[DataPipe] = [dp for dp, _ in _walk_once(graph) if torch_kind(type(dp)) is kind]
    return found


def list_dps(
    graph: DataPipeGraph, exclude_dps: DataPipe | list[DataPipe] | None = None
) -> list[DataPipe]:
    """Every stage of ``graph`` once, breadth first from the output.

    Stages in ``exclude_dps`` and everything feeding them are left out.
    """
    seen: set[int] = set()
    if exclude_dps is not None:
        excluded = (
            [exclude_dps] if isinstance(exclude_dps, IterDataPipe | MapDataPipe) else exclude_dps
        )
        for dp in excluded:
            if id(dp) not in seen:
                seen.update(id(x) for x in list_dps(traverse_dps(dp)))
    out: list[DataPipe] = []
    queue: deque[tuple[Any, DataPipeGraph]] = deque()
    for dp_id, (dp, sources) in graph.items():
        if dp_id not in seen:
            seen.add(dp_id)
            queue.append((dp, sources))
    while queue:
        dp, sources = queue.popleft()
        out.append(dp)
        for src_id, (src, src_sources) in sources.items():
            if src_id not in seen:
                seen.add(src_id)
                queue.append((src, src_sources))
    return out


def _swap_in(holder: Any, old: Any, new: Any) -> None:
    """Make every attribute of ``holder`` that refers to ``old`` refer to ``new``."""
    for name, value in list(vars(holder).items()):
        if value is old:
            setattr(holder, name, new)
        elif isinstance(value, list):
            value[:] = [new if v is old else v for v in value]
        elif isinstance(value, tuple) and any(v is old for v in value):
            setattr(holder, name, type(value)(new if v is old else v for v in value))
        elif isinstance(value, dict) and any(v is old for v in value.values()):
            for key, v in list(value.items()):
                if v is old:
                    value[key] = new


def _rewire(graph: DataPipeGraph, old: Any, new: Any) -> None:
    for dp, sources in _walk_once(graph):
        if id(old) in sources:
            _swap_in(dp, old, new)


def _single_output(graph: DataPipeGraph) -> Any:
    if len(graph) != 1:
        raise ValueError(f"the graph should have one output stage, it has {len(graph)}")
    return next(iter(graph.values()))[0]


def replace_dp(
    graph: DataPipeGraph, old_datapipe: DataPipe, new_datapipe: DataPipe
) -> DataPipeGraph:
    """Put ``new_datapipe`` where ``old_datapipe`` is in ``graph``; return the new graph."""
    output = _single_output(graph)
    if output is old_datapipe:
        output = new_datapipe
        graph = traverse_dps(new_datapipe)
    _rewire(graph, old_datapipe, new_datapipe)
    return traverse_dps(output)


def remove_dp(graph: DataPipeGraph, datapipe: DataPipe) -> DataPipeGraph:
    """Take ``datapipe`` out of ``graph``, joining its consumers to its one source; return the new graph.

    Raises:
        RuntimeError: ``datapipe`` is a source, or has several sources.
    """
    output = _single_output(graph)
    sources = traverse_dps(datapipe)[id(datapipe)][1]
    if len(sources) == 0:
        raise RuntimeError("Cannot remove the source DataPipe from the graph of DataPipe")
    if len(sources) > 1:
        raise RuntimeError("Cannot remove the receiving DataPipe having multiple sending DataPipes")
    source = next(iter(sources.values()))[0]
    if output is datapipe:
        return traverse_dps(source)
    _rewire(graph, datapipe, source)
    return traverse_dps(output)


def _find_replicable_branches(graph: DataPipeGraph) -> list[DataPipe]:
    """The frontmost stages whose whole input is replicable (``is_replicable()`` not ``False``)."""
    output = _single_output(graph)
    replicable: dict[int, bool] = {}
    found: list[DataPipe] = []
    found_ids: set[int] = set()

    def add(dp: Any) -> None:
        if id(dp) in found_ids:
            return
        if all(id(p) not in found_ids for p in list_dps(traverse_dps(dp))):
            found.append(dp)
            found_ids.add(id(dp))

    def check(dp: Any, sources: DataPipeGraph) -> bool:
        if id(dp) in replicable:
            return replicable[id(dp)]
        replicable[id(dp)] = True
        ok = not (hasattr(dp, "is_replicable") and not dp.is_replicable())
        for src, src_sources in sources.values():
            ok = check(src, src_sources) and ok
        replicable[id(dp)] = ok
        if not ok:
            for src_id, (src, _) in sources.items():
                if replicable[src_id]:
                    add(src)
        return ok

    root_sources = next(iter(graph.values()))[1]
    if check(output, root_sources):
        add(output)
    return found
