"""torchdata 0.9's adapters: callables ``DataLoader2(datapipe_adapter_fn=...)`` applies to its graph.

``DataLoader2`` applies them, in order, to its own copy of the graph before the reading
service sees it.
"""

from __future__ import annotations

from abc import abstractmethod

from torch.utils.data.graph import DataPipe, traverse_dps
from torch.utils.data.graph_settings import apply_shuffle_settings, get_all_graph_pipes

__all__ = ["Adapter", "CacheTimeout", "Shuffle"]


class Adapter:
    """Base class: ``adapter(datapipe) -> datapipe`` (may change the graph in place)."""

    @abstractmethod
    def __call__(self, datapipe: DataPipe) -> DataPipe:
        """Return the adapted graph."""


class Shuffle(Adapter):
    """Turn every ``shuffle()`` of the graph on or off.

    Args:
        enable: ``True`` enables them (and adds one at the end, with a warning, when the graph
            has none); ``False`` disables them; ``None`` changes nothing.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> from shardpipes.dataloader2 import DataLoader2
        >>> list(DataLoader2(IterableWrapper(range(5)).shuffle(), [Shuffle(False)]))
        [0, 1, 2, 3, 4]
    """

    def __init__(self, enable: bool | None = True) -> None:
        self.enable = enable

    def __call__(self, datapipe: DataPipe) -> DataPipe:
        """Apply the setting to every shuffle of ``datapipe``."""
        return apply_shuffle_settings(datapipe, shuffle=self.enable)


class CacheTimeout(Adapter):
    """Set how long ``end_caching()`` stages wait for a file another process is caching.

    Args:
        timeout: Seconds.
    """

    def __init__(self, timeout: float | None = None) -> None:
        if timeout is None:
            raise ValueError("timeout should be integer")
        self.timeout = timeout

    def __call__(self, datapipe: DataPipe) -> DataPipe:
        """Set the timeout of every stage of the graph that waits for cached files."""
        # A stage waits for files other processes cache because it has ``set_cache_timeout``
        # (0.9's end_caching builds one), as a stage is random because it has ``set_seed``.
        for dp in get_all_graph_pipes(traverse_dps(datapipe)):
            hook = getattr(type(dp), "set_cache_timeout", None)
            if callable(hook):
                hook(dp, self.timeout)
        return datapipe
