"""torchdata 0.9's ``datapipes.iter.util.bz2fileloader`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import Bz2FileLoader as Bz2FileLoaderIterDataPipe

__all__ = ["Bz2FileLoaderIterDataPipe"]
