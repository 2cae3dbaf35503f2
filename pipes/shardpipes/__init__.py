"""shardpipes: stream sharded datasets into distributed PyTorch training.

Import the stages from :mod:`shardpipes.datapipes.iter` and the loader from
:mod:`shardpipes.dataloader2`; importing either registers the functional names
(``.load_from_tar()``, ``.webdataset()``, ...) on torch's ``IterDataPipe``.
"""

from importlib.metadata import PackageNotFoundError, version

from shardpipes import datapipes
from shardpipes.errors import (
    DecodeError,
    SampleFormatError,
    ShardFormatError,
    ShardpipesError,
    ShardReadError,
)

try:
    __version__ = version("shardpipes")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "DecodeError",
    "SampleFormatError",
    "ShardFormatError",
    "ShardReadError",
    "ShardpipesError",
    "__version__",
    "datapipes",
]
