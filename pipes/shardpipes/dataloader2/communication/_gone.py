"""Classes of 0.9's queue protocol that shardpipes keeps as names only."""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["GoneBase", "gone"]

_WHY = (
    "is part of torchdata 0.9's worker queue protocol, which shardpipes' worker pool does not "
    "use: run the graph with DataLoader2 and MultiProcessingReadingService"
)


class GoneBase:
    """Base of the names kept from 0.9's protocol: constructing one raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        gone(type(self).__name__)


def gone(name: str) -> NoReturn:
    """Raise the error for 0.9's protocol name ``name``."""
    raise NotImplementedError(f"{name} {_WHY}")
