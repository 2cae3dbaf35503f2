"""torchdata 0.9's ``set_graph_random_seed`` and ``set_datapipes_seed``, for code that seeds graphs itself.

``DataLoader2`` seeds graphs with :func:`shardpipes.dataloader2.graph.apply_epoch_plan`; these
are the 0.9 functions, which draw from a :class:`~shardpipes.dataloader2.random.SeedGenerator`.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe
from torch.utils.data.graph import DataPipe, traverse_dps

from shardpipes.dataloader2.graph.utils import find_dps, list_dps
from shardpipes.dataloader2.random.seed_generator import SeedGenerator

__all__ = ["set_datapipes_seed", "set_graph_random_seed"]


def _is_random(dp: Any) -> bool:
    return inspect.ismethod(getattr(dp, "set_seed", None))


def set_datapipes_seed(
    datapipes: list[DataPipe], seed_generator: SeedGenerator, distributed_shared: bool
) -> None:
    """Seed each random stage of ``datapipes`` with the generator's next shared or own seed."""
    for dp in datapipes:
        if _is_random(dp):
            dp.set_seed(
                seed_generator.generate_shared_seed()
                if distributed_shared
                else seed_generator.generate_seed()
            )


def set_graph_random_seed(datapipe: DataPipe, seed_generator: SeedGenerator) -> DataPipe:
    """Seed the random stages of a graph: shared seeds before ``sharding_filter``, own seeds after."""
    graph = traverse_dps(datapipe)
    sharders = find_dps(graph, ShardingFilterIterDataPipe)
    seen: set[int] = set()
    before = []
    for sharder in sharders:
        for dp in list_dps(traverse_dps(sharder)):
            if id(dp) not in seen:
                seen.add(id(dp))
                before.append(dp)
    set_datapipes_seed(before, seed_generator, distributed_shared=True)
    set_datapipes_seed(
        list_dps(graph, exclude_dps=sharders), seed_generator, distributed_shared=False
    )
    return datapipe
