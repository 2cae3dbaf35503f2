"""torchdata 0.9's ``datapipes.iter.transform.callable`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    BatchAsyncMapper as BatchAsyncMapperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    BatchMapper as BatchMapperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    Dropper as DropperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    FlatMapper as FlatMapperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    Flattener as FlattenIterDataPipe,
)
from shardpipes.datapipes.iter import (
    ShuffledFlatMapper as ShuffledFlatMapperIterDataPipe,
)
from shardpipes.datapipes.iter import (
    Slicer as SliceIterDataPipe,
)
from shardpipes.datapipes.iter import (
    ThreadPoolMapper as ThreadPoolMapperIterDataPipe,
)

T_co = TypeVar("T_co", covariant=True)

__all__ = [
    "BatchAsyncMapperIterDataPipe",
    "BatchMapperIterDataPipe",
    "DropperIterDataPipe",
    "FlatMapperIterDataPipe",
    "FlattenIterDataPipe",
    "ShuffledFlatMapperIterDataPipe",
    "SliceIterDataPipe",
    "T_co",
    "ThreadPoolMapperIterDataPipe",
]
