"""Mix several indexed sources by the plan (functional name: ``mix``).

Each source is a DataPipe of samples with its own ``sharding_by_index`` (its shard list and
index) and its own one-to-one stages (decode, map, ...); the stages after ``mix()`` are shared.
Which source fills each position of a reader's epoch, and which samples of each source a
reader reads, is decided by :mod:`shardpipes.plan.mixture` from the loader's seed and epoch,
before anything is read: the same seed gives the same samples in the same order, a state
resumes by seeking, on the same or another topology (docs/mixing.md).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import describe
from shardpipes.datapipes.iter._mix_draws import DrawnMixerIterDataPipe, indexed
from shardpipes.datapipes.iter.base import (
    StageIterDataPipe,
    check_picklable_fn,
    register,
)
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.plan.epoch import EpochPlan, Resume
from shardpipes.plan.mixture import Mixture, Schedule, mix_reader
from shardpipes.plan.resume import Segment, Shape
from shardpipes.plan.seeds import reader_stage_seed

__all__ = ["MixResume", "MixerIterDataPipe", "SourceChanged", "check_sources", "mixable"]


@dataclass
class MixResume(Resume):
    """The resume handed to the sample shuffle after a ``mix()``: the mixer says where it continues."""

    mixer: Any = None

    def shuffle_start(self) -> tuple[int, int, list[int]] | None:
        """``(seed, first draw, buffer slots)`` of the shuffle, known once the mixer has planned."""
        return self.mixer.shuffle_start() if self.mixer is not None else None


class SourceChanged(ValueError):
    """A mixture's source differs from the one a loader state was taken with."""


def mixable(dp: IterDataPipe[Any]) -> bool:
    """Whether ``dp`` can be a ``mix()`` source: one ``sharding_by_index``, then stages that keep the count."""
    graph = describe(dp)
    return len(graph.index_sharders()) == 1 and graph.counts_from_index()


def _sharder(dp: IterDataPipe[Any], name: str) -> IndexSharderIterDataPipe:
    graph = describe(dp)
    found = graph.index_sharders()
    if len(found) != 1 or not graph.counts_from_index():
        raise ValueError(
            f"mix() source {name!r} should be sharding_by_index -> open_files_by_fsspec -> "
            "load_from_tar -> webdataset followed only by one-to-one stages (map, decode; no "
            "filter, batch or sample shuffle), so that the plan knows how many samples it "
            f"yields; it has {len(found)} sharding_by_index stage(s)"
            + ("" if len(found) != 1 else " and other stages")
        )
    if found[0].policy != "drop":
        raise ValueError(
            f"mix() source {name!r} has sharding_by_index(policy={found[0].policy!r}); a mixture "
            "keeps readers equal by leaving out fewer samples than readers (policy 'drop'), "
            "from the sources not read once per epoch first"
        )
    sharder: IndexSharderIterDataPipe = found[0]
    return sharder


