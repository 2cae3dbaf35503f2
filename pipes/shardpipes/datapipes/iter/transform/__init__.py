"""torchdata 0.9's ``datapipes.iter.transform`` module path, for code that imports or patches it."""

__all__ = []
