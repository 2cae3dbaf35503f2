"""torchdata 0.9's ``datapipes.iter.util.distributed`` path: ``FullSync`` and its time-out error."""

from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe, PrefetchTimeoutError

__all__ = ["FullSyncIterDataPipe", "PrefetchTimeoutError"]
