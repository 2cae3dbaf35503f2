"""torchdata 0.9's ``datapipes.iter.transform`` module path, for code that imports or patches it."""

from shardpipes._submodules import submodule_attributes

__all__ = []

# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(__name__, ("bucketbatcher", "callable"))
