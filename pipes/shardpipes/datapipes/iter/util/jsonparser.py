"""torchdata 0.9's ``datapipes.iter.util.jsonparser`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import JsonParser as JsonParserIterDataPipe

__all__ = ["JsonParserIterDataPipe"]
