"""torchdata 0.9's ``datapipes.iter.util.hashchecker`` module path, for code that imports or patches it."""

from torch.utils.data.datapipes.utils.common import StreamWrapper

from shardpipes.datapipes.iter import HashChecker as HashCheckerIterDataPipe

D_type = str | bytes | bytearray
U = D_type | StreamWrapper

__all__ = ["D_type", "HashCheckerIterDataPipe", "U"]
