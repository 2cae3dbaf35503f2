"""DataLoader2 and the reading services (torchdata 0.9's API, on today's torch).

With 0.9's submodules: ``adapter`` (``Shuffle``, ``CacheTimeout``), ``graph`` (``find_dps``,
``list_dps``, ``remove_dp``, ``replace_dp``, ``traverse_dps``, ...), ``random``
(``SeedGenerator``) and ``utils`` (``WorkerInfo``, ...).
"""

from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES  # noqa: F401

from shardpipes._submodules import submodule_attributes
from shardpipes.dataloader2 import adapter, graph, random, utils
from shardpipes.dataloader2.dataloader2 import DataLoader2, DataLoader2Iterator
from shardpipes.dataloader2.error import PauseIteration
from shardpipes.dataloader2.random import SeedGenerator
from shardpipes.dataloader2.reading_service import (
    CheckpointableReadingServiceInterface,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
)
from shardpipes.dataloader2.shuffle_spec import ShuffleSpec
from shardpipes.plan.epoch import EpochPlan

__all__ = [
    "CheckpointableReadingServiceInterface",
    "DataLoader2",
    "DataLoader2Iterator",
    "DistributedReadingService",
    "EpochPlan",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "PauseIteration",
    "PrototypeMultiProcessingReadingService",
    "ReadingServiceInterface",
    "SeedGenerator",
    "SequentialReadingService",
    "ShuffleSpec",
    "adapter",
    "graph",
    "random",
    "utils",
]

# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(
    __name__,
    (
        "adapter",
        "communication",
        "dataloader2",
        "error",
        "graph",
        "random",
        "reading_service",
        "shuffle_spec",
        "utils",
    ),
)
