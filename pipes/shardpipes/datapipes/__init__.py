"""DataPipes: ``shardpipes.datapipes.iter`` holds the stages."""

from shardpipes.datapipes import iter

__all__ = ["iter"]
