"""Shuffle the items inside each batch (functional name: ``in_batch_shuffle``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter.base import SeededRng, StageIterDataPipe, register

__all__ = ["InBatchShufflerIterDataPipe"]

T = TypeVar("T")


@register("in_batch_shuffle")
class InBatchShufflerIterDataPipe(SeededRng, StageIterDataPipe[list[T]]):
    """Shuffle the items of each batch, with the loader's seed (functional name: ``in_batch_shuffle``).

    Random because it has ``set_seed``: the reading service seeds it per epoch (and per rank
    and worker when it comes after ``sharding_filter``). Unseeded, it uses seed 0.

    Args:
        datapipe: Batches (sequences).

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([[0, 1, 2, 3]]).in_batch_shuffle()
        >>> sorted(next(iter(dp)))
        [0, 1, 2, 3]
    """

    one_to_one = True

    def __init__(self, datapipe: IterDataPipe[Sequence[T]]) -> None:
        self.source_datapipe = datapipe
        self._seed = 0
        self._enabled = True

    def set_seed(self, seed: int) -> InBatchShufflerIterDataPipe[T]:
        """Seed the next iteration (called by reading services)."""
        self._seed = int(seed)
        return self

    def set_shuffle(self, shuffle: bool = True) -> InBatchShufflerIterDataPipe[T]:
        """Turn shuffling on or off (called by ``apply_shuffle_settings``)."""
        self._enabled = shuffle
        return self

    @property
    def datapipe(self) -> IterDataPipe[Sequence[T]]:
        """The source, under torchdata 0.9's attribute name."""
        return self.source_datapipe

    def __iter__(self) -> Iterator[list[T]]:
        rng = self._rng
        for batch in self.source_datapipe:
            items = list(batch)
            if self._enabled:
                rng.shuffle(items)
            yield items

    def __len__(self) -> int:
        return len(self.source_datapipe)
