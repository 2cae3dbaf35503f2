"""Shuffle the items inside each batch (functional name: ``in_batch_shuffle``)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, cast

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes._hook_iterator import _SnapshotState

from shardpipes.datapipes.iter.base import StageIterDataPipe, register

__all__ = ["InBatchShufflerIterDataPipe"]

T = TypeVar("T")


@register("in_batch_shuffle")
class InBatchShufflerIterDataPipe(StageIterDataPipe[list[T]]):
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

    def reset(self) -> None:
        """Reseed at the start of an iteration (called by torch's iterator hook)."""
        # A graph restored from a snapshot (torch's ``_simple_graph_snapshot_restoration``)
        # continues with the pickled generator state instead of starting the epoch again.
        if getattr(self, "_snapshot_state", None) == _SnapshotState.Restored:
            self._snapshot_state = _SnapshotState.Iterating
            return
        self._rng = random.Random(self._seed)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if "_rng" in state:
            state["_rng"] = self._rng.getstate()
        if IterDataPipe.getstate_hook is not None:
            return cast(dict[str, Any], IterDataPipe.getstate_hook(state))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        rng_state = state.pop("_rng", None)
        self.__dict__.update(state)
        if rng_state is not None:
            self._rng = random.Random()
            self._rng.setstate(rng_state)

    def __iter__(self) -> Iterator[list[T]]:
        rng = self._rng
        for batch in self.source_datapipe:
            items = list(batch)
            if self._enabled:
                rng.shuffle(items)
            yield items

    def __len__(self) -> int:
        return len(self.source_datapipe)
