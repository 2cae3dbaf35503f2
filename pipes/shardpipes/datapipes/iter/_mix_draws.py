"""``mix()`` over sources without a shard index: each sample drawn by weight, per reader.

Without an index the plan cannot know how many samples a source has, nor which of them a
reader reads, so the mixture cannot be decided before anything is read. ``mix(weights=...)``
then draws the source of each sample from the loader's seed, per reader (a random stage, seeded
per epoch, rank and worker like ``shuffle()``): the same seed gives the same batches, and a
state resumes exactly on the same topology by replaying the epoch to its position. Another
number of ranks or workers is refused when the state is loaded, naming the sources without an
index. What needs the sources' sizes is refused at construction, naming them: per-epoch
proportions (``repeat``/``choose``, or no weights at all), ``samples_per_epoch`` and a
``schedule`` (its steps are global sample positions).
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import describe
from shardpipes.datapipes.iter.base import SeededRng, StageIterDataPipe
from shardpipes.plan.mixture import Mixture

__all__ = ["DrawnMixerIterDataPipe", "indexed"]


def indexed(dp: IterDataPipe[Any]) -> bool:
    """Whether ``dp`` reads its shards through a ``sharding_by_index`` (the plan can know its samples)."""
    return bool(describe(dp).index_sharders())


class DrawnMixerIterDataPipe(SeededRng, StageIterDataPipe[Any]):
    """What ``mix(weights=..., until=...)`` is when a source has no shard index.

    Each next sample comes from source ``i`` with probability ``weights[i]`` (normalised), drawn
    from the loader's seed for this epoch and reader. ``until="first"``: the epoch ends when a
    draw finds its source finished; ``until="last"``: a finished source leaves the draw and its
    weight is shared by the others, until every source is read (webdataset's ``RandomMix``
    with ``longest=False`` / ``True``). ``even=True`` takes the sources in turn instead.

    Args:
        *sources: DataPipes of samples; without an index, each splits its shards between the
            readers itself (``sharding_filter()`` after the shard-level stages).
        weights: Per-sample probabilities of the sources.
        until: ``"first"`` or ``"last"``: where an epoch ends (required: without an index the
            epoch cannot be ``samples_per_epoch`` or the sizes summed, as with one).
        even: Alternate the sources in order (round robin) instead of drawing. Default:
            ``False``.
        names: Names of the sources in messages. Default: ``source0``, ...

    Raises:
        ValueError: Per-epoch proportions, ``samples_per_epoch``, a ``schedule`` or no
            ``until``: each needs the sources' sizes, and the message names the sources
            without an index.
    """

    def __init__(
        self,
        *sources: IterDataPipe[Any],
        weights: Sequence[float] | None = None,
        repeat: Sequence[float | None] | None = None,
        choose: Sequence[int | None] | None = None,
        schedule: Any = None,
        samples_per_epoch: int | None = None,
        step_samples: int = 1,
        even: bool = False,
        until: str | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self.names = (
            list(names) if names is not None else [f"source{i}" for i in range(len(sources))]
        )
        if len(self.names) != len(sources) or len(set(self.names)) != len(self.names):
            raise ValueError(f"names {self.names} should be {len(sources)} distinct names")
        self.sources = list(sources)
        self.unindexed = [n for dp, n in zip(sources, self.names, strict=True) if not indexed(dp)]
        which = f"mix() source(s) {self.unindexed} have no shard index (no sharding_by_index)"
        index = "index their shards (`shardpipes index`) and read them with sharding_by_index"
        if repeat is not None or choose is not None or (weights is None and schedule is None):
            raise ValueError(
                f"{which}: per-epoch proportions (repeat/choose, the default without weights) "
                f"give each source a number of samples per epoch, which needs its index; {index}, "
                "or mix by weights=[...] with until='first' or 'last'"
            )
        if schedule is not None:
            raise ValueError(
                f"{which}: a schedule's steps are positions in the global sample order, which "
                f"needs every source's index; {index}"
            )
        if samples_per_epoch is not None:
            raise ValueError(
                f"{which}: samples_per_epoch splits an epoch between the readers by the sources' "
                f"sizes, which needs their index; {index}, or end the epoch with until='first' or "
                "'last'"
            )
        if until is None:
            raise ValueError(
                f"{which}: say where an epoch ends, until='first' (when the first source runs "
                "out) or until='last' (every source read once, a finished source's weight "
                f"shared by the others); with an index it is the sizes summed ({index})"
            )
        mix = Mixture(
            len(sources), weights=tuple(weights or ()), step_samples=step_samples, until=until
        )
        self.weights = list(mix.weights or ())
        self.until = until
        self.even = even
        #: Why a state cannot continue on another topology (the loader's refusal quotes it).
        self.seek_refusal = (
            f"{which}, so the mixture draws per reader and another number of readers cannot "
            f"continue its draws; {index} to resume on another topology"
        )
        self._seed = 0

    def set_seed(self, seed: int) -> DrawnMixerIterDataPipe:
        """Draw from ``seed`` in the next iteration (loader hook, as ``shuffle().set_seed``)."""
        self._seed = int(seed)
        return self

    def __iter__(self) -> Iterator[Any]:
        live = [(iter(dp), w) for dp, w in zip(self.sources, self.weights, strict=True)]
        if self.even:
            yield from self._in_turn([it for it, _ in live])
            return
        rng: random.Random = self._rng
        live = [(it, w) for it, w in live if w > 0]
        while live:
            cum = list(itertools.accumulate(w for _, w in live))
            k = min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(live) - 1)
            try:
                yield next(live[k][0])
            except StopIteration:
                if self.until == "first":
                    return
                del live[k]

    def _in_turn(self, iterators: list[Iterator[Any]]) -> Iterator[Any]:
        k = 0
        while iterators:
            k %= len(iterators)
            try:
                item = next(iterators[k])
            except StopIteration:
                if self.until == "first":
                    return
                del iterators[k]
                continue
            k += 1
            yield item
