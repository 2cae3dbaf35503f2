"""torchdata 0.9's ``datapipes.iter.util.header`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    Header as HeaderIterDataPipe,
)
from shardpipes.datapipes.iter import (
    LengthSetter as LengthSetterIterDataPipe,
)

T_co = TypeVar("T_co", covariant=True)

__all__ = ["HeaderIterDataPipe", "LengthSetterIterDataPipe", "T_co"]
