"""torchdata 0.9's ``datapipes.iter.util.sharding`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    ShardingRoundRobinDispatcher as ShardingRoundRobinDispatcherIterDataPipe,
)

T_co = TypeVar("T_co", covariant=True)

__all__ = ["ShardingRoundRobinDispatcherIterDataPipe", "T_co"]
