"""Stages that bound or fix the number of items: ``header``, ``set_length``, ``cycle``, ``fixed_length``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._index_length import exact_length_plan, index_length
from shardpipes.datapipes.iter.base import StageIterDataPipe, register

__all__ = [
    "CyclerIterDataPipe",
    "FixedLengthIterDataPipe",
    "HeaderIterDataPipe",
    "LengthSetterIterDataPipe",
]

T = TypeVar("T")


class InvalidLengthError(ValueError, AssertionError):
    """A negative or non-integer ``set_length``: a ``ValueError`` (and, as 0.9 raised, an ``AssertionError``)."""


def _non_negative(name: str, value: int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} should be a non-negative integer, got {value!r}")


@register("header")
class HeaderIterDataPipe(StageIterDataPipe[T]):
    """Yield at most the first ``limit`` items of the source (functional name: ``header``).

    Args:
        source_datapipe: The source.
        limit: How many items at most. Default: ``10``.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(100)).header(3))
        [0, 1, 2]
    """

    def __init__(self, source_datapipe: IterDataPipe[T], limit: int | None = 10) -> None:
        _non_negative("limit", limit, allow_none=True)
        self.source_datapipe = source_datapipe
        self.limit = limit

    def __iter__(self) -> Iterator[T]:
        if self.limit is None:  # torchdata 0.9: no limit passes the source through
            yield from self.source_datapipe
            return
        if self.limit == 0:
            return
        for i, item in enumerate(self.source_datapipe, 1):
            yield item
            if i >= self.limit:
                return

    def __len__(self) -> int:
        try:
            n = len(self.source_datapipe)
        except TypeError:
            if self.limit is None:
                raise TypeError(
                    f"The length of this {type(self).__name__} cannot be determined."
                ) from None
            warnings.warn(
                f"The length of this {type(self).__name__} is inferred to be equal to its limit; "
                "the source has no length, so it may yield fewer items.",
                stacklevel=2,
            )
            return self.limit
        return n if self.limit is None else min(self.limit, n)


@register("set_length")
class LengthSetterIterDataPipe(StageIterDataPipe[T]):
    """Give the source a length; the items are the source's, unchanged (functional name: ``set_length``).

    Args:
        source_datapipe: The source.
        length: The length ``len()`` reports (as in torchdata 0.9, iteration is not capped:
            use ``header(n)`` for that).

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper(range(4)).set_length(4)
        >>> len(dp), list(dp)
        (4, [0, 1, 2, 3])
    """

    def __init__(self, source_datapipe: IterDataPipe[T], length: int) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise InvalidLengthError(f"length should be a non-negative integer, got {length!r}")
        self.source_datapipe = source_datapipe
        self.length = length

    def __iter__(self) -> Iterator[T]:
        # torchdata 0.9: set_length only sets len(); every item of the source is yielded.
        # Use header(n) (or fixed_length(n)) to cap the items.
        yield from self.source_datapipe

    def __len__(self) -> int:
        return self.length


@register("cycle")
class CyclerIterDataPipe(StageIterDataPipe[T]):
    """Repeat the source ``count`` times, or forever (functional name: ``cycle``).

    Args:
        source_datapipe: The source.
        count: How many passes; ``None`` (default) repeats forever.

    Raises:
        ValueError: The source is empty and ``count`` is ``None`` (that would spin forever).

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2]).cycle(3))
        [1, 2, 1, 2, 1, 2]
    """

    def __init__(self, source_datapipe: IterDataPipe[T], count: int | None = None) -> None:
        if count is not None and (not isinstance(count, int) or count < 0):
            raise ValueError(f"Expected non-negative count, got {count!r}")
        self.source_datapipe = source_datapipe
        self.count = count

    def __iter__(self) -> Iterator[T]:
        passes = 0
        while self.count is None or passes < self.count:
            empty = True
            for item in self.source_datapipe:
                empty = False
                yield item
            passes += 1
            if empty and self.count is None:
                raise ValueError(
                    f"cycle() over an empty source ({self.source_datapipe!r}) would never end"
                )

    def __len__(self) -> int:
        if self.count is None:
            raise TypeError(
                f"This {type(self).__name__} instance cycles forever, and therefore doesn't have valid length"
            )
        return self.count * len(self.source_datapipe)


@register("fixed_length")
class FixedLengthIterDataPipe(StageIterDataPipe[T]):
    """Yield exactly ``length`` items per epoch (functional name: ``fixed_length``).

    If the source ends before ``length`` items, it is started again; if it has more, the next
    epoch continues where this one stopped. Every epoch therefore has the same size whatever
    the source's size, and over many epochs every item is seen equally often.

    The position in the source lives in this object: it carries over between epochs in the
    same process (in-process, or persistent workers), and is part of the loader's state.

    Args:
        source_datapipe: The source.
        length: Items per epoch. Default: ``None``, this reader's share of the epoch as the
            shard index gives it: the graph must have ``sharding_by_index`` upstream, with only
            one-to-one stages and at most one ``batch()`` in between (then it counts batches).
            No dataset size to know or guess.

    Raises:
        ValueError: The source yields nothing at all (no epoch of ``length > 0`` is possible),
            or ``length=None`` without ``sharding_by_index`` upstream.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper(range(5)).fixed_length(3)
        >>> list(dp), list(dp), list(dp)
        ([0, 1, 2], [3, 4, 0], [1, 2, 3])
    """

    spans_epochs = True  # the next epoch continues where this one stopped

    def __init__(self, source_datapipe: IterDataPipe[T], length: int | None = None) -> None:
        _non_negative("length", length, allow_none=True)
        self.source_datapipe = source_datapipe
        self.length = length
        self._it: Iterator[T] | None = None

    def _from_index(self) -> int:
        plan = exact_length_plan(self.source_datapipe)
        if plan is None:
            raise ValueError(
                "fixed_length() without a length takes it from the shard index: it needs "
                "sharding_by_index upstream with only one-to-one stages and at most one batch() "
                "in between; give the length explicitly otherwise"
            )
        return index_length(self.source_datapipe, plan)

    def __iter__(self) -> Iterator[T]:
        target = self.length  # None: from the index, once the sharder has partitioned the epoch
        produced = 0
        fresh = False  # whether self._it was started during this step and yielded nothing yet
        while target is None or produced < target:
            if self._it is None:
                self._it = iter(self.source_datapipe)
                fresh = True
            try:
                item = next(self._it)
            except StopIteration:
                self._it = None
                if target is None:
                    target = self._from_index()
                if fresh:
                    if target == 0:
                        return
                    raise ValueError(
                        f"fixed_length({target}) over a source that yields nothing"
                    ) from None
                continue
            if target is None:
                target = self._from_index()
            fresh = False
            produced += 1
            yield item

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(
                f"{type(self).__name__} instance doesn't have valid length (it comes from the index)"
            )
        return self.length

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]
        state["_it"] = None  # a live iterator does not pickle; a copy starts from the beginning
        return state
