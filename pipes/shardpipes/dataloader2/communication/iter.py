"""torchdata 0.9's ``dataloader2.communication.iter``: names kept, construction refused (see the package)."""

from __future__ import annotations

from typing import Any, NoReturn

from shardpipes.dataloader2.communication._gone import GoneBase, gone

__all__ = [
    "DataPipeBehindQueues",
    "EnsureNonBlockingDataPipe",
    "InvalidStateResetRequired",
    "NonBlocking",
    "NotAvailable",
    "QueueWrapper",
    "default_not_available_hook",
]


class DataPipeBehindQueues(GoneBase):
    """0.9's ``DataPipeBehindQueues``: not used by shardpipes."""


class EnsureNonBlockingDataPipe(GoneBase):
    """0.9's ``EnsureNonBlockingDataPipe``: not used by shardpipes."""


class InvalidStateResetRequired(Exception):
    """0.9's ``InvalidStateResetRequired`` signal."""


class NonBlocking(GoneBase):
    """0.9's ``NonBlocking``: not used by shardpipes."""


class NotAvailable(Exception):
    """0.9's ``NotAvailable`` signal."""


class QueueWrapper(GoneBase):
    """0.9's ``QueueWrapper``: not used by shardpipes."""


def default_not_available_hook(*args: Any, **kwargs: Any) -> NoReturn:
    """0.9's ``default_not_available_hook``: not used by shardpipes."""
    gone("default_not_available_hook")
