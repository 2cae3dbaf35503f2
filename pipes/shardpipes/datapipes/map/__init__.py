"""Map-style DataPipes of torchdata 0.9: torch's own, plus ``IterToMapConverter``, ``InMemoryCacheHolder`` and ``UnZipper``."""

from torch.utils.data import MapDataPipe
from torch.utils.data.datapipes.map import (
    Batcher,
    Concater,
    Mapper,
    SequenceWrapper,
    Shuffler,
    Zipper,
)

from shardpipes.datapipes.map.converter import IterToMapConverterMapDataPipe as IterToMapConverter
from shardpipes.datapipes.map.util import InMemoryCacheHolderMapDataPipe as InMemoryCacheHolder
from shardpipes.datapipes.map.util import UnZipperMapDataPipe as UnZipper

__all__ = [
    "Batcher",
    "Concater",
    "InMemoryCacheHolder",
    "IterToMapConverter",
    "MapDataPipe",
    "Mapper",
    "SequenceWrapper",
    "Shuffler",
    "UnZipper",
    "Zipper",
]
