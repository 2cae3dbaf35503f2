"""DataLoader2 and the reading services (torchdata 0.9's API, on today's torch)."""

from shardpipes.dataloader2.dataloader2 import DataLoader2
from shardpipes.dataloader2.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
)
from shardpipes.plan.epoch import EpochPlan

#: The name this value had before it was the plan layer's (kept for code that imports it).
SeedGenerator = EpochPlan

__all__ = [
    "DataLoader2",
    "DistributedReadingService",
    "EpochPlan",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "ReadingServiceInterface",
    "SeedGenerator",
    "SequentialReadingService",
]
