"""Lean stand-ins for torch's ``shuffle``, ``batch``, ``map`` and ``filter`` in loader-owned graphs.

torch wraps every element of its own stages in a profiler ``record_function`` (the
``_IterDataPipeMeta`` iterator hook), whether or not a profiler is running. For small samples
that costs more than parsing the tar they came from: measured on the development machine,
``shuffle(buffer_size=1000)`` added ~12 us per sample under load, against ~15 us for tar +
webdataset + decode together.

``DataLoader2`` and ``as_node`` deep-copy the user's graph before running it; in that copy
:func:`shardpipes.dataloader2.graph.lean_graph` replaces those four stages with the classes here, which do the same without
the hook. The shuffle is torch's buffer algorithm with counter-based draws
(:func:`shardpipes.plan.seeds.buffered_shuffle`): the same seed gives the same order every time,
though not torch's order, and its state at any point can be recomputed, which is how the loader
resumes by seeking. The user's graph, and torch itself, are left alone. Stages used with
column arguments (``map(fn, input_col=...)``) are kept as they are.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Filter, Mapper, Shuffler

from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.datapipes.iter.decode import decoded_parts
from shardpipes.datapipes.iter.webdataset import WebDatasetIterDataPipe, materialize
from shardpipes.plan.epoch import Resume
from shardpipes.plan.readers import batches
from shardpipes.plan.seeds import buffered_shuffle

__all__ = [
    "LeanBatcherIterDataPipe",
    "LeanFilterIterDataPipe",
    "LeanMapperIterDataPipe",
    "LeanShufflerIterDataPipe",
]

T = TypeVar("T")


class LeanShufflerIterDataPipe(StageIterDataPipe[T]):
    """torch's ``Shuffler`` without the per-element hook, with resumable counter-based draws."""

    stands_for = Shuffler
    one_to_one = True
    resumable = True
    seeks = "buffer"  # replays its counter-based draws to the resumed position
    carries_ids = "untouched"  # moves items without looking at them

    def __init__(
        self, datapipe: IterDataPipe[T], buffer_size: int, enabled: bool, seed: int | None
    ) -> None:
        self.datapipe = datapipe
        self.buffer_size = buffer_size
        self._enabled = enabled
        self._seed = seed
        self._rng = random.Random(0)
        # Handed by the loader for an epoch that resumes a saved state (set_resume); read at
        # the first draw, after sharding_by_index has planned this reader.
        self._resume: Resume | None = None

    def set_shuffle(self, shuffle: bool = True) -> LeanShufflerIterDataPipe[T]:
        """Turn shuffling on or off."""
        self._enabled = shuffle
        return self

    def set_seed(self, seed: int) -> LeanShufflerIterDataPipe[T]:
        """Seed the next iteration."""
        self._seed = seed
        return self

    def set_resume(self, resume: Resume | None) -> LeanShufflerIterDataPipe[T]:
        """Continue the interrupted shuffle of a resumed epoch in the next iteration (loader hook)."""
        self._resume = resume
        return self

    def __iter__(self) -> Iterator[T]:
        yield from self._shuffled()

    def shuffled(self) -> Iterator[T]:
        """What iterating this stage yields, with no generator step of this stage per item.

        For the batch stage reading straight from this one: it calls this when its own
        iteration starts, as its first ``next()`` would have started this stage's. Starts an
        iteration as ``iter()`` does.
        """
        self.reset()
        return self._shuffled()

    def _shuffled(self) -> Iterator[T]:
        if not self._enabled:
            return iter(self.datapipe)
        rng = self._rng
        # Iterated again without a new seed (e.g. restarted by fixed_length): torch would draw a
        # seed from its global RNG; we draw it from this stage's own generator, so it stays
        # deterministic.
        seed = self._seed if self._seed is not None else rng.getrandbits(63)
        rng.seed(seed)
        self._seed = None

        resume, self._resume = self._resume, None

        def draws() -> tuple[int, int, list[int]]:
            at = resume.shuffle_start() if resume is not None else None
            return at if at is not None else (seed, 0, [])

        source = self.datapipe
        if isinstance(source, WebDatasetIterDataPipe):
            # The buffer holds deferred samples (a window of the shard and offsets, which the
            # garbage collector never visits); each is made into its dict as it leaves.
            return _materialized(buffered_shuffle(source.deferred(), draws, self.buffer_size))
        parts = decoded_parts(source)
        # Straight from decode(): its lists of samples flattened in C (no generator step each).
        items: Iterable[Any] = source if parts is None else chain.from_iterable(parts)
        return buffered_shuffle(items, draws, self.buffer_size)

    def __len__(self) -> int:
        return len(self.datapipe)


