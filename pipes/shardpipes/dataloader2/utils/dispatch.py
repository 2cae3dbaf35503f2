"""torchdata 0.9's graph helpers for ``sharding_round_robin_dispatch``.

``find_lca_round_robin_sharding_dp`` finds the stage from which everything runs where the
items are dealt (the lowest common ancestor of the dispatchers); ``find_non_dispatching_branches``
the branches that do not read from the ``_DummyIterDataPipe`` placeholder that stands for it.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph import DataPipe, DataPipeGraph, traverse_dps
from torch.utils.data.graph_settings import apply_sharding

from shardpipes.dataloader2.graph.utils import list_dps, replace_dp

__all__ = [
    "_DummyIterDataPipe",
    "find_lca_round_robin_sharding_dp",
    "find_non_dispatching_branches",
]


class _DummyIterDataPipe(IterDataPipe[Any]):
    """A placeholder for the dispatching part of a graph."""

    def __iter__(self) -> Any:
        raise RuntimeError("_DummyIterDataPipe is a placeholder and cannot be iterated")


def _is_dispatcher(dp: Any) -> bool:
    # The stage is registered as ``sharding_round_robin_dispatch`` in the stages layer.
    return type(dp).__name__ in (
        "ShardingRoundRobinDispatcherIterDataPipe",
        "ShardingRoundRobinDispatcher",
    )


def _root(graph: DataPipeGraph) -> tuple[int, Any, DataPipeGraph]:
    if len(graph) != 1:
        raise ValueError("DataPipeGraph should only contain a single output DataPipe")
    root_id = next(iter(graph))
    root, sources = graph[root_id]
    return root_id, root, sources


def find_lca_round_robin_sharding_dp(graph: DataPipeGraph) -> DataPipe | None:
    """The lowest common ancestor of every ``sharding_round_robin_dispatch`` stage, or ``None``."""
    root_id, root, sources = _root(graph)
    dispatched: set[int] = set()
    for dp in list_dps(graph):
        if id(dp) not in dispatched and _is_dispatcher(dp):
            dispatched.update(id(p) for p in list_dps(traverse_dps(dp)))
    lca: dict[int, Any] = {}

    def walk(dp_id: int, dp: Any, srcs: DataPipeGraph) -> Any:
        if dp_id in lca:
            return lca[dp_id]
        if dp_id in dispatched:
            lca[dp_id] = dp
            return dp
        lca[dp_id] = None
        found = [
            f for s_id, (s, s_srcs) in srcs.items() if (f := walk(s_id, s, s_srcs)) is not None
        ]
        if found:
            lca[dp_id] = found[0] if all(f is found[0] for f in found) else dp
        return lca[dp_id]

    return walk(root_id, root, sources)  # type: ignore[no-any-return]


def find_non_dispatching_branches(
    graph: DataPipeGraph, placeholder: type = _DummyIterDataPipe
) -> list[DataPipe]:
    """The frontmost stages whose input does not come from a ``_DummyIterDataPipe``."""
    root_id, root, sources = _root(graph)
    clean: dict[int, bool] = {}
    out: list[DataPipe] = []

    def walk(dp_id: int, dp: Any, srcs: DataPipeGraph) -> bool:
        if dp_id in clean:
            return clean[dp_id]
        if type(dp) is placeholder:
            clean[dp_id] = False
            return False
        clean[dp_id] = True
        ok = True
        for s_id, (s, s_srcs) in srcs.items():
            ok = walk(s_id, s, s_srcs) and ok
        clean[dp_id] = ok
        if not ok:
            out.extend(s for s_id, (s, _) in srcs.items() if clean[s_id])
        return ok

    if walk(root_id, root, sources):
        out.append(root)
    return out


class _DealtIterDataPipe(IterDataPipe[Any]):
    """The items of ``source`` dealt to worker ``worker`` of ``num_workers``: ``i % num_workers == worker``."""

    def __init__(self, source_datapipe: Any, num_workers: int, worker: int) -> None:
        self.source_datapipe = source_datapipe
        self.num_workers = num_workers
        self.worker = worker

    def __iter__(self) -> Any:
        n, w = self.num_workers, self.worker
        try:
            for i, item in enumerate(self.source_datapipe):
                if i % n == w:
                    yield item
        except Exception as exc:
            # 0.9's words for where it happened: the part of the graph before the dispatcher
            exc.add_note(
                f"Caught {type(exc).__name__} in dispatching process (the part of the graph "
                "before sharding_round_robin_dispatch, run in each worker)"
            )
            raise


def shard_for_worker(datapipe: Any, num_workers: int, worker: int) -> Any:
    """Shard a worker's copy of the graph; return its (possibly new) output stage.

    Without ``sharding_round_robin_dispatch`` this is torch's ``apply_sharding`` with the
    multiprocessing priority. With it: 0.9 ran the part before the dispatcher in one extra
    process and dealt its items to the workers in turn. shardpipes runs that part in every
    worker, with the seeds all workers share, and each worker keeps the items dealt to it: the
    same items per worker, without the extra process. As in 0.9, only the branches that do
    not read from a dispatcher are sharded by worker.
    """
    graph = traverse_dps(datapipe)
    dispatchers = [d for d in list_dps(graph) if _is_dispatcher(d)]
    if not dispatchers:
        return apply_sharding(datapipe, num_workers, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
    for dp in dispatchers:
        graph = replace_dp(graph, dp, _DealtIterDataPipe(dp.source_datapipe, num_workers, worker))
    for branch in find_non_dispatching_branches(graph, _DealtIterDataPipe):
        apply_sharding(branch, num_workers, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
    return next(iter(graph.values()))[0]
