"""torchdata 0.9's ``datapipes.iter.load.huggingface`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import HuggingFaceHubReader as HuggingFaceHubReaderIterDataPipe

__all__ = ["HuggingFaceHubReaderIterDataPipe"]
