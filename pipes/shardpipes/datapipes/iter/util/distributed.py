"""torchdata 0.9's ``datapipes.iter.util.distributed`` path: ``FullSync`` and its time-out error."""

from dataclasses import dataclass

from shardpipes.datapipes.iter.sync import FullSyncIterDataPipe, PrefetchTimeoutError


@dataclass
class Expected:
    """An item's index and the error its fetch raised, if any (0.9's prefetch callback value)."""

    index: int
    error: BaseException | None = None

    def has_error(self) -> bool:
        """Whether the fetch raised."""
        return self.error is not None


__all__ = ["Expected", "FullSyncIterDataPipe", "PrefetchTimeoutError"]
