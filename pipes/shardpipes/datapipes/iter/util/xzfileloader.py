"""torchdata 0.9's ``datapipes.iter.util.xzfileloader`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import XzFileLoader as XzFileLoaderIterDataPipe

__all__ = ["XzFileLoaderIterDataPipe"]
