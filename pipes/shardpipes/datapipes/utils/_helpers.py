"""``janitor`` (close what a dropped value holds) and ``pin_memory_fn`` (pin nested tensors)."""

from __future__ import annotations

import collections.abc
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper

__all__ = ["janitor", "pin_memory_fn"]


def janitor(obj: Any) -> None:
    """Close every ``StreamWrapper`` found in ``obj`` (nested lists, tuples, dicts)."""
    StreamWrapper.close_streams(obj)


def pin_memory_fn(data: Any, device: Any = None) -> Any:
    """Pin every tensor in ``data`` (nested mappings and sequences keep their type).

    Example:
        >>> pin_memory_fn({"a": "text", "b": [1, 2]})
        {'a': 'text', 'b': [1, 2]}
    """
    if hasattr(data, "pin_memory"):
        return data.pin_memory(device)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory_fn(v, device) for k, v in data.items()}
        try:
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, collections.abc.Sequence):
        items = [pin_memory_fn(v, device) for v in data]
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
