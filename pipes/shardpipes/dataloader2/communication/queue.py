"""torchdata 0.9's ``dataloader2.communication.queue``: names kept, construction refused (see the package)."""

from __future__ import annotations

from shardpipes.dataloader2.communication._gone import GoneBase

__all__ = ["LocalQueue", "ThreadingQueue"]


class LocalQueue(GoneBase):
    """0.9's ``LocalQueue``: not used by shardpipes."""


class ThreadingQueue(GoneBase):
    """0.9's ``ThreadingQueue``: not used by shardpipes."""
