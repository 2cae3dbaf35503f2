"""Iterable DataPipes: the stages of a shardpipes graph.

Torch's own stages (``map``, ``filter``, ``batch``, ``shuffle``, ``sharding_filter``, ...) are
re-exported under their torchdata 0.9 names (torch's own classes, as 0.9 did), so one import
line serves the whole graph; the functional forms ``shuffle``, ``map`` and ``filter`` build
subclasses of them without torch's per-element hook (``_unhooked.py``).
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

from shardpipes._submodules import submodule_attributes
from shardpipes.datapipes.iter import _unhooked  # noqa: F401 - shuffle, map, filter without the hook
from shardpipes.datapipes.iter.batch import InBatchShufflerIterDataPipe as InBatchShuffler
from shardpipes.datapipes.iter.decode import DecoderIterDataPipe as Decoder
from shardpipes.datapipes.iter.expand import ShardExpanderIterDataPipe as ShardExpander
from shardpipes.datapipes.iter.fsspec import FSSpecFileListerIterDataPipe as FSSpecFileLister
from shardpipes.datapipes.iter.fsspec import FSSpecFileOpenerIterDataPipe as FSSpecFileOpener
from shardpipes.datapipes.iter.fsspec import FSSpecSaverIterDataPipe as FSSpecSaver
from shardpipes.datapipes.iter.image import (
    RandomResizedCropDecoderIterDataPipe as RandomResizedCropDecoder,
)
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe as IndexSharder
from shardpipes.datapipes.iter.length import CyclerIterDataPipe as Cycler
from shardpipes.datapipes.iter.length import FixedLengthIterDataPipe as FixedLength
from shardpipes.datapipes.iter.length import HeaderIterDataPipe as Header
from shardpipes.datapipes.iter.length import LengthSetterIterDataPipe as LengthSetter
from shardpipes.datapipes.iter.mix import MixerIterDataPipe as Mixer
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
    "Mixer",
    "Multiplexer",
    "NodesAdapter",
    "OnDiskCacheHolder",
    "PinMemory",
    "Prefetcher",
    "RandomResizedCropDecoder",
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

# --- torchdata 0.9 compatibility (issue 16): the rest of 0.9's ``datapipes.iter`` names -------
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import RoutedDecoder

from shardpipes.datapipes.map.converter import MapToIterConverterIterDataPipe as MapToIterConverter
from shardpipes.datapipes.td09.archives import Bz2FileLoaderIterDataPipe as Bz2FileLoader
from shardpipes.datapipes.td09.archives import DecompressorIterDataPipe as Decompressor
from shardpipes.datapipes.td09.archives import ExtractorIterDataPipe as Extractor
from shardpipes.datapipes.td09.archives import (
    RarArchiveLoaderIterDataPipe as RarArchiveLoader,
)
from shardpipes.datapipes.td09.archives import XzFileLoaderIterDataPipe as XzFileLoader
from shardpipes.datapipes.td09.archives import (
    ZipArchiveLoaderIterDataPipe as ZipArchiveLoader,
)
from shardpipes.datapipes.td09.bucket import BucketBatcherIterDataPipe as BucketBatcher
from shardpipes.datapipes.td09.bucket import (
    MaxTokenBucketizerIterDataPipe as MaxTokenBucketizer,
)
from shardpipes.datapipes.td09.bucket import RandomSplitterIterDataPipe as RandomSplitter
from shardpipes.datapipes.td09.cache import (
    EndOnDiskCacheHolderIterDataPipe as EndOnDiskCacheHolder,
)
from shardpipes.datapipes.td09.cache import OnDiskCacheHolderIterDataPipe as OnDiskCacheHolder
from shardpipes.datapipes.td09.callable import (
    BatchAsyncMapperIterDataPipe as BatchAsyncMapper,
)
from shardpipes.datapipes.td09.callable import BatchMapperIterDataPipe as BatchMapper
from shardpipes.datapipes.td09.callable import FlatMapperIterDataPipe as FlatMapper
from shardpipes.datapipes.td09.callable import (
    ShuffledFlatMapperIterDataPipe as ShuffledFlatMapper,
)
from shardpipes.datapipes.td09.columns import DropperIterDataPipe as Dropper
from shardpipes.datapipes.td09.columns import EnumeratorIterDataPipe as Enumerator
from shardpipes.datapipes.td09.columns import FlattenIterDataPipe as Flattener
from shardpipes.datapipes.td09.columns import IndexAdderIterDataPipe as IndexAdder
from shardpipes.datapipes.td09.columns import (
    InMemoryCacheHolderIterDataPipe as InMemoryCacheHolder,
)
from shardpipes.datapipes.td09.columns import RepeaterIterDataPipe as Repeater
from shardpipes.datapipes.td09.columns import Rows2ColumnarIterDataPipe as Rows2Columnar
from shardpipes.datapipes.td09.columns import SliceIterDataPipe as Slicer
from shardpipes.datapipes.td09.combining import IterKeyZipperIterDataPipe as IterKeyZipper
from shardpipes.datapipes.td09.combining import MapKeyZipperIterDataPipe as MapKeyZipper
from shardpipes.datapipes.td09.combining import (
    MultiplexerLongestIterDataPipe as MultiplexerLongest,
)
from shardpipes.datapipes.td09.combining import (
    RoundRobinDemultiplexerIterDataPipe as RoundRobinDemultiplexer,
)
from shardpipes.datapipes.td09.combining import (
    SampleMultiplexerDataPipe as SampleMultiplexer,
)
from shardpipes.datapipes.td09.combining import (
    ShardingRoundRobinDispatcherIterDataPipe as ShardingRoundRobinDispatcher,
)
from shardpipes.datapipes.td09.combining import UnZipperIterDataPipe as UnZipper
from shardpipes.datapipes.td09.combining import ZipperLongestIterDataPipe as ZipperLongest
from shardpipes.datapipes.td09.iopath import IoPathFileListerIterDataPipe as IoPathFileLister
from shardpipes.datapipes.td09.iopath import IoPathFileOpenerIterDataPipe as IoPathFileOpener
from shardpipes.datapipes.td09.iopath import IoPathSaverIterDataPipe as IoPathSaver
from shardpipes.datapipes.td09.readers import GDriveReaderDataPipe as GDriveReader
from shardpipes.datapipes.td09.readers import HTTPReaderIterDataPipe as HttpReader
from shardpipes.datapipes.td09.readers import OnlineReaderIterDataPipe as OnlineReader
from shardpipes.datapipes.td09.readers import S3FileListerIterDataPipe as S3FileLister
from shardpipes.datapipes.td09.readers import S3FileLoaderIterDataPipe as S3FileLoader
from shardpipes.datapipes.td09.text import CSVDictParserIterDataPipe as CSVDictParser
from shardpipes.datapipes.td09.text import CSVParserIterDataPipe as CSVParser
from shardpipes.datapipes.td09.text import HashCheckerIterDataPipe as HashChecker
from shardpipes.datapipes.td09.text import JsonParserIterDataPipe as JsonParser
from shardpipes.datapipes.td09.text import LineReaderIterDataPipe as LineReader
from shardpipes.datapipes.td09.text import (
    ParagraphAggregatorIterDataPipe as ParagraphAggregator,
)
from shardpipes.datapipes.td09.text import SaverIterDataPipe as Saver
from shardpipes.datapipes.td09.tfrecord import TFRecordExample, TFRecordExampleSpec
from shardpipes.datapipes.td09.tfrecord import TFRecordLoaderIterDataPipe as TFRecordLoader
from shardpipes.datapipes.td09.unavailable import AISFileListerIterDataPipe as AISFileLister
from shardpipes.datapipes.td09.unavailable import AISFileLoaderIterDataPipe as AISFileLoader
from shardpipes.datapipes.td09.unavailable import (
    DataFrameMakerIterDataPipe as DataFrameMaker,
)
from shardpipes.datapipes.td09.unavailable import (
    HuggingFaceHubReaderIterDataPipe as HuggingFaceHubReader,
)
from shardpipes.datapipes.td09.unavailable import (
    ParquetDFLoaderIterDataPipe as ParquetDataFrameLoader,
)

__all__ += [
    "AISFileLister",
    "AISFileLoader",
    "BatchAsyncMapper",
    "BatchMapper",
    "BucketBatcher",
    "Bz2FileLoader",
    "CSVDictParser",
    "CSVParser",
    "DataFrameMaker",
    "Decompressor",
    "Dropper",
    "EndOnDiskCacheHolder",
    "Enumerator",
    "Extractor",
    "FlatMapper",
    "Flattener",
    "GDriveReader",
    "HashChecker",
    "HttpReader",
    "HuggingFaceHubReader",
    "InMemoryCacheHolder",
    "IndexAdder",
    "IoPathFileLister",
    "IoPathFileOpener",
    "IoPathSaver",
    "IterDataPipe",
    "IterKeyZipper",
    "JsonParser",
    "LineReader",
    "MapKeyZipper",
    "MapToIterConverter",
    "MaxTokenBucketizer",
    "MultiplexerLongest",
    "OnlineReader",
    "ParagraphAggregator",
    "ParquetDataFrameLoader",
    "RandomSplitter",
    "RarArchiveLoader",
    "Repeater",
    "RoundRobinDemultiplexer",
    "RoutedDecoder",
    "Rows2Columnar",
    "S3FileLister",
    "S3FileLoader",
    "SampleMultiplexer",
    "Saver",
    "ShardingRoundRobinDispatcher",
    "ShuffledFlatMapper",
    "Slicer",
    "TFRecordExample",
    "TFRecordExampleSpec",
    "TFRecordLoader",
    "UnZipper",
    "XzFileLoader",
    "ZipArchiveLoader",
    "ZipperLongest",
]

# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(__name__, ("load", "transform", "util"))
