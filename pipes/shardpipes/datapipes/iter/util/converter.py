"""torchdata 0.9's ``datapipes.iter.util.converter`` module path, for code that imports or patches it."""

from shardpipes.datapipes.map import IterToMapConverter as IterToMapConverterMapDataPipe

__all__ = ["IterToMapConverterMapDataPipe"]
