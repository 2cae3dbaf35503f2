"""torchdata 0.9's per-item reshaping stages: columns, indices, repetition and an in-memory cache.

``drop``, ``slice``, ``flatten``, ``enumerate``, ``add_index``, ``rows2columnar``, ``repeat`` and
``in_memory_cache`` keep 0.9's arguments, outputs and warnings.
"""

from __future__ import annotations

import sys
import warnings
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Iterator, Sized
from typing import Any, TypeVar, cast

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.plan.epoch import Resume

__all__ = [
    "DropperIterDataPipe",
    "EnumeratorIterDataPipe",
    "FlattenIterDataPipe",
    "InMemoryCacheHolderIterDataPipe",
    "IndexAdderIterDataPipe",
    "RepeaterIterDataPipe",
    "Rows2ColumnarIterDataPipe",
    "SliceIterDataPipe",
]

T = TypeVar("T")

_MISSING = (
    "At least one index in the filter is not present in the item being returned, please be "
    "aware that expected columns/keys may be missing."
)
_NOT_ITERABLE = (
    "The next item was not an iterable and cannot be filtered, please be aware that no filter "
    "was done or new item created."
)
_TWICE = (
    "Flattener tried to insert the same key twice into the dict item,the second key,value pair "
    "has been dropped."
)


def _check_present(item: Any, indices: Any) -> None:
    try:
        for i in indices:
            item[i]
    except (IndexError, KeyError):
        warnings.warn(_MISSING, stacklevel=3)


def _source_len(dp: Any, stage: Any) -> int:
    if isinstance(dp, Sized):
        return len(dp)
    raise TypeError(f"{type(stage).__name__} instance doesn't have valid length")


class _Reshaper(StageIterDataPipe[T]):
    """Base of ``drop``, ``slice`` and ``flatten``: one reshaped item per item, the source's length."""

    datapipe: IterDataPipe[Any]
    one_to_one = True

    def __len__(self) -> int:
        return _source_len(self.datapipe, self)


def _counted(source: Iterable[T], resume: Resume | None) -> Iterator[tuple[int, T]]:
    """``enumerate(source)``, or in a resumed epoch from where the reader had got.

    The start is read once the first item is in: the sharder plans the reader when it yields
    its first range.
    """
    it = iter(source)
    for first in it:
        start = resume.yielded() if resume is not None else 0
        yield start, first
        yield from enumerate(it, start + 1)


@register("drop")
class DropperIterDataPipe(_Reshaper[T]):
    """Drop the given columns of tuples and lists, or keys of dicts (functional name: ``drop``).

    Args:
        datapipe: Source of tuples, lists or dicts.
        indices: One index/key or a list of them.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 1, 2)]).drop([0, 2]))
        [(1,)]
    """

    def __init__(self, datapipe: IterDataPipe[Any], indices: Hashable | list[Hashable]) -> None:
        self.datapipe = datapipe
        self.indices = set(indices) if isinstance(indices, list) else {indices}

    def __iter__(self) -> Iterator[T]:
        drop = self.indices
        for item in self.datapipe:
            if isinstance(item, tuple):
                new: Any = tuple(x for i, x in enumerate(item) if i not in drop)
            elif isinstance(item, list):
                new = [x for i, x in enumerate(item) if i not in drop]
            elif isinstance(item, dict):
                new = {k: v for k, v in item.items() if k not in drop}
            else:
                new = item
                warnings.warn(_NOT_ITERABLE, stacklevel=2)
            _check_present(item, drop)
            yield new


