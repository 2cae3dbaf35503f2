"""torchdata 0.9's ``datapipes.iter.util.decompressor`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    Decompressor as DecompressorIterDataPipe,
)
from shardpipes.datapipes.iter import (
    Extractor as ExtractorIterDataPipe,
)
from shardpipes.datapipes.td09.archives import CompressionType

__all__ = ["CompressionType", "DecompressorIterDataPipe", "ExtractorIterDataPipe"]
