"""torchdata 0.9's ``datapipes.map.util.cacheholder`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.map import InMemoryCacheHolder as InMemoryCacheHolderMapDataPipe

T_co = TypeVar("T_co", covariant=True)

__all__ = ["InMemoryCacheHolderMapDataPipe", "T_co"]
