"""torchdata 0.9's ``datapipes.map.util.converter`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import MapToIterConverter as MapToIterConverterIterDataPipe

__all__ = ["MapToIterConverterIterDataPipe"]
