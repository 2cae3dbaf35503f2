"""Helpers of torchdata 0.9's ``datapipes.utils``: ``StreamWrapper``, ``janitor``, ``pin_memory_fn``, ``to_graph``."""

from torch.utils.data.datapipes.utils.common import StreamWrapper

from shardpipes._submodules import submodule_attributes
from shardpipes.datapipes.utils._graph import to_graph

# From the 0.9 submodules (not _helpers): importing a submodule sets the package attribute of
# its name, so the functions must be bound after the submodules load, as 0.9 bound them.
from shardpipes.datapipes.utils.janitor import janitor
from shardpipes.datapipes.utils.pin_memory import pin_memory_fn

__all__ = [
    "StreamWrapper",
    "janitor",
    "pin_memory_fn",
    "to_graph",
]

# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(__name__, ("common", "pin_memory"))
