"""torchdata 0.9's function-applying stages: ``map_batches``, ``flatmap``, ``shuffled_flatmap``, ``async_map_batches``.

Same arguments and output as torchdata 0.9, written for shardpipes. Functions are checked with
torch's ``_check_unpickable_fn`` (a lambda or local function warns, as in 0.9).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import _check_unpickable_fn, validate_input_col

from shardpipes.datapipes.iter.base import PicklesRng, StageIterDataPipe, register

__all__ = [
    "BatchAsyncMapperIterDataPipe",
    "BatchMapperIterDataPipe",
    "FlatMapperIterDataPipe",
    "ShuffledFlatMapperIterDataPipe",
]

T = TypeVar("T")


def _identity(*args: Any) -> Any:
    return args[0] if len(args) == 1 else args


def _call(fn: Callable[..., Any], data: Any, input_col: Any) -> Any:
    """Apply ``fn`` to ``data`` or to its ``input_col`` column(s), as torch's ``map`` does."""
    if input_col is None:
        return fn(data)
    if isinstance(input_col, (list, tuple)):
        return fn(*(data[col] for col in input_col))
    return fn(data[input_col])


class _BadBufferSize(ValueError, AssertionError):
    """A ``buffer_size`` below 1 (0.9 raised ``AssertionError``)."""


def _seed_from_torch() -> int:
    # 0.9 draws the seed from torch's RNG when the loader did not set one, so
    # ``torch.manual_seed`` decides the order.
    return int(torch.empty((), dtype=torch.int64).random_().item())


@register("map_batches")
class BatchMapperIterDataPipe(StageIterDataPipe[T]):
    """Group items in batches of ``batch_size``, apply ``fn`` to each batch and yield its outputs (functional name: ``map_batches``).

    Args:
        datapipe: Source.
        fn: Called with a list of items (or of their ``input_col`` columns); returns an iterable.
        batch_size: Items per call; the last call may get fewer.
        input_col: Column(s) of each item passed to ``fn``. Default: ``None`` (whole items).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).map_batches(sum_pairs, 2))
        [1, 5, 4]
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        fn: Callable[..., Any],
        batch_size: int,
        input_col: Any = None,
    ) -> None:
        _check_unpickable_fn(fn)
        if batch_size <= 0:
            raise ValueError(f"batch_size should be larger than 0, got {batch_size}")
        self.datapipe = datapipe
        self.fn = fn
        self.batch_size = batch_size
        self.input_col = input_col

    def _apply(self, batch: list[Any]) -> Any:
        col = self.input_col
        if col is None:
            return self.fn(batch)
        if isinstance(col, (list, tuple)):
            return self.fn([[d[c] for c in col] for d in batch])
        return self.fn([d[col] for d in batch])

    def __iter__(self) -> Iterator[T]:
        batch: list[Any] = []
        for item in self.datapipe:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield from self._apply(batch)
                batch = []
        if batch:
            yield from self._apply(batch)

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__}'s length relies on the output of its function.")


def sum_pairs(batch: list[int]) -> list[int]:
    """Doctest helper: one sum per batch."""
    return [sum(batch)]


@register("flatmap")
class FlatMapperIterDataPipe(StageIterDataPipe[T]):
    """Apply ``fn`` to each item and yield every element of its result (functional name: ``flatmap``).

    Args:
        datapipe: Source.
        fn: Returns an iterable for each item. Default: ``None`` (each item is iterable itself).
        input_col: Column(s) passed to ``fn`` (several columns as several arguments).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([[1, 2], [3]]).flatmap())
        [1, 2, 3]
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        fn: Callable[..., Any] | None = None,
        input_col: Any = None,
    ) -> None:
        fn = _identity if fn is None else fn
        _check_unpickable_fn(fn)
        validate_input_col(fn, input_col)
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col

    def __iter__(self) -> Iterator[T]:
        for item in self.datapipe:
            yield from _call(self.fn, item, self.input_col)

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__}'s length relies on the output of its function.")


