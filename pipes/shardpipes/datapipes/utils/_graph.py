"""``to_graph``: draw a DataPipe graph with graphviz (an optional dependency, as in torchdata 0.9)."""

from __future__ import annotations

from typing import Any

from torch.utils.data.graph import traverse_dps

__all__ = ["to_graph"]


def _label(dp: Any) -> str:
    return (
        type(dp).__name__.replace("IterDataPipe", "").replace("MapDataPipe", "")
        or type(dp).__name__
    )


def to_graph(dp: Any, *, debug: bool = False) -> Any:
    """Return a ``graphviz.Digraph`` of the graph ending at ``dp``.

    Args:
        dp: The last DataPipe of the graph.
        debug: Label nodes with their ``repr`` as well. Default: ``False``.

    Raises:
        ModuleNotFoundError: ``graphviz`` is not installed (``pip install graphviz``).
    """
    try:
        import graphviz  # type: ignore[import-not-found, unused-ignore]  # optional
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "to_graph needs the graphviz package: pip install graphviz"
        ) from exc
    graph = graphviz.Digraph()
    seen: set[int] = set()

    def add(node_id: int, tree: dict[int, tuple[Any, dict[Any, Any]]]) -> None:
        for child_id, (child, sub) in tree.items():
            if child_id not in seen:
                seen.add(child_id)
                label = _label(child) + (f"\n{child!r}" if debug else "")
                graph.node(str(child_id), label)
                add(child_id, sub)
            if node_id >= 0:
                graph.edge(str(child_id), str(node_id))

    add(-1, traverse_dps(dp))
    return graph
