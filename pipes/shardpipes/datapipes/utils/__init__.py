"""Helpers of torchdata 0.9's ``datapipes.utils``: ``StreamWrapper``, ``janitor``, ``pin_memory_fn``, ``to_graph``."""

from torch.utils.data.datapipes.utils.common import StreamWrapper

from shardpipes.datapipes.utils._graph import to_graph
from shardpipes.datapipes.utils._helpers import janitor, pin_memory_fn

__all__ = [
    "StreamWrapper",
    "janitor",
    "pin_memory_fn",
    "to_graph",
]
