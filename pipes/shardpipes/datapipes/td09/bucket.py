"""torchdata 0.9's ``bucketbatch``, ``max_token_bucketize`` and ``random_split``."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from torch.utils.data import DataChunk, IterDataPipe

from shardpipes.datapipes.iter.base import PicklesRng, StageIterDataPipe, register

__all__ = [
    "BucketBatcherIterDataPipe",
    "MaxTokenBucketizerIterDataPipe",
    "RandomSplitterIterDataPipe",
]

T = TypeVar("T")


@register("bucketbatch")
# Not on the stage base: __new__ builds the graph of other stages it stands for (0.9 did the
# same); no instance of this class is ever made.
class BucketBatcherIterDataPipe(IterDataPipe[DataChunk[Any]]):
    """Batch items from shuffled, optionally sorted buckets of ``batch_size * batch_num`` (functional name: ``bucketbatch``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``datapipe``: Source.
    - ``batch_size``: Items per batch.
    - ``drop_last``: Drop the last, short batch. Default: ``False``.
    - ``batch_num``: Batches per bucket. Default: ``100``.
    - ``bucket_num``: Buckets in the shuffling pool. Default: ``1``.
    - ``sort_key``: Sorts the items of a bucket (a function of the list). Default: ``None``.
    - ``use_in_batch_shuffle``: Shuffle with ``in_batch_shuffle`` rather than ``shuffle``.
      Default: ``True``.
    """

    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[Any],
        batch_size: int,
        drop_last: bool = False,
        batch_num: int = 100,
        bucket_num: int = 1,
        sort_key: Callable[..., Any] | None = None,
        use_in_batch_shuffle: bool = True,
    ) -> IterDataPipe[DataChunk[Any]]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        for name, value in (
            ("batch_size", batch_size),
            ("batch_num", batch_num),
            ("bucket_num", bucket_num),
        ):
            if value <= 0:
                raise ValueError(f"{name} should be larger than 0, got {value}")
        bucket_size = batch_size * batch_num
        pool_size = bucket_size * bucket_num
        if bucket_num > 1 or sort_key is None:
            datapipe = _shuffled(datapipe, pool_size, use_in_batch_shuffle)
        if sort_key is not None:
            datapipe = datapipe.batch(bucket_size).map(fn=sort_key).unbatch()
        datapipe = datapipe.batch(batch_size, drop_last=drop_last)
        if sort_key is not None:
            # the batches: in groups of bucket_num, or through a bucket_size buffer, as in 0.9
            size = bucket_num if use_in_batch_shuffle else bucket_size
            datapipe = _shuffled(datapipe, size, use_in_batch_shuffle)
        return datapipe


def _shuffled(datapipe: Any, size: int, in_batch: bool) -> Any:
    """Shuffle within batches of ``size`` (``in_batch_shuffle``), or through a ``size`` buffer."""
    if in_batch:
        return datapipe.batch(batch_size=size, drop_last=False).in_batch_shuffle().unbatch()
    return datapipe.shuffle(buffer_size=size)


def _default_len_fn(token: Any) -> int:
    return len(token)


@dataclass(order=True, frozen=True)
class _Sized(Generic[T]):
    length: int
    data: T = field(compare=False)


def _measure(token: Any, len_fn: Callable[[Any], int]) -> _Sized[Any]:
    return _Sized(length=len_fn(token), data=token)


def _within(item: _Sized[Any], *, min_len: int, max_len: int) -> bool:
    return min_len <= item.length <= max_len


@register("max_token_bucketize")
class MaxTokenBucketizerIterDataPipe(StageIterDataPipe[DataChunk[Any]]):
    """Batch items so that each batch holds at most ``max_token_count`` tokens, shortest first within a buffer (functional name: ``max_token_bucketize``).

    Args:
        datapipe: Source.
        max_token_count: Token budget of a batch.
        len_fn: Tokens of an item. Default: ``len``.
        min_len: Items shorter than this are dropped. Default: ``0``.
        max_len: Items longer than this are dropped. Default: ``None`` (``max_token_count``).
        buffer_size: Items sorted together. Default: ``1000``.
        include_padding: Count a batch as ``len(batch) * longest``. Default: ``False``.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["1", "22", "1", "333"]).max_token_bucketize(3))
        [['1', '1'], ['22'], ['333']]
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        max_token_count: int,
        len_fn: Callable[[Any], int] = _default_len_fn,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int = 1000,
        include_padding: bool = False,
    ) -> None:
        if max_len is None:
            max_len = max_token_count
        if min_len < 0 or min_len > max_len:
            raise ValueError(
                "``min_len`` should be larger than 0 and equal to or smaller than ``max_len``."
            )
        if max_len > max_token_count:
            raise ValueError("``max_token_count`` must be equal to or greater than ``max_len``.")
        if buffer_size <= 0:
            raise ValueError("'buffer_size' is required to be a positive integer.")
        self.datapipe = datapipe.map(partial(_measure, len_fn=len_fn)).filter(
            partial(_within, min_len=min_len, max_len=max_len)
        )
        self.max_token_count = max_token_count
        self.buffer_size = buffer_size
        self.include_padding = include_padding

    def __iter__(self) -> Iterator[DataChunk[Any]]:
        heap: list[_Sized[Any]] = []
        batch: list[Any] = []
        tokens = longest = 0

        def take() -> DataChunk[Any] | None:
            nonlocal batch, tokens, longest
            item = heapq.heappop(heap)
            if self.include_padding:
                longest = max(longest, item.length)
                new_tokens = (len(batch) + 1) * longest
            else:
                new_tokens = tokens + item.length
            if new_tokens > self.max_token_count:
                full = DataChunk(batch)
                batch, tokens, longest = [item.data], item.length, item.length
                return full
            batch.append(item.data)
            tokens = new_tokens
            return None

        for item in self.datapipe:
            heapq.heappush(heap, item)
            if len(heap) == self.buffer_size:
                full = take()
                if full is not None:
                    yield full
        while heap:
            full = take()
            if full is not None:
                yield full
        if batch:
            yield DataChunk(batch)


