"""torchdata 0.9's ``datapipes.iter.util.ziparchiveloader`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import ZipArchiveLoader as ZipArchiveLoaderIterDataPipe

__all__ = ["ZipArchiveLoaderIterDataPipe"]
