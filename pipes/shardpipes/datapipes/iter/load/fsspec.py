"""torchdata 0.9's ``datapipes.iter.load.fsspec`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    FSSpecFileLister as FSSpecFileListerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    FSSpecFileOpener as FSSpecFileOpenerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    FSSpecSaver as FSSpecSaverIterDataPipe,
)

U = bytes | bytearray | str

__all__ = [
    "FSSpecFileListerIterDataPipe",
    "FSSpecFileOpenerIterDataPipe",
    "FSSpecSaverIterDataPipe",
    "U",
]
