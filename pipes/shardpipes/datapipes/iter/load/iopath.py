"""torchdata 0.9's ``datapipes.iter.load.iopath`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import IoPathFileLister as IoPathFileListerIterDataPipe
from shardpipes.datapipes.iter import IoPathFileOpener as IoPathFileOpenerIterDataPipe
from shardpipes.datapipes.iter import IoPathSaver as IoPathSaverIterDataPipe

U = bytes | bytearray | str

__all__ = [
    "IoPathFileListerIterDataPipe",
    "IoPathFileOpenerIterDataPipe",
    "IoPathSaverIterDataPipe",
    "U",
]
