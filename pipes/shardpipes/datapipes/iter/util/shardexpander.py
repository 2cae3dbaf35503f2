"""torchdata 0.9's ``datapipes.iter.util.shardexpander`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import ShardExpander as ShardExpanderIterDataPipe

__all__ = ["ShardExpanderIterDataPipe"]
