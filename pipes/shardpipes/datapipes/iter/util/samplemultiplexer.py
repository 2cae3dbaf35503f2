"""torchdata 0.9's ``datapipes.iter.util.samplemultiplexer`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import SampleMultiplexer as SampleMultiplexerDataPipe

T_co = TypeVar("T_co", covariant=True)

__all__ = ["SampleMultiplexerDataPipe", "T_co"]
