"""shardpipes: stream sharded datasets into distributed PyTorch training.

Import the stages from :mod:`shardpipes.datapipes.iter` and the loader from
:mod:`shardpipes.dataloader2`; importing either registers the functional names
(``.load_from_tar()``, ``.webdataset()``, ...) on torch's ``IterDataPipe``.

Importing ``shardpipes`` (or its bottom layer, :mod:`shardpipes.plan`) loads neither torch nor
the stages: ``shardpipes.datapipes`` and ``shardpipes.dataloader2`` are imported on first use
of the attribute (as torchdata 0.9 code writes ``torchdata.datapipes.iter...`` after
``import torchdata``).
"""

from importlib.metadata import PackageNotFoundError, version

from shardpipes import _fork  # noqa: F401  (its at-fork hooks: forked children never collect what they inherit)
from shardpipes._submodules import submodule_attributes
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
    "dataloader2",
    "datapipes",
]

# PEP 562: the stages and the loader import on first use, so that the plan and the errors import
# without torch (0.9's package was lazy at the top too).
__getattr__, __dir__ = submodule_attributes(__name__, ("dataloader2", "datapipes"))
