"""torchdata 0.9's ``datapipes.map.load`` module path, for code that imports or patches it."""

__all__ = []
