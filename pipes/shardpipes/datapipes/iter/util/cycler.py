"""torchdata 0.9's ``datapipes.iter.util.cycler`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import Cycler as CyclerIterDataPipe
from shardpipes.datapipes.iter import Repeater as RepeaterIterDataPipe

T_co = TypeVar("T_co", covariant=True)

__all__ = ["CyclerIterDataPipe", "RepeaterIterDataPipe", "T_co"]
