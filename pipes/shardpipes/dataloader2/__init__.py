"""DataLoader2 and the reading services (torchdata 0.9's API, on today's torch)."""

from shardpipes.dataloader2.dataloader2 import DataLoader2
from shardpipes.dataloader2.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
)
from shardpipes.dataloader2.seeding import SeedGenerator

__all__ = [
    "DataLoader2",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "ReadingServiceInterface",
    "SeedGenerator",
    "SequentialReadingService",
]
