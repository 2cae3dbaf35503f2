"""Lean stand-ins for torch's ``shuffle``, ``batch``, ``map`` and ``filter`` in loader-owned graphs.

torch wraps every element of its own stages in a profiler ``record_function`` (the
``_IterDataPipeMeta`` iterator hook), whether or not a profiler is running. For small samples
that costs more than parsing the tar they came from: measured on the development machine,
``shuffle(buffer_size=1000)`` added ~12 us per sample under load, against ~15 us for tar +
webdataset + decode together.

``DataLoader2`` and ``as_node`` deep-copy the user's graph before running it; in that copy
:func:`lean_graph` replaces those four stages with the classes here, which do the same without
the hook. The shuffle is torch's buffer algorithm with counter-based draws
(:func:`shardpipes._seeds.buffered_shuffle`): the same seed gives the same order every time,
though not torch's order, and its state at any point can be recomputed, which is how the loader
resumes by seeking. The user's graph, and torch itself, are left alone. Stages used with
column arguments (``map(fn, input_col=...)``) are kept as they are.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Filter, Mapper, Shuffler
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes._seeds import buffered_shuffle
from shardpipes.datapipes.iter._base import StageIterDataPipe

__all__ = [
    "LeanBatcherIterDataPipe",
    "LeanFilterIterDataPipe",
    "LeanMapperIterDataPipe",
    "LeanShufflerIterDataPipe",
    "lean_graph",
]

T = TypeVar("T")


class LeanShufflerIterDataPipe(StageIterDataPipe[T]):
    """torch's ``Shuffler`` without the per-element hook, with resumable counter-based draws."""

    def __init__(
        self, datapipe: IterDataPipe[T], buffer_size: int, enabled: bool, seed: int | None
    ) -> None:
        self.datapipe = datapipe
        self.buffer_size = buffer_size
        self._enabled = enabled
        self._seed = seed
        self._rng = random.Random(0)
        # Set by a resuming sharding_by_index before the first draw of an epoch: the seed and
        # first draw that continue the interrupted shuffle (see shardpipes._resume).
        self.resume_at: tuple[int, int, list[int]] | None = None

    def set_shuffle(self, shuffle: bool = True) -> LeanShufflerIterDataPipe[T]:
        """Turn shuffling on or off."""
        self._enabled = shuffle
        return self

    def set_seed(self, seed: int) -> LeanShufflerIterDataPipe[T]:
        """Seed the next iteration."""
        self._seed = seed
        return self

    def __iter__(self) -> Iterator[T]:
        if not self._enabled:
            yield from self.datapipe
            return
        rng = self._rng
        # Iterated again without a new seed (e.g. restarted by fixed_length): torch would draw a
        # seed from its global RNG; we draw it from this stage's own generator, so it stays
        # deterministic.
        seed = self._seed if self._seed is not None else rng.getrandbits(63)
        rng.seed(seed)
        self._seed = None

        def draws() -> tuple[int, int, list[int]]:
            at, self.resume_at = self.resume_at, None
            return at if at is not None else (seed, 0, [])

        yield from buffered_shuffle(self.datapipe, draws, self.buffer_size)

    def __len__(self) -> int:
        return len(self.datapipe)


class LeanBatcherIterDataPipe(StageIterDataPipe[Any]):
    """torch's ``Batcher`` without the per-element hook."""

    def __init__(
        self, datapipe: IterDataPipe[Any], batch_size: int, drop_last: bool, wrapper_class: Any
    ) -> None:
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.wrapper_class = wrapper_class

    def __iter__(self) -> Iterator[Any]:
        size, wrap = self.batch_size, self.wrapper_class
        batch: list[Any] = []
        for x in self.datapipe:
            batch.append(x)
            if len(batch) == size:
                yield wrap(batch)
                batch = []
        if batch and not self.drop_last:
            yield wrap(batch)

    def __len__(self) -> int:
        n = len(self.datapipe)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class LeanMapperIterDataPipe(StageIterDataPipe[Any]):
    """torch's ``Mapper`` (whole items, no columns) without the per-element hook."""

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

    def __init__(self, datapipe: IterDataPipe[T], filter_fn: Callable[[T], bool]) -> None:
        self.datapipe = datapipe
        self.filter_fn = filter_fn

    def __iter__(self) -> Iterator[T]:
        fn = self.filter_fn
        for x in self.datapipe:
            keep = fn(x)
            if not isinstance(keep, bool):
                raise ValueError(
                    f"Boolean output is required for `filter_fn` of FilterIterDataPipe, got {type(keep)}"
                )
            if keep:
                yield x


def _lean(dp: Any) -> Any:
    """The lean replacement of ``dp``, or ``None`` when it has none (or uses columns)."""
    kind = type(dp)
    if kind is Shuffler:
        return LeanShufflerIterDataPipe(dp.datapipe, dp.buffer_size, dp._enabled, dp._seed)
    if kind is Batcher:
        return LeanBatcherIterDataPipe(dp.datapipe, dp.batch_size, dp.drop_last, dp.wrapper_class)
    if kind is Mapper and dp.input_col is None and dp.output_col is None:
        return LeanMapperIterDataPipe(dp.datapipe, dp.fn)
    if kind is Filter and dp.input_col is None:
        return LeanFilterIterDataPipe(dp.datapipe, dp.filter_fn)
    return None


def _swap(value: Any, new: dict[int, Any]) -> Any:
    if isinstance(value, IterDataPipe):
        return new.get(id(value), value)
    if isinstance(value, list | tuple) and any(id(v) in new for v in value):
        return type(value)(new.get(id(v), v) for v in value)
    return value


def lean_graph(datapipe: IterDataPipe[Any]) -> IterDataPipe[Any]:
    """Replace torch's ``shuffle``/``batch``/``map``/``filter`` stages of ``datapipe`` in place; return the root.

    Only for a graph the caller owns (a deep copy): the stages are rewired, not copied.
    """
    nodes = get_all_graph_pipes(traverse_dps(datapipe))
    new = {id(dp): lean for dp in nodes if (lean := _lean(dp)) is not None}
    if not new:
        return datapipe
    for dp in [*nodes, *new.values()]:
        for attr, value in list(vars(dp).items()):
            swapped = _swap(value, new)
            if swapped is not value:
                setattr(dp, attr, swapped)
    root: IterDataPipe[Any] = new.get(id(datapipe), datapipe)
    return root