def _materialized(items: Iterator[Any]) -> Iterator[Any]:
    out: Any
    for x in items:
        out = x if type(x) is dict else materialize(x)
        yield out


class LeanBatcherIterDataPipe(StageIterDataPipe[Any]):
    """torch's ``Batcher`` without the per-element hook."""

    stands_for = Batcher
    batches = True

    def __init__(
        self, datapipe: IterDataPipe[Any], batch_size: int, drop_last: bool, wrapper_class: Any
    ) -> None:
        if batch_size <= 0:  # torch's Batcher refuses it too
            raise ValueError(f"batch_size ({batch_size}) should be at least 1")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.wrapper_class = wrapper_class

    def __iter__(self) -> Iterator[Any]:
        size, wrap = self.batch_size, self.wrapper_class
        src = self.datapipe
        items = src.shuffled() if type(src) is LeanShufflerIterDataPipe else iter(src)
        while True:
            batch = list(islice(items, size))  # taken in C, not one loop step per item
            if len(batch) < size:
                if batch and not self.drop_last:
                    yield wrap(batch)
                return
            yield wrap(batch)

    def __len__(self) -> int:
        return batches(len(self.datapipe), self.batch_size, self.drop_last)


class LeanMapperIterDataPipe(StageIterDataPipe[Any]):
    """torch's ``Mapper`` (whole items, no columns) without the per-element hook."""

    stands_for = Mapper
    one_to_one = True
    carries_ids = "in_step"  # yields fn(x) before it reads the next item

    def __init__(self, datapipe: IterDataPipe[Any], fn: Callable[[Any], Any]) -> None:
        self.datapipe = datapipe
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        fn = self.fn
        for x in self.datapipe:
            yield fn(x)

    def __len__(self) -> int:
        return len(self.datapipe)


class LeanFilterIterDataPipe(StageIterDataPipe[T]):
    """torch's ``Filter`` (whole items, no columns) without the per-element hook."""

    stands_for = Filter
    counts_drops = True  # `dropped` and `passing`, read by the loader's empty-epoch check

    def __init__(self, datapipe: IterDataPipe[T], filter_fn: Callable[[T], bool]) -> None:
        self.datapipe = datapipe
        self.filter_fn = filter_fn
        # Totals over all iterations, for the loader's check of a filter that drops everything:
        # items dropped, and iterations that passed at least one item on. Counting drops only
        # (and the first kept item, in a loop of its own) keeps the per-item cost at torch's.
        self.dropped = 0
        self.passing = 0

    def __iter__(self) -> Iterator[T]:
        fn = self.filter_fn
        dropped = 0
        it = iter(self.datapipe)
        try:
            for x in it:  # until the first item is kept
                keep = fn(x)
                if keep is True:
                    self.passing += 1
                    yield x
                    break
                if keep is not False:
                    _not_bool(keep)
                dropped += 1
            for x in it:
                keep = fn(x)
                if keep is True:
                    yield x
                elif keep is False:
                    dropped += 1
                else:
                    _not_bool(keep)
        finally:
            self.dropped += dropped


def _not_bool(keep: object) -> None:
    raise ValueError(
        f"Boolean output is required for `filter_fn` of FilterIterDataPipe, got {type(keep)}"
    )
