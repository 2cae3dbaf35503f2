"""Iterable DataPipes: the stages of a shardpipes graph.

Torch's own stages (``map``, ``filter``, ``batch``, ``shuffle``, ``sharding_filter``, ...) are
re-exported under their torchdata 0.9 names, so one import line serves the whole graph.
"""

from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
    Grouper,
    IterableWrapper,
    Mapper,
    Multiplexer,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)

from shardpipes.datapipes.iter.batch import InBatchShufflerIterDataPipe as InBatchShuffler
from shardpipes.datapipes.iter.cache import OnDiskCacheHolderIterDataPipe as OnDiskCacheHolder
from shardpipes.datapipes.iter.decode import DecoderIterDataPipe as Decoder
from shardpipes.datapipes.iter.expand import ShardExpanderIterDataPipe as ShardExpander
from shardpipes.datapipes.iter.fsspec import FSSpecFileListerIterDataPipe as FSSpecFileLister
from shardpipes.datapipes.iter.fsspec import FSSpecFileOpenerIterDataPipe as FSSpecFileOpener
from shardpipes.datapipes.iter.fsspec import FSSpecSaverIterDataPipe as FSSpecSaver
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe as IndexSharder
from shardpipes.datapipes.iter.length import CyclerIterDataPipe as Cycler
from shardpipes.datapipes.iter.length import FixedLengthIterDataPipe as FixedLength
from shardpipes.datapipes.iter.length import HeaderIterDataPipe as Header
from shardpipes.datapipes.iter.length import LengthSetterIterDataPipe as LengthSetter
from shardpipes.datapipes.iter.nodes import NodesAdapterIterDataPipe as NodesAdapter
from shardpipes.datapipes.iter.prefetch import PinMemoryIterDataPipe as PinMemory
from shardpipes.datapipes.iter.prefetch import PrefetcherIterDataPipe as Prefetcher
from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe as FullSync
from shardpipes.datapipes.iter.tar import TarArchiveLoaderIterDataPipe as TarArchiveLoader
from shardpipes.datapipes.iter.threadpool import ThreadPoolMapperIterDataPipe as ThreadPoolMapper
from shardpipes.datapipes.iter.webdataset import WebDatasetIterDataPipe as WebDataset
from shardpipes.storage.ranges import ShardRange

__all__ = [
    "Batcher",
    "Collator",
    "Concater",
    "Cycler",
    "Decoder",
    "Demultiplexer",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "FileLister",
    "FileOpener",
    "Filter",
    "FixedLength",
    "Forker",
    "FullSync",
    "Grouper",
    "Header",
    "InBatchShuffler",
    "IndexSharder",
    "IterableWrapper",
    "LengthSetter",
    "Mapper",
    "Multiplexer",
    "NodesAdapter",
    "OnDiskCacheHolder",
    "PinMemory",
    "Prefetcher",
    "Sampler",
    "ShardExpander",
    "ShardRange",
    "ShardingFilter",
    "Shuffler",
    "StreamReader",
    "TarArchiveLoader",
    "ThreadPoolMapper",
    "UnBatcher",
    "WebDataset",
    "Zipper",
]
