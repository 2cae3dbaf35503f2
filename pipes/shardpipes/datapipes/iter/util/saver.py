"""torchdata 0.9's ``datapipes.iter.util.saver`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import Saver as SaverIterDataPipe

U = bytes | bytearray | str

__all__ = ["SaverIterDataPipe", "U"]
