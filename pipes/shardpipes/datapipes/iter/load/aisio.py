"""torchdata 0.9's ``datapipes.iter.load.aisio`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    AISFileLister as AISFileListerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    AISFileLoader as AISFileLoaderIterDataPipe,
)

__all__ = ["AISFileListerIterDataPipe", "AISFileLoaderIterDataPipe"]
