"""shardpipes: stream sharded datasets into distributed PyTorch training.

Import the stages from :mod:`shardpipes.datapipes.iter` and the loader from
:mod:`shardpipes.dataloader2`; importing either registers the functional names
(``.load_from_tar()``, ``.webdataset()``, ...) on torch's ``IterDataPipe``.

Importing ``shardpipes`` (or its bottom layer, :mod:`shardpipes.plan`) loads neither torch nor
the stages: ``shardpipes.datapipes`` is imported on first use of the attribute (as torchdata
0.9 code writes ``torchdata.datapipes.iter...`` after ``import torchdata``).
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

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


def __getattr__(name: str) -> ModuleType:
    # PEP 562: the one lazy attribute, so that the plan and the errors import without torch.
    if name == "datapipes":
        return importlib.import_module("shardpipes.datapipes")
    raise AttributeError(f"module 'shardpipes' has no attribute {name!r}")
