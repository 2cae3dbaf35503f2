"""Conversions between IterDataPipe and MapDataPipe: ``to_map_datapipe`` and ``to_iter_datapipe``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.utils.common import _check_unpickable_fn

from shardpipes.datapipes.iter.base import register
from shardpipes.datapipes.map._registry import register_map

__all__ = ["IterToMapConverterMapDataPipe", "MapToIterConverterIterDataPipe"]


class IterToMapConverterMapDataPipe(MapDataPipe[Any]):
    """A MapDataPipe over the ``(key, value)`` pairs of an IterDataPipe, read on first access.

    Args:
        datapipe: Yields ``(key, value)`` pairs, or items ``key_value_fn`` turns into pairs.
        key_value_fn: Maps an item to ``(key, value)``. Default: ``None`` (items are pairs).

    Raises:
        IndexError: A key is not in the map.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()["b"]
        2
    """

    def __init__(
        self, datapipe: IterDataPipe[Any], key_value_fn: Callable[[Any], Any] | None = None
    ) -> None:
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(
                f"IterToMapConverter can only apply on IterDataPipe, but found {type(datapipe)}"
            )
        if key_value_fn is not None:
            _check_unpickable_fn(key_value_fn)
        self.datapipe = datapipe
        self.key_value_fn = key_value_fn
        self._map: dict[Any, Any] | None = None

    def _load_map(self) -> dict[Any, Any]:
        table: dict[Any, Any] = {}
        for item in self.datapipe:
            pair = item if self.key_value_fn is None else self.key_value_fn(item)
            try:
                n = len(pair)
            except TypeError:
                raise TypeError(
                    f"Cannot convert dictionary update element {type(pair)} ({pair}) to a sequence"
                ) from None
            if n != 2:
                raise ValueError(
                    f"dictionary update sequence element has length {n}, 2 is required"
                )
            key, value = pair
            if key in table:
                warnings.warn(
                    f"Found duplicate key {key}. Please check your `key_value_fn`", stacklevel=3
                )
            table[key] = value
        self._map = table
        return table

    def __getitem__(self, index: Any) -> Any:
        table = self._load_map() if self._map is None else self._map
        try:
            return table[index]
        except KeyError:
            raise IndexError(f"Index {index} is invalid for IterToMapConverter.") from None

    def __len__(self) -> int:
        if self._map is not None:
            return len(self._map)
        try:
            return len(self.datapipe)
        except (TypeError, NotImplementedError):
            pass
        warnings.warn(
            "Data from prior DataPipe are loaded to get length of IterToMapConverter before "
            "execution of the pipeline. Please consider removing len().",
            stacklevel=2,
        )
        return len(self._load_map())

    def __getstate__(self) -> Any:
        return (self.datapipe, self.key_value_fn, self._map)

    def __setstate__(self, state: Any) -> None:
        self.datapipe, self.key_value_fn, self._map = state


@register("to_map_datapipe")
class _IterToMap(IterDataPipe[Any]):
    """Turn an IterDataPipe of pairs into a MapDataPipe (functional name: ``to_map_datapipe``)."""

    def __new__(  # type: ignore[misc]
        cls, datapipe: IterDataPipe[Any], key_value_fn: Callable[[Any], Any] | None = None
    ) -> IterToMapConverterMapDataPipe:
        return IterToMapConverterMapDataPipe(datapipe, key_value_fn)


@register_map("to_iter_datapipe")
class MapToIterConverterIterDataPipe(IterDataPipe[Any]):
    """An IterDataPipe of ``datapipe[i]`` for each index (functional name: ``to_iter_datapipe``).

    Args:
        datapipe: A MapDataPipe.
        indices: Indices to read, in order. Default: ``None`` (``range(len(datapipe))``).

    Example:
        >>> from shardpipes.datapipes.map import SequenceWrapper
        >>> list(SequenceWrapper("abc").to_iter_datapipe())
        ['a', 'b', 'c']
    """

    def __init__(self, datapipe: MapDataPipe[Any], indices: Sequence[Any] | None = None) -> None:
        if not isinstance(datapipe, MapDataPipe):
            raise TypeError(
                f"MapToIterConverter can only apply on MapDataPipe, but found {type(datapipe)}"
            )
        self.datapipe = datapipe
        self.indices = indices if indices else range(len(datapipe))

    def __iter__(self) -> Iterator[Any]:
        for idx in self.indices:
            yield self.datapipe[idx]

    def __len__(self) -> int:
        return len(self.indices)
