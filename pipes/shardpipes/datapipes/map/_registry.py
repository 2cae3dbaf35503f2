"""Registration of MapDataPipe functional names (torch keeps them apart from IterDataPipe's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch.utils.data import MapDataPipe

__all__ = ["register_map"]

_C = TypeVar("_C", bound=type)


def register_map(name: str) -> Callable[[_C], _C]:
    """Register ``cls`` as ``MapDataPipe.<name>``; re-importing shardpipes replaces our own entry.

    Raises:
        RuntimeError: Another package already holds the name.
    """

    def deco(cls: _C) -> _C:
        taken = MapDataPipe.functions.get(name)
        if taken is not None:
            args = getattr(taken, "args", None)
            owner = args[0] if args else None
            if (
                owner is None
                or owner.__qualname__ != cls.__qualname__
                or owner.__module__ != cls.__module__
            ):
                where = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else "?"
                raise RuntimeError(
                    f"MapDataPipe functional name {name!r} is already registered by {where}"
                )
            del MapDataPipe.functions[name]
        MapDataPipe.register_datapipe_as_function(name, cls)
        return cls

    return deco