# On torch's base: 0.9 promises that a new iterator over one split invalidates the other
# split's (torch's per-iterator hook, "iterator has been invalidated"), as the suite checks.
class _RandomSplitter(PicklesRng, IterDataPipe[Any]):
    """Shared state of the splits: each sample is assigned by a draw weighted by what is left."""

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        total_length: int,
        weights: dict[Any, float],
        seed: Any,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.total_length = total_length
        self._seed = seed
        self.keys = list(weights)
        self.key_to_index = {k: i for i, k in enumerate(self.keys)}
        self.norm_weights = self._normalize([weights[k] for k in self.keys], total_length)
        self.reset()

    @staticmethod
    def _normalize(weights: list[float], total_length: int) -> list[float]:
        total = sum(weights)
        return [float(w) * total_length / total for w in weights]

    def reset(self) -> None:
        self._rng = random.Random(self._seed)
        self.weights = self.norm_weights.copy()
        self.remaining_length = self.total_length

    def draw(self) -> Any:
        key = self._rng.choices(self.keys, self.weights)[0]
        index = self.key_to_index[key]
        self.weights[index] -= 1
        self.remaining_length -= 1
        if self.weights[index] < 0:
            self.weights[index] = 0
            self.weights = self._normalize(self.weights, self.remaining_length)
        return key

    def override_seed(self, seed: Any) -> _RandomSplitter:
        self._seed = seed
        return self

    def get_length(self, target: Any) -> int:
        weights = self.norm_weights
        if all(w.is_integer() for w in weights) and sum(weights) == self.total_length:
            return int(weights[self.key_to_index[target]])
        raise TypeError(
            "Lengths of the split cannot be known in advance. Please supply integer `weights` that "
            "sum up to `total_length`.\nAlternatively, use `datapipe.set_length(LENGTH)` to "
            "manually set the desired length."
        )

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("iterate the splits returned by random_split, not their shared state")


# On torch's base for the same reason as _RandomSplitter: iterator invalidation between splits.
class SplitterIterator(IterDataPipe[Any]):
    """One split of ``random_split``: the samples drawn for ``target``."""

    def __init__(self, main_datapipe: _RandomSplitter, target: Any) -> None:
        self.main_datapipe = main_datapipe
        self.target = target

    def __iter__(self) -> Iterator[Any]:
        main = self.main_datapipe
        main.reset()
        for sample in main.source_datapipe:
            if main.draw() == self.target:
                yield sample

    def override_seed(self, seed: Any) -> SplitterIterator:
        self.main_datapipe.override_seed(seed)
        return self

    def __len__(self) -> int:
        return self.main_datapipe.get_length(self.target)


@register("random_split")
# Not on the stage base: __new__ builds the splits (0.9 did the same).
class RandomSplitterIterDataPipe(IterDataPipe[Any]):
    """Split a DataPipe at random into parts of the given weights, the same way for a given seed (functional name: ``random_split``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``source_datapipe``: Source.
    - ``weights``: Split name -> weight (integers summing to ``total_length`` give exact lengths).
    - ``seed``: Seed of the split; every split drawn with it sees the same assignment.
    - ``total_length``: Length of the source. Default: ``None`` (``len(source_datapipe)``).
    - ``target``: Return only this split. Default: ``None`` (a list of all splits).

    Raises:
        TypeError: The source has no length and ``total_length`` is not given.
        KeyError: ``target`` is not a key of ``weights``.
    """

    def __new__(
        cls,
        source_datapipe: IterDataPipe[Any],
        weights: dict[Any, int | float],
        seed: Any,
        total_length: int | None = None,
        target: Any = None,
    ) -> Any:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        if total_length is None:
            try:
                total_length = len(source_datapipe)
            except TypeError:
                raise TypeError(
                    "RandomSplitter needs `total_length`, but it is unable to infer it from the "
                    f"`source_datapipe`: {source_datapipe}."
                ) from None
        container = _RandomSplitter(source_datapipe, total_length, weights, seed)
        if target is None:
            return [SplitterIterator(container, k) for k in weights]
        if target in weights:
            return SplitterIterator(container, target)
        raise KeyError(f"`target={target}` does not match any key in `weights`.")
