"""The loader's copy of a graph, with multiprocessing's shared objects shared, not copied.

Code shares state with its loader workers through ``multiprocessing.Value``/``Array``/locks
inherited at fork (open_clip's ``SharedEpoch`` inside its shard sampler: the main process sets
the epoch, the workers read it). Such an object cannot be copied (``deepcopy`` pickles it, which
multiprocessing refuses outside of process start) and must not be: its point is that every
process sees the same memory. So the graph is deep-copied with those objects kept as they are.
"""

from __future__ import annotations

import copy
from multiprocessing.sharedctypes import SynchronizedBase
from multiprocessing.synchronize import SemLock
from typing import Any, TypeVar

__all__ = ["copy_graph"]

T = TypeVar("T")
_SHARED = (SynchronizedBase, SemLock)
_SCALARS = (str, bytes, bytearray, int, float, bool, type(None))
_MAX_DEPTH = 8  # graph -> stage -> its state -> ... ; deep enough for samplers holding an epoch
_MAX_ITEMS = 4096  # long containers (shard lists) hold data, not synchronisation objects


def _find_shared(obj: Any, memo: dict[int, Any], seen: set[int], depth: int) -> None:
    if depth < 0 or isinstance(obj, _SCALARS) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _SHARED):
        memo[id(obj)] = obj
        return
    if isinstance(obj, dict):
        items: Any = list(obj.values())[:_MAX_ITEMS]
    elif isinstance(obj, list | tuple | set | frozenset):
        items = list(obj)[:_MAX_ITEMS]
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    for item in items:
        _find_shared(item, memo, seen, depth - 1)


def copy_graph(graph: T) -> T:
    """``copy.deepcopy(graph)``, keeping the multiprocessing shared objects it holds shared."""
    memo: dict[int, Any] = {}
    _find_shared(graph, memo, set(), _MAX_DEPTH)
    return copy.deepcopy(graph, memo)
