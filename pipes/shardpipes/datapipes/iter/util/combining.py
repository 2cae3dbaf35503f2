"""torchdata 0.9's ``datapipes.iter.util.combining`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    IterKeyZipper as IterKeyZipperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    MapKeyZipper as MapKeyZipperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    RoundRobinDemultiplexer as RoundRobinDemultiplexerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    UnZipper as UnZipperIterDataPipe,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

__all__ = [
    "IterKeyZipperIterDataPipe",
    "MapKeyZipperIterDataPipe",
    "RoundRobinDemultiplexerIterDataPipe",
    "T",
    "T_co",
    "UnZipperIterDataPipe",
]
