"""torchdata 0.9's ``datapipes.iter.util.indexadder`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    Enumerator as EnumeratorIterDataPipe,
)
from shardpipes.datapipes.iter import (
    IndexAdder as IndexAdderIterDataPipe,
)

K = TypeVar("K")

__all__ = ["EnumeratorIterDataPipe", "IndexAdderIterDataPipe", "K"]
