"""torchdata 0.9's ``datapipes.iter.util.prefetcher`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    PinMemory as PinMemoryIterDataPipe,
)
from shardpipes.datapipes.iter import (
    Prefetcher as PrefetcherIterDataPipe,
)

CONSUMER_SLEEP_INTERVAL = 0.0001  # 0.9's value; shardpipes' prefetcher waits on a condition
PRODUCER_SLEEP_INTERVAL = 0.0001  # 0.9's value; shardpipes' prefetcher waits on a condition

__all__ = [
    "CONSUMER_SLEEP_INTERVAL",
    "PRODUCER_SLEEP_INTERVAL",
    "PinMemoryIterDataPipe",
    "PrefetcherIterDataPipe",
]
