"""torchdata 0.9's ``datapipes.iter.util.zip_longest`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import ZipperLongest as ZipperLongestIterDataPipe

__all__ = ["ZipperLongestIterDataPipe"]
