"""torchdata 0.9's ``datapipes.iter.util.mux_longest`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import MultiplexerLongest as MultiplexerLongestIterDataPipe

__all__ = ["MultiplexerLongestIterDataPipe"]