@register("shuffled_flatmap")
class ShuffledFlatMapperIterDataPipe(PicklesRng, StageIterDataPipe[T]):
    """Like ``flatmap``, but interleave the outputs of ``buffer_size`` items at random (functional name: ``shuffled_flatmap``).

    Keeps up to ``buffer_size`` iterators open and draws the next element from a random one.
    Random like ``shuffle``: ``set_seed`` (called by the reading service) or torch's RNG decides
    the order; ``set_shuffle(False)`` makes it a plain ``flatmap``.

    Args:
        datapipe: Source.
        fn: Returns an iterable for each item. Default: ``None`` (items are iterable).
        input_col: Column(s) passed to ``fn``.
        buffer_size: Iterators kept open. Default: ``100``.
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        fn: Callable[..., Any] | None = None,
        input_col: Any = None,
        buffer_size: int = 100,
    ) -> None:
        self._no_op_fn = fn is None
        fn = _identity if fn is None else fn
        _check_unpickable_fn(fn)
        validate_input_col(fn, input_col)
        if buffer_size <= 0:  # AssertionError as in 0.9, and a ValueError
            raise _BadBufferSize(f"buffer_size should be larger than 0, got {buffer_size}")
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.buffer_size = buffer_size
        self._enabled = True
        self._seed: int | None = None
        self._rng = random.Random()

    def set_shuffle(self, shuffle: bool = True) -> ShuffledFlatMapperIterDataPipe[T]:
        """Turn shuffling on or off (called by ``apply_shuffle_settings``)."""
        self._enabled = shuffle
        return self

    def set_seed(self, seed: int) -> ShuffledFlatMapperIterDataPipe[T]:
        """Seed the next iteration (called by reading services)."""
        self._seed = seed
        return self

    def reset(self) -> None:
        """Reseed at the start of an iteration (called by torch's iterator hook)."""
        if self._enabled:
            # A seed set by set_seed (the loader's, per epoch) stays until the next set_seed.
            self._rng.seed(_seed_from_torch() if self._seed is None else self._seed)

    def __iter__(self) -> Iterator[T]:
        if not self._enabled:
            for item in self.datapipe:
                yield from _call(self.fn, item, self.input_col)
            return
        rng, size = self._rng, self.buffer_size
        buffer: list[Iterator[Any]] = []
        idx = rng.randint(0, size - 1)
        for item in self.datapipe:
            while len(buffer) == size:
                try:
                    yield next(buffer[idx])
                    idx = rng.randint(0, size - 1)
                except StopIteration:  # noqa: PERF203 - StopIteration ends one buffered iterator
                    buffer.pop(idx)
            buffer.append(iter(_call(self.fn, item, self.input_col)))
        while buffer:
            idx = rng.randint(0, len(buffer) - 1)
            try:
                yield next(buffer[idx])
            except StopIteration:
                buffer.pop(idx)

    def __len__(self) -> int:
        if self._no_op_fn:
            return sum(len(x) for x in self.datapipe)
        raise TypeError(f"{type(self).__name__}'s length relies on the output of its function.")


class _AsyncBatchMapper(StageIterDataPipe[list[Any]]):
    """Apply a coroutine function to every item of each batch, ``max_concurrency`` at a time."""

    def __init__(
        self,
        source_datapipe: IterDataPipe[list[Any]],
        async_fn: Callable[..., Any],
        input_col: Any = None,
        output_col: Any = None,
        max_concurrency: int = 32,
    ) -> None:
        if not inspect.iscoroutinefunction(async_fn):
            raise ValueError(
                f"Expected a corotine function with an async def syntax, but got a {type(async_fn)}"
            )
        if input_col is None and output_col is not None:
            raise ValueError("`output_col` must be None when `input_col` is None.")
        if isinstance(output_col, (list, tuple)):
            if len(output_col) > 1:
                raise ValueError("`output_col` must be a single-element list or tuple")
            output_col = output_col[0]
        self.source_datapipe = source_datapipe
        self.async_fn = async_fn
        self.input_col = input_col
        self.output_col = output_col
        self.max_concurrency = max_concurrency

    def __iter__(self) -> Iterator[list[Any]]:
        loop = asyncio.new_event_loop()
        try:
            for batch in self.source_datapipe:
                yield loop.run_until_complete(self._process(batch))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _process(self, batch: list[Any]) -> list[Any]:
        sem = asyncio.Semaphore(self.max_concurrency)
        col = self.input_col

        async def one(item: Any) -> Any:
            async with sem:
                if col is None:
                    return await self.async_fn(item)
                if isinstance(col, (list, tuple)):
                    return await self.async_fn(*(item[c] for c in col))
                return await self.async_fn(item[col])

        results = await asyncio.gather(*(one(item) for item in batch))
        if col is None:
            return list(results)
        return [
            _put(item, res, col, self.output_col) for item, res in zip(batch, results, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.source_datapipe)


def _put(item: Any, res: Any, input_col: Any, output_col: Any) -> Any:
    """Write ``res`` into ``item`` as torch's ``map(input_col=, output_col=)`` does."""
    was_tuple = isinstance(item, tuple)
    data = list(item) if was_tuple else item
    if output_col is None:
        if isinstance(input_col, (list, tuple)):
            data[input_col[0]] = res
            for idx in sorted(input_col[1:], reverse=True):
                del data[idx]
        else:
            data[input_col] = res
    elif output_col == -1:
        data.append(res)
    else:
        data[output_col] = res
    return tuple(data) if was_tuple else data


@register("async_map_batches")
# Not on the stage base: __new__ builds the graph (batch -> async map -> flatmap) it stands for.
class BatchAsyncMapperIterDataPipe(IterDataPipe[Any]):
    """Apply a coroutine function to items concurrently, ``batch_size`` at a time (functional name: ``async_map_batches``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``source_datapipe``: Source.
    - ``async_fn``: An ``async def`` function.
    - ``batch_size``: Items whose calls run concurrently.
    - ``input_col``: Column(s) passed to ``async_fn``. Default: ``None`` (whole items).
    - ``output_col``: Where the result goes (``-1`` appends). Default: ``None`` (replaces ``input_col``).
    - ``max_concurrency``: Calls running at once. Default: ``32``.
    - ``flatten``: Yield items rather than batches. Default: ``True``.
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[Any],
        async_fn: Callable[..., Any],
        batch_size: int,
        input_col: Any = None,
        output_col: Any = None,
        max_concurrency: int = 32,
        flatten: bool = True,
    ) -> IterDataPipe[Any]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        dp: IterDataPipe[Any] = _AsyncBatchMapper(
            source_datapipe.batch(batch_size), async_fn, input_col, output_col, max_concurrency
        )
        if flatten:
            dp = FlatMapperIterDataPipe(dp)
            try:
                length = len(source_datapipe)
            except (TypeError, NotImplementedError):
                length = -1
            if isinstance(length, int) and length >= 0:
                dp = dp.set_length(length)
        return dp
