"""torchdata 0.9's stages that join or split DataPipes.

``zip_with_iter``, ``zip_with_map``, ``round_robin_demux``, ``unzip``, ``mux_longest``,
``zip_longest``, ``SampleMultiplexer`` and ``sharding_round_robin_dispatch`` keep 0.9's
arguments and outputs. The children of ``unzip`` and ``round_robin_demux`` are torch's own
``fork``/``demux`` children, so buffering and reset rules are torch's.
"""

from __future__ import annotations

import random
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter.combining import (
    _ChildDataPipe,
    _DemultiplexerIterDataPipe,
    _ForkerIterDataPipe,
)
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.datapipes.utils.common import _check_unpickable_fn

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.datapipes.utils import janitor

__all__ = [
    "IterKeyZipperIterDataPipe",
    "MapKeyZipperIterDataPipe",
    "MultiplexerLongestIterDataPipe",
    "RoundRobinDemultiplexerIterDataPipe",
    "SampleMultiplexerDataPipe",
    "ShardingRoundRobinDispatcherIterDataPipe",
    "UnZipperIterDataPipe",
    "ZipperLongestIterDataPipe",
]

T = TypeVar("T")


@register("zip_with_iter")
class IterKeyZipperIterDataPipe(StageIterDataPipe[Any]):
    """Pair each item with the item of ``ref_datapipe`` that has the same key (functional name: ``zip_with_iter``).

    Reference items are read ahead into a buffer until the key of the current item is found.

    Args:
        source_datapipe: Items to pair.
        ref_datapipe: Reference items, each key at most once.
        key_fn: Key of a source item.
        ref_key_fn: Key of a reference item. Default: ``None`` (``key_fn``).
        keep_key: Yield ``(key, pair)``. Default: ``False``.
        buffer_size: Reference items kept waiting; beyond it the oldest is dropped with a
            warning. ``None`` means no limit. Default: ``10000``.
        merge_fn: Combines the two items. Default: ``None`` (a tuple).

    Raises:
        BufferError: The reference ran out before a key was found.
        ValueError: A key appears twice in the reference.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        ref_datapipe: IterDataPipe[Any],
        key_fn: Callable[[Any], Any],
        ref_key_fn: Callable[[Any], Any] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        if not isinstance(ref_datapipe, IterDataPipe):
            raise TypeError(
                f"ref_datapipe must be a IterDataPipe, but its type is {type(ref_datapipe)} instead."
            )
        for fn in (key_fn, ref_key_fn, merge_fn):
            if fn is not None:
                _check_unpickable_fn(fn)
        if buffer_size is not None and buffer_size <= 0:
            raise ValueError("'buffer_size' is required to be either None or a positive integer.")
        self.source_datapipe = source_datapipe
        self.ref_datapipe = ref_datapipe
        self.key_fn = key_fn
        self.ref_key_fn = key_fn if ref_key_fn is None else ref_key_fn
        self.keep_key = keep_key
        self.buffer_size = buffer_size
        self.merge_fn = merge_fn

    def __iter__(self) -> Iterator[Any]:
        buffer: OrderedDict[Any, Any] = OrderedDict()
        ref_it = iter(self.ref_datapipe)
        warned = False
        try:
            for data in self.source_datapipe:
                key = self.key_fn(data)
                while key not in buffer:
                    try:
                        ref = next(ref_it)
                    except StopIteration:
                        raise BufferError(
                            f"No matching key can be found from reference DataPipe for the data "
                            f"{data}. Please consider increasing the buffer size."
                        ) from None
                    ref_key = self.ref_key_fn(ref)
                    if ref_key in buffer:
                        raise ValueError("Duplicate key is found in reference DataPipe")
                    if self.buffer_size is not None and len(buffer) > self.buffer_size:
                        if not warned:
                            warned = True
                            warnings.warn(
                                "Buffer reaches the upper limit, so reference key-data pair begins "
                                "to be removed from buffer in FIFO order. Please consider increase "
                                "buffer size.",
                                stacklevel=2,
                            )
                        janitor(buffer.popitem(last=False)[1])
                    buffer[ref_key] = ref
                ref = buffer.pop(key)
                res = self.merge_fn(data, ref) if self.merge_fn else (data, ref)
                yield (key, res) if self.keep_key else res
        finally:
            for value in buffer.values():
                janitor(value)
            buffer.clear()

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("zip_with_map")
class MapKeyZipperIterDataPipe(StageIterDataPipe[Any]):
    """Pair each item with ``map_datapipe[key_fn(item)]`` (functional name: ``zip_with_map``).

    Args:
        source_iterdatapipe: Items to pair.
        map_datapipe: The lookup table.
        key_fn: Key of an item.
        merge_fn: Combines the two items. Default: ``None`` (a tuple).
        keep_key: Yield ``(key, pair)``. Default: ``False``.

    Raises:
        KeyError: A key is not in ``map_datapipe``.
    """

    def __init__(
        self,
        source_iterdatapipe: IterDataPipe[Any],
        map_datapipe: MapDataPipe[Any],
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ) -> None:
        if not isinstance(map_datapipe, MapDataPipe):
            raise TypeError(
                f"map_datapipe must be a MapDataPipe, but its type is {type(map_datapipe)} instead."
            )
        _check_unpickable_fn(key_fn)
        if merge_fn is not None:
            _check_unpickable_fn(merge_fn)
        self.source_iterdatapipe = source_iterdatapipe
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_iterdatapipe:
            key = self.key_fn(item)
            try:
                value = self.map_datapipe[key]
            except (KeyError, IndexError):
                raise KeyError(
                    f"key_fn maps {item} to {key}, which is not a valid key in the given MapDataPipe."
                ) from None
            res = self.merge_fn(item, value) if self.merge_fn else (item, value)
            yield (key, res) if self.keep_key else res

    def __len__(self) -> int:
        return len(self.source_iterdatapipe)


def _drop_index(pair: tuple[int, Any]) -> Any:
    return pair[1]


# On torch's demux: the children share its buffer and its iterator-invalidation rules.
class _RoundRobinDemux(_DemultiplexerIterDataPipe):
    def __init__(self, datapipe: IterDataPipe[Any], num_instances: int, buffer_size: int) -> None:
        super().__init__(
            datapipe, num_instances, self._classify, drop_none=False, buffer_size=buffer_size
        )

    def _classify(self, pair: tuple[int, Any]) -> int:
        return pair[0] % self.num_instances

    def get_length_by_instance(self, instance_id: int) -> int:
        n = len(self.main_datapipe)
        base, extra = divmod(n, self.num_instances)
        return base + 1 if instance_id < extra else base


@register("round_robin_demux")
# Not on the stage base: __new__ returns the children (0.9 did the same).
class RoundRobinDemultiplexerIterDataPipe(IterDataPipe[Any]):
    """Split a DataPipe into ``num_instances`` children, dealing items in turn (functional name: ``round_robin_demux``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``datapipe``: Source.
    - ``num_instances``: Children returned (a list).
    - ``buffer_size``: Items a child may hold waiting for a slower sibling. Default: ``1000``.
    """

    def __new__(  # type: ignore[misc]
        cls, datapipe: IterDataPipe[Any], num_instances: int, buffer_size: int = 1000
    ) -> list[IterDataPipe[Any]]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        if num_instances < 1:
            raise ValueError(f"Expected `num_instaces` larger than 0, but {num_instances} is found")
        if num_instances == 1:
            warnings.warn(
                "The operation of `round_robin_demux` with `num_instances=1` is an no-op and "
                "returns the provided `datapipe` in a list directly",
                stacklevel=2,
            )
            return [datapipe]
        container = _RoundRobinDemux(datapipe.enumerate(), num_instances, buffer_size)  # type: ignore[abstract]
        return [_ChildDataPipe(container, i).map(_drop_index) for i in range(num_instances)]


# On torch's fork: the children share its buffer and its iterator-invalidation rules, which
# the suite checks ("iterator has been invalidated").
class _UnZipper(_ForkerIterDataPipe):
    def __init__(
        self, datapipe: IterDataPipe[Any], instance_ids: list[int], buffer_size: int
    ) -> None:
        super().__init__(datapipe, len(instance_ids), buffer_size)
        self.instance_ids = instance_ids

    def get_next_element_by_instance(self, instance_id: int) -> Iterator[Any]:
        column = self.instance_ids[instance_id]
        for item in super().get_next_element_by_instance(instance_id):
            yield item[column]

    def __getstate__(self) -> Any:
        return (*super().__getstate__(), self.instance_ids)  # type: ignore[no-untyped-call]

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state[:-1])  # type: ignore[no-untyped-call]
        self.instance_ids = state[-1]


@register("unzip")
# Not on the stage base: __new__ returns the children (0.9 did the same).
class UnZipperIterDataPipe(IterDataPipe[Any]):
    """Split a DataPipe of sequences into one child per column (functional name: ``unzip``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``source_datapipe``: Sequences of ``sequence_length`` items.
    - ``sequence_length``: Columns of each sequence.
    - ``buffer_size``: Items a child may hold waiting for a slower sibling. Default: ``1000``.
    - ``columns_to_skip``: Columns without a child. Default: ``None``.
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[Sequence[Any]],
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> list[IterDataPipe[Any]]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        skips = set(columns_to_skip or ())
        instance_ids = [i for i in range(sequence_length) if i not in skips]
        if not instance_ids:
            raise RuntimeError(
                "All instances are being filtered out in UnZipperIterDataPipe. Please check"
                "the input `sequence_length` and `columns_to_skip`."
            )
        container = _UnZipper(source_datapipe, instance_ids, buffer_size)  # type: ignore[abstract]
        return [_ChildDataPipe(container, i) for i in range(len(instance_ids))]


@register("mux_longest")
class MultiplexerLongestIterDataPipe(StageIterDataPipe[Any]):
    """Take one item from each DataPipe in turn until all are exhausted (functional name: ``mux_longest``).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2, 3]).mux_longest(IterableWrapper([10])))
        [1, 10, 2, 3]
    """

    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        self.datapipes = datapipes

    def __iter__(self) -> Iterator[Any]:
        iterators = [iter(dp) for dp in self.datapipes]
        live = list(range(len(iterators)))
        while live:
            for i in list(live):
                try:
                    yield next(iterators[i])
                except StopIteration:  # noqa: PERF203 - StopIteration retires one source
                    live.remove(i)

    def __len__(self) -> int:
        if all(isinstance(dp, Sized) for dp in self.datapipes):
            return sum(len(dp) for dp in self.datapipes)
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")


@register("zip_longest")
class ZipperLongestIterDataPipe(StageIterDataPipe[tuple[Any, ...]]):
    """Yield tuples of one item from each DataPipe until all are exhausted, filling with ``fill_value`` (functional name: ``zip_longest``).

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2]).zip_longest(IterableWrapper([10]), fill_value=0))
        [(1, 10), (2, 0)]
    """

    def __init__(self, *datapipes: IterDataPipe[Any], fill_value: Any = None) -> None:
        if not all(isinstance(dp, IterDataPipe) for dp in datapipes):
            raise TypeError(
                "All inputs are required to be `IterDataPipe` for `ZipperLongestIterDataPipe`."
            )
        self.datapipes = datapipes
        self.fill_value = fill_value

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        iterators = [iter(dp) for dp in self.datapipes]
        done: set[int] = set()
        while True:
            values = []
            for i, it in enumerate(iterators):
                value = self.fill_value
                if i not in done:
                    try:
                        value = next(it)
                    except StopIteration:
                        done.add(i)
                        if len(done) == len(iterators):
                            return
                values.append(value)
            yield tuple(values)

    def __len__(self) -> int:
        if all(isinstance(dp, Sized) for dp in self.datapipes):
            return max(len(dp) for dp in self.datapipes)
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")


class SampleMultiplexerDataPipe(StageIterDataPipe[Any]):
    """Draw each next item from one of several DataPipes, chosen at random by weight.

    When a source runs out its weight is shared by the others; the last one is read to its end.

    It is a random stage (it has ``set_seed``): under ``DataLoader2`` the loader seeds it every
    epoch from ``dl.seed()``, the epoch and the reader, like ``shuffle()``, so the same seed
    gives the same order on every run, with or without worker processes, and a state resumes
    it exactly on the same topology (the loader replays the epoch to the saved position).
    Another number of ranks or workers cannot resume it (each reader's draws depend on its
    own inputs) and is refused when the state is loaded; use ``mix()`` for a mixture that
    resumes by seeking and elastically (docs/mixing.md).

    Args:
        pipes_to_weights_dict: DataPipe -> positive weight.
        seed: Seed of the draws outside a loader. Default: ``None`` (unseeded). A loader's
            seed replaces it.
    """

    #: Why a state of it cannot be resumed on another topology (the loader's refusal says it).
    seek_refusal = (
        "SampleMultiplexer draws its sources per reader, so another number of readers cannot "
        "continue its draws; use mix() for a mixture that resumes on any topology"
    )

    def __init__(
        self, pipes_to_weights_dict: dict[IterDataPipe[Any], float], seed: int | None = None
    ) -> None:
        if not pipes_to_weights_dict:
            raise ValueError("Empty dictionary passed to SampleMultiplexerDataPipe")
        for weight in pipes_to_weights_dict.values():
            if weight <= 0:
                raise ValueError(f"Expecting a positive and non-zero weight, got {weight}")
        total = sum(pipes_to_weights_dict.values())
        self.pipes_and_weights = [(dp, w / total) for dp, w in pipes_to_weights_dict.items()]
        self.random = random.Random(seed)

    def set_seed(self, seed: int) -> SampleMultiplexerDataPipe:
        """Draw from ``seed`` in the next iteration (loader hook, as ``shuffle().set_seed``)."""
        self.random = random.Random(seed)
        return self

    def __iter__(self) -> Iterator[Any]:
        live = [(iter(dp), w) for dp, w in self.pipes_and_weights]
        while len(live) > 1:
            r = self.random.random()
            acc = 0.0
            for it, weight in live:
                acc += weight
                if r < acc:
                    try:
                        yield next(it)
                    except StopIteration:
                        rest = 1 - weight
                        live = [(i, w / rest) for i, w in live if i is not it]
                    break
        if live:
            yield from live[0][0]

    def __len__(self) -> int:
        if all(isinstance(dp, Sized) for dp, _ in self.pipes_and_weights):
            return sum(len(dp) for dp, _ in self.pipes_and_weights)
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")


@register("sharding_round_robin_dispatch")
class ShardingRoundRobinDispatcherIterDataPipe(StageIterDataPipe[Any]):
    """Mark where items are dealt round-robin to worker processes (functional name: ``sharding_round_robin_dispatch``).

    In a single process it passes items through. Only
    ``SHARDING_PRIORITIES.MULTIPROCESSING`` is supported, as in 0.9.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        sharding_group_filter: SHARDING_PRIORITIES | None = None,
    ) -> None:
        if sharding_group_filter != SHARDING_PRIORITIES.MULTIPROCESSING:
            raise NotImplementedError(
                "`sharding_round_robin_dispatch` currently only supports "
                "`SHARDING_PRIORITIES.MULTIPROCESSING`.Please open issue on github for your "
                "feature request."
            )
        self.source_datapipe = source_datapipe
        self.sharding_group_filter = sharding_group_filter

    def __iter__(self) -> Iterator[Any]:
        yield from self.source_datapipe

    def __len__(self) -> int:
        return len(self.source_datapipe)
