"""torchdata 0.9's ``dataloader2.communication.map``: names kept, construction refused (see the package)."""

from __future__ import annotations

from typing import Any, NoReturn

from shardpipes.dataloader2.communication._gone import GoneBase, gone

__all__ = [
    "DataPipeBehindQueues",
    "EnsureNonBlockingMapDataPipe",
    "NonBlockingMap",
    "NotAvailable",
    "QueueWrapperForMap",
    "default_not_available_hook",
]


class DataPipeBehindQueues(GoneBase):
    """0.9's ``DataPipeBehindQueues``: not used by shardpipes."""


class EnsureNonBlockingMapDataPipe(GoneBase):
    """0.9's ``EnsureNonBlockingMapDataPipe``: not used by shardpipes."""


class NonBlockingMap(GoneBase):
    """0.9's ``NonBlockingMap``: not used by shardpipes."""


class NotAvailable(Exception):
    """0.9's ``NotAvailable`` signal."""


class QueueWrapperForMap(GoneBase):
    """0.9's ``QueueWrapperForMap``: not used by shardpipes."""


def default_not_available_hook(*args: Any, **kwargs: Any) -> NoReturn:
    """0.9's ``default_not_available_hook``: not used by shardpipes."""
    gone("default_not_available_hook")
