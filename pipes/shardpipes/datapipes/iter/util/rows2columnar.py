"""torchdata 0.9's ``datapipes.iter.util.rows2columnar`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import Rows2Columnar as Rows2ColumnarIterDataPipe

__all__ = ["Rows2ColumnarIterDataPipe"]