@register("slice")
class SliceIterDataPipe(_Reshaper[T]):
    """Keep a slice of each tuple or list, or the given keys of each dict (functional name: ``slice``).

    Args:
        datapipe: Source of tuples, lists or dicts.
        index: Start of the slice, or a list of indices/keys to keep.
        stop: End of the slice. Default: ``None``.
        step: Step of the slice. Default: ``None``.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([[0, 1, 2, 3]]).slice(1, 3))
        [[1, 2]]
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        index: int | list[Hashable],
        stop: int | None = None,
        step: int | None = None,
    ) -> None:
        self.datapipe = datapipe
        self.index = index
        self.stop = stop
        self.step = step
        if isinstance(index, list) and (stop or step):
            warnings.warn(
                "A list of indices was passed as well as a stop or step for the slice, these "
                "arguments can't be used together so only the indices list will be used.",
                stacklevel=2,
            )

    def __iter__(self) -> Iterator[T]:
        index = self.index
        keep = index if isinstance(index, list) else None
        for item in self.datapipe:
            if isinstance(item, (tuple, list)):
                if keep is not None:
                    new: Any = type(item)(x for i, x in enumerate(item) if i in keep)
                else:
                    new = item[cast(Any, index) : self.stop : self.step]
            elif isinstance(item, dict):
                if keep is not None:
                    new = {k: v for k, v in item.items() if k in keep}
                elif index in item:
                    new = {index: item[index]}
                else:
                    new = item
                    warnings.warn(
                        "Dictionaries are not sliced by steps, only direct index. Please be aware "
                        "that no filter was done or new item created.",
                        stacklevel=2,
                    )
            else:
                new = item
                warnings.warn(_NOT_ITERABLE, stacklevel=2)
            if keep is not None:
                _check_present(item, keep)
            yield new


@register("flatten")
class FlattenIterDataPipe(_Reshaper[T]):
    """Flatten nested tuples/lists or dicts one level, at the given indices or everywhere (functional name: ``flatten``).

    Args:
        datapipe: Source of tuples, lists or dicts.
        indices: Index/key or list of them to flatten. Default: ``None`` (all of them).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, (1, 2))]).flatten())
        [(0, 1, 2)]
    """

    def __init__(
        self, datapipe: IterDataPipe[Any], indices: Hashable | list[Hashable] | None = None
    ) -> None:
        self.datapipe = datapipe
        self.indices: set[Any] = set()
        if indices:
            self.indices = set(indices) if isinstance(indices, list) else {indices}

    def __iter__(self) -> Iterator[T]:
        everything = not self.indices
        for item in self.datapipe:
            if isinstance(item, dict):
                new: Any = {}
                for k, v in item.items():
                    if (everything or k in self.indices) and isinstance(v, dict):
                        for k_sub, v_sub in v.items():
                            if k_sub not in item:
                                new[k_sub] = v_sub
                            else:
                                warnings.warn(_TWICE, stacklevel=2)
                    elif k not in new:
                        new[k] = v
                    else:
                        warnings.warn(_TWICE, stacklevel=2)
            else:
                out: list[Any] = []
                for i, x in enumerate(item):
                    if (everything or i in self.indices) and isinstance(x, (list, tuple)):
                        out.extend(x)
                    else:
                        out.append(x)
                new = tuple(out) if isinstance(item, tuple) else out
            if self.indices:
                _check_present(item, self.indices)
            yield new


@register("enumerate")
class EnumeratorIterDataPipe(StageIterDataPipe[tuple[int, T]]):
    """Yield ``(index, item)`` pairs, counting from ``starting_index`` (functional name: ``enumerate``).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper("ab").enumerate(starting_index=1))
        [(1, 'a'), (2, 'b')]
    """

    one_to_one = True
    resumable = True  # continues its count (set_resume)

    def __init__(self, source_datapipe: IterDataPipe[T], starting_index: int = 0) -> None:
        self.source_datapipe = source_datapipe
        self.starting_index = starting_index
        self._resume: Resume | None = None

    def set_resume(self, resume: Resume | None) -> EnumeratorIterDataPipe[T]:
        """Continue the count of a resumed epoch (the loader's hook; ``None``: from the start)."""
        self._resume = resume
        return self

    def __iter__(self) -> Iterator[tuple[int, T]]:
        for i, item in _counted(self.source_datapipe, self._resume):
            yield i + self.starting_index, item

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("add_index")
class IndexAdderIterDataPipe(StageIterDataPipe[dict[Any, Any]]):
    """Add the running index to each dict under ``index_name`` (functional name: ``add_index``).

    Raises:
        NotImplementedError: An item is not a dict.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([{"a": 1}]).add_index("i"))
        [{'a': 1, 'i': 0}]
    """

    one_to_one = True
    resumable = True  # continues its count (set_resume)

    def __init__(
        self, source_datapipe: IterDataPipe[dict[Any, Any]], index_name: str = "index"
    ) -> None:
        self.source_datapipe = source_datapipe
        self.index_name = index_name
        self._resume: Resume | None = None

    def set_resume(self, resume: Resume | None) -> IndexAdderIterDataPipe:
        """Continue the count of a resumed epoch (the loader's hook; ``None``: from the start)."""
        self._resume = resume
        return self

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        for i, row in _counted(self.source_datapipe, self._resume):
            if not isinstance(row, dict):
                raise NotImplementedError(
                    "We only support adding index to row or batch in dict type"
                )
            row[self.index_name] = i
            yield row

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("rows2columnar")
class Rows2ColumnarIterDataPipe(StageIterDataPipe[dict[str, list[Any]]]):
    """Turn each batch of rows (dicts or lists) into a dict of columns (functional name: ``rows2columnar``).

    Args:
        source_datapipe: Batches of rows.
        column_names: Column names; required when rows are lists. Default: ``None``.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> [dict(c) for c in IterableWrapper([[{"a": 1}, {"a": 2}]]).rows2columnar()]
        [{'a': [1, 2]}]
    """

    def __init__(
        self, source_datapipe: IterDataPipe[list[Any]], column_names: list[str] | None = None
    ) -> None:
        self.source_datapipe = source_datapipe
        self.column_names: list[str] = [] if column_names is None else column_names

    def __iter__(self) -> Iterator[dict[str, list[Any]]]:
        names = self.column_names
        for batch in self.source_datapipe:
            columns: defaultdict[str, list[Any]] = defaultdict(list)
            for row in batch:
                if isinstance(row, dict):
                    for k in names or row:
                        columns[k].append(row[k])
                else:
                    for i, v in enumerate(row):
                        columns[names[i]].append(v)
            yield columns

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("repeat")
class RepeaterIterDataPipe(StageIterDataPipe[T]):
    """Yield each item ``times`` times in a row (functional name: ``repeat``).

    Raises:
        ValueError: ``times`` is not greater than 1.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2]).repeat(2))
        [1, 1, 2, 2]
    """

    def __init__(self, source_datapipe: IterDataPipe[T], times: int) -> None:
        if times <= 1:
            raise ValueError(f"The number of repetition must be > 1, got {times}")
        self.source_datapipe = source_datapipe
        self.times = times

    def __iter__(self) -> Iterator[T]:
        for item in self.source_datapipe:
            for _ in range(self.times):
                yield item

    def __len__(self) -> int:
        return self.times * len(self.source_datapipe)


@register("in_memory_cache")
class InMemoryCacheHolderIterDataPipe(StageIterDataPipe[T]):
    """Keep the items of the first pass in memory and replay them afterwards (functional name: ``in_memory_cache``).

    Args:
        source_dp: Source.
        size: Cache limit in megabytes; beyond it the oldest items are dropped and read again
            from the source on later passes. Default: ``None`` (no limit).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper(range(3)).in_memory_cache()
        >>> list(dp), list(dp)
        ([0, 1, 2], [0, 1, 2])
    """

    def __init__(self, source_dp: IterDataPipe[T], size: int | None = None) -> None:
        self.source_dp = source_dp
        self.size = None if size is None else size * 1024 * 1024
        self.cache: deque[T] | None = None
        self.idx = 0  # items dropped from the front of the cache

    def __iter__(self) -> Iterator[T]:
        if self.cache:
            if self.idx > 0:
                for i, item in enumerate(self.source_dp):
                    if i >= self.idx:
                        break
                    yield item
            yield from self.cache
            return
        cache: deque[T] = deque()
        dropped = 0
        for item in self.source_dp:
            cache.append(item)
            if self.size is not None and sys.getsizeof(cache) > self.size:
                cache.popleft()
                dropped += 1
            yield item
        self.cache, self.idx = cache, dropped

    def __len__(self) -> int:
        try:
            return len(self.source_dp)
        except TypeError:
            if self.cache:
                return self.idx + len(self.cache)
            raise TypeError(
                f"{type(self).__name__} instance doesn't have valid length until the cache is loaded."
            ) from None