@register("mix")
class MixerIterDataPipe(StageIterDataPipe[Any]):
    """Mix indexed sources by weights, per-epoch proportions or a weight schedule (functional name: ``mix``).

    Give exactly one of ``weights``, ``repeat``/``choose`` or ``schedule``. Every reader
    (rank x worker) reads the same number of samples, an equal share of every source, one
    contiguous stretch of each; positions of the epoch that do not divide between the readers
    (fewer than the readers) are left out.

    Args:
        *sources: DataPipes of samples, each ``sharding_by_index`` ... one-to-one stages. With
            a source without an index, ``mix()`` draws per reader instead, by ``weights``
            only (:class:`~shardpipes.datapipes.iter._mix_draws.DrawnMixerIterDataPipe`).
        weights: Per-sample probabilities of the sources; an epoch has ``samples_per_epoch``
            samples (default: the sources' sizes summed), apportioned by weight.
        repeat: Per source, how many times it is read per epoch (``1``: each sample once,
            ``2``: upsampled, ``0.5``: half of it, other samples each epoch). Default for a
            source with neither: ``1``.
        choose: Per source, how many of its samples an epoch reads (``None``: use ``repeat``).
        schedule: Weights by step: ``[(0, weights), (step, weights), ...]`` or a picklable
            function ``step -> weights``.
        samples_per_epoch: Samples of an epoch with ``weights`` or ``schedule``.
        step_samples: Samples of one step (the global batch, ranks x batch size): the unit of
            ``schedule``'s steps. Default: ``1`` (steps are global samples).
        even: Alternate the sources in order instead of at random (round robin). Default:
            ``False``.
        until: With ``weights``: ``"first"`` ends the epoch when the first source runs out,
            ``"last"`` reads every source once (webdataset's ``RandomMix(longest=...)``).
        names: Names of the sources in messages and states. Default: ``source0``, ...

    Yields:
        The sources' samples, interleaved.

    Raises:
        ValueError: A source without exactly one ``sharding_by_index`` and one-to-one stages
            after it, or inconsistent mixture arguments.

    Example:
        >>> import tempfile
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> from shardpipes.index import build_index
        >>> from shardpipes.synthetic import write_synthetic
        >>> def source(n):
        ...     paths = write_synthetic(tempfile.mkdtemp(), shards=2, samples=[n, n])
        ...     return (IterableWrapper(paths).sharding_by_index(build_index(paths, progress=False))
        ...             .open_files_by_fsspec().load_from_tar().webdataset())
        >>> dp = source(4).mix(source(2), repeat=[1, 2])
        >>> len(list(dp))  # 8 + 2 x 4
        16
    """

    plans_mixture = True  # reads its sources as the epoch's plan says (set_plan)

    def __new__(cls, *sources: IterDataPipe[Any], **kwargs: Any) -> Any:
        """A :class:`DrawnMixerIterDataPipe` when a source has no shard index, else a mixer.

        Without an index the plan cannot know a source's samples, so ``mix()`` draws per
        reader instead. Unpickling calls ``__new__`` without sources.
        """
        if cls is MixerIterDataPipe and sources and not all(indexed(dp) for dp in sources):
            return DrawnMixerIterDataPipe(*sources, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        *sources: IterDataPipe[Any],
        weights: Sequence[float] | None = None,
        repeat: Sequence[float | None] | None = None,
        choose: Sequence[int | None] | None = None,
        schedule: Schedule | None = None,
        samples_per_epoch: int | None = None,
        step_samples: int = 1,
        even: bool = False,
        until: str | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        if not sources:
            raise ValueError("mix() needs at least one source")
        self.names = (
            list(names) if names is not None else [f"source{i}" for i in range(len(sources))]
        )
        if len(self.names) != len(sources) or len(set(self.names)) != len(self.names):
            raise ValueError(f"names {self.names} should be {len(sources)} distinct names")
        if callable(schedule):
            check_picklable_fn(schedule, "mix(schedule=...)")
        self.sources = list(sources)
        for dp, name in zip(self.sources, self.names, strict=True):
            _sharder(dp, name)
        self.mixture = Mixture(
            len(sources),
            weights=tuple(weights) if weights is not None else None,
            repeat=tuple(repeat) if repeat is not None else None,
            choose=tuple(choose) if choose is not None else None,
            schedule=schedule
            if schedule is None or callable(schedule)
            else tuple((s, tuple(w)) for s, w in schedule),
            samples_per_epoch=samples_per_epoch,
            step_samples=step_samples,
            even=even,
            until=until,
        )
        self._plan: EpochPlan | None = None
        self._shape = Shape(None, False, None, None)
        self._fingerprint: list[list[Any]] | None = None
        self._shuffle: tuple[int, int, list[int]] | None = None

    def set_plan(self, plan: EpochPlan, shape: Shape | None = None) -> MixerIterDataPipe:
        """Run the next iteration by ``plan`` (loader hook); ``shape``: the graph after the mix, for a resume."""
        self._plan = plan
        self._shape = shape or Shape(None, False, None, None)
        return self

    def shuffle_start(self) -> tuple[int, int, list[int]] | None:
        """Where the sample shuffle after the mix continues in a resumed epoch (``None``: afresh)."""
        return self._shuffle

    def sharders(self) -> list[IndexSharderIterDataPipe]:
        """Each source's ``sharding_by_index``."""
        return [_sharder(dp, name) for dp, name in zip(self.sources, self.names, strict=True)]

    def __iter__(self) -> Iterator[Any]:
        plan, self._plan = self._plan, None
        if plan is None:  # outside a loader: every iteration is epoch 0 of seed 0
            plan = EpochPlan(0, 0)
        sharders = self.sharders()
        readers, reader = sharders[0].num_of_instances, sharders[0].instance_id
        for s, name in zip(sharders, self.names, strict=True):
            if (s.num_of_instances, s.instance_id) != (readers, reader):
                raise RuntimeError(
                    f"mix() source {name!r} is reader {s.instance_id} of {s.num_of_instances}, "
                    f"the first source reader {reader} of {readers}: shard all sources alike"
                )
        layouts = [s.plan_epoch() for s in sharders]
        sizes = [layout.total for layout in layouts]
        mix = self.mixture
        counts = mix.counts(sizes, plan.epoch)
        start = plan.epoch * mix.epoch_samples(sizes) if mix.mode == "schedule" else 0
        segments = plan.resume or (Segment(readers, 0, False, 0),)
        if segments[-1].readers != readers:
            raise RuntimeError(
                f"the resumed state is for {segments[-1].readers} readers but mix() was "
                f"sharded for {readers}"
            )
        shape = self._shape
        mine = mix_reader(
            mix,
            counts,
            seed=plan.seed,
            epoch=plan.epoch,
            segments=segments,
            reader=reader,
            shape=shape,
            epoch_start=start,
            shuffle_seed=None
            if shape.buffer_size is None
            else functools.partial(
                reader_stage_seed, plan.seed, plan.epoch, shape.shuffle_stage or 0
            ),
            after=plan.after,
        )
        self._shuffle = mine.shuffle
        for s, piece in zip(sharders, mine.pieces, strict=True):
            s.set_positions(piece)
        iterators = [iter(dp) for dp in self.sources]
        left = np.bincount(mine.sequence, minlength=len(self.sources)).tolist()
        for k in mine.sequence.tolist():
            try:
                item = next(iterators[k])
            except StopIteration:
                raise RuntimeError(
                    f"mix() source {self.names[k]!r} ended {left[k]} samples early: a stage "
                    "before the mix dropped samples, or its shards changed under the index"
                ) from None
            left[k] -= 1
            yield item

    def fingerprint(self) -> list[list[Any]]:
        """``[name, shards, samples, digest]`` per source: what a state of the mixture is bound to.

        Lists the shards and reads the indexes (in this process, once).
        """
        if self._fingerprint is None:
            out = []
            for name, s in zip(self.names, self.sharders(), strict=True):
                urls = sorted(s.source_datapipe)
                counts = (
                    s._index(urls).count_array[s._index(urls).positions(urls)].tolist()
                    if urls
                    else []
                )
                digest = hashlib.sha1(repr(sorted(counts)).encode()).hexdigest()[:16]
                out.append([name, len(urls), int(sum(counts)), digest])
            self._fingerprint = out
        return self._fingerprint


def check_sources(mixer: MixerIterDataPipe, saved: Sequence[Sequence[Any]]) -> None:
    """Raise :class:`SourceChanged` naming the first source that differs from ``saved``."""
    now = mixer.fingerprint()
    names = [s[0] for s in saved]
    if names != [n[0] for n in now]:
        raise SourceChanged(
            f"the loader state mixes sources {names}, this graph mixes {[n[0] for n in now]}"
        )
    for (name, shards, samples, digest), (_, s2, n2, d2) in zip(saved, now, strict=True):
        if (shards, samples, digest) != (s2, n2, d2):
            raise SourceChanged(
                f"mix() source {name!r} changed since the loader state was taken: it had "
                f"{shards} shards and {samples} samples, it has {s2} shards and {n2} samples"
                + (" (the same totals, other shard sizes)" if (shards, samples) == (s2, n2) else "")
                + "; resume only over the same data, or start the epoch afresh"
            )
