"""torchdata 0.9's ``datapipes.iter.util.tararchiveloader`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import TarArchiveLoader as TarArchiveLoaderIterDataPipe

__all__ = ["TarArchiveLoaderIterDataPipe"]
