"""torchdata 0.9's ``datapipes.iter.load`` module path, for code that imports or patches it."""

__all__ = []
