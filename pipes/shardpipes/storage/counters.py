"""What this process read from storage: bytes, open remote streams, retries by cause.

Process-local totals, bumped where the bytes arrive (a remote block, a local shard opened, a
range read) and where a read is retried; a block is 1-16 MiB, so counting costs nothing
measurable. Worker processes send theirs to the main process with their batches (the loader's
telemetry, ``dataloader2/telemetry/``); a forked worker starts from its parent's totals, so a
reader of these keeps its own starting point and reports differences.
"""

from __future__ import annotations

import threading
from typing import Any

from shardpipes.storage.retry import ShortBody

__all__ = ["COUNTERS", "StorageCounters", "retry_cause"]


class StorageCounters:
    """Running totals of one process's reads (thread-safe: read-ahead threads fetch blocks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.opened = 0  # remote streams opened ...
        self.closed = 0  # ... and closed: open streams = opened - closed
        self.retries: dict[str, int] = {}

    def read(self, nbytes: int) -> None:
        """``nbytes`` arrived from storage."""
        with self._lock:
            self.bytes_read += nbytes

    def stream_opened(self) -> None:
        """A remote stream was opened."""
        with self._lock:
            self.opened += 1

    def stream_closed(self) -> None:
        """A remote stream was closed."""
        with self._lock:
            self.closed += 1

    def retried(self, cause: str) -> None:
        """A read failed with ``cause`` and is tried again."""
        with self._lock:
            self.retries[cause] = self.retries.get(cause, 0) + 1

    def totals(self) -> dict[str, Any]:
        """A plain copy: ``bytes_read``, ``opened``, ``closed``, ``retries`` (cause -> count)."""
        with self._lock:
            return {
                "bytes_read": self.bytes_read,
                "opened": self.opened,
                "closed": self.closed,
                "retries": dict(self.retries),
            }


#: This process's totals.
COUNTERS = StorageCounters()


def retry_cause(exc: BaseException) -> str:
    """A short name for why a read is retried: the HTTP status when there is one, else the type.

    Examples:
        >>> retry_cause(TimeoutError("read timed out"))
        'TimeoutError'
    """
    if isinstance(exc, ShortBody):
        return "cut connection"
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        for attr in ("status", "code", "status_code"):
            value = getattr(seen, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return f"HTTP {value}"
        seen = seen.__cause__
    return type(exc).__name__
