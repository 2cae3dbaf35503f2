"""DataPipes: ``shardpipes.datapipes.iter`` holds the stages; ``map`` and ``utils`` complete torchdata 0.9's surface."""

from torch.utils.data import DataChunk, functional_datapipe

from shardpipes.datapipes import iter, map, utils

__all__ = ["DataChunk", "functional_datapipe", "iter", "map", "utils"]
