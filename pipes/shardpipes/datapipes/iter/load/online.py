"""torchdata 0.9's ``datapipes.iter.load.online`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    GDriveReader as GDriveReaderDataPipe,
)
from shardpipes.datapipes.iter import (
    HttpReader as HTTPReaderIterDataPipe,
)
from shardpipes.datapipes.iter import (
    OnlineReader as OnlineReaderIterDataPipe,
)

__all__ = ["GDriveReaderDataPipe", "HTTPReaderIterDataPipe", "OnlineReaderIterDataPipe"]
