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
from shardpipes.datapipes.iter.image import (
    RandomResizedCropDecoderIterDataPipe as RandomResizedCropDecoder,
)
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

from shardpipes.datapipes.iter.compat_archives import Bz2FileLoaderIterDataPipe as Bz2FileLoader
from shardpipes.datapipes.iter.compat_archives import DecompressorIterDataPipe as Decompressor
from shardpipes.datapipes.iter.compat_archives import ExtractorIterDataPipe as Extractor
from shardpipes.datapipes.iter.compat_archives import (
    RarArchiveLoaderIterDataPipe as RarArchiveLoader,
)
from shardpipes.datapipes.iter.compat_archives import XzFileLoaderIterDataPipe as XzFileLoader
from shardpipes.datapipes.iter.compat_archives import (
    ZipArchiveLoaderIterDataPipe as ZipArchiveLoader,
)
from shardpipes.datapipes.iter.compat_bucket import BucketBatcherIterDataPipe as BucketBatcher
from shardpipes.datapipes.iter.compat_bucket import (
    MaxTokenBucketizerIterDataPipe as MaxTokenBucketizer,
)
from shardpipes.datapipes.iter.compat_bucket import RandomSplitterIterDataPipe as RandomSplitter
from shardpipes.datapipes.iter.compat_cache import (
    EndOnDiskCacheHolderIterDataPipe as EndOnDiskCacheHolder,
)
from shardpipes.datapipes.iter.compat_callable import (
    BatchAsyncMapperIterDataPipe as BatchAsyncMapper,
)
from shardpipes.datapipes.iter.compat_callable import BatchMapperIterDataPipe as BatchMapper
from shardpipes.datapipes.iter.compat_callable import FlatMapperIterDataPipe as FlatMapper
from shardpipes.datapipes.iter.compat_callable import (
    ShuffledFlatMapperIterDataPipe as ShuffledFlatMapper,
)
from shardpipes.datapipes.iter.compat_columns import DropperIterDataPipe as Dropper
from shardpipes.datapipes.iter.compat_columns import EnumeratorIterDataPipe as Enumerator
from shardpipes.datapipes.iter.compat_columns import FlattenIterDataPipe as Flattener
from shardpipes.datapipes.iter.compat_columns import IndexAdderIterDataPipe as IndexAdder
from shardpipes.datapipes.iter.compat_columns import (
    InMemoryCacheHolderIterDataPipe as InMemoryCacheHolder,
)
from shardpipes.datapipes.iter.compat_columns import RepeaterIterDataPipe as Repeater
from shardpipes.datapipes.iter.compat_columns import Rows2ColumnarIterDataPipe as Rows2Columnar
from shardpipes.datapipes.iter.compat_columns import SliceIterDataPipe as Slicer
from shardpipes.datapipes.iter.compat_combining import IterKeyZipperIterDataPipe as IterKeyZipper
from shardpipes.datapipes.iter.compat_combining import MapKeyZipperIterDataPipe as MapKeyZipper
from shardpipes.datapipes.iter.compat_combining import (
    MultiplexerLongestIterDataPipe as MultiplexerLongest,
)
from shardpipes.datapipes.iter.compat_combining import (
    RoundRobinDemultiplexerIterDataPipe as RoundRobinDemultiplexer,
)
from shardpipes.datapipes.iter.compat_combining import (
    SampleMultiplexerDataPipe as SampleMultiplexer,
)
from shardpipes.datapipes.iter.compat_combining import (
    ShardingRoundRobinDispatcherIterDataPipe as ShardingRoundRobinDispatcher,
)
from shardpipes.datapipes.iter.compat_combining import UnZipperIterDataPipe as UnZipper
from shardpipes.datapipes.iter.compat_combining import ZipperLongestIterDataPipe as ZipperLongest
from shardpipes.datapipes.iter.compat_readers import GDriveReaderDataPipe as GDriveReader
from shardpipes.datapipes.iter.compat_readers import HTTPReaderIterDataPipe as HttpReader
from shardpipes.datapipes.iter.compat_readers import OnlineReaderIterDataPipe as OnlineReader
from shardpipes.datapipes.iter.compat_readers import S3FileListerIterDataPipe as S3FileLister
from shardpipes.datapipes.iter.compat_readers import S3FileLoaderIterDataPipe as S3FileLoader
from shardpipes.datapipes.iter.compat_text import CSVDictParserIterDataPipe as CSVDictParser
from shardpipes.datapipes.iter.compat_text import CSVParserIterDataPipe as CSVParser
from shardpipes.datapipes.iter.compat_text import HashCheckerIterDataPipe as HashChecker
from shardpipes.datapipes.iter.compat_text import JsonParserIterDataPipe as JsonParser
from shardpipes.datapipes.iter.compat_text import LineReaderIterDataPipe as LineReader
from shardpipes.datapipes.iter.compat_text import (
    ParagraphAggregatorIterDataPipe as ParagraphAggregator,
)
from shardpipes.datapipes.iter.compat_text import SaverIterDataPipe as Saver
from shardpipes.datapipes.iter.compat_tfrecord import TFRecordExample, TFRecordExampleSpec
from shardpipes.datapipes.iter.compat_tfrecord import TFRecordLoaderIterDataPipe as TFRecordLoader
from shardpipes.datapipes.iter.compat_unavailable import AISFileListerIterDataPipe as AISFileLister
from shardpipes.datapipes.iter.compat_unavailable import AISFileLoaderIterDataPipe as AISFileLoader
from shardpipes.datapipes.iter.compat_unavailable import (
    DataFrameMakerIterDataPipe as DataFrameMaker,
)
from shardpipes.datapipes.iter.compat_unavailable import (
    HuggingFaceHubReaderIterDataPipe as HuggingFaceHubReader,
)
from shardpipes.datapipes.iter.compat_unavailable import (
    IoPathFileListerIterDataPipe as IoPathFileLister,
)
from shardpipes.datapipes.iter.compat_unavailable import (
    IoPathFileOpenerIterDataPipe as IoPathFileOpener,
)
from shardpipes.datapipes.iter.compat_unavailable import IoPathSaverIterDataPipe as IoPathSaver
from shardpipes.datapipes.iter.compat_unavailable import (
    ParquetDFLoaderIterDataPipe as ParquetDataFrameLoader,
)
from shardpipes.datapipes.map.converter import MapToIterConverterIterDataPipe as MapToIterConverter

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
