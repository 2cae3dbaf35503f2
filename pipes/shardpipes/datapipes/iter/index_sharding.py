"""Sample-level sharding with a shard index (functional name: ``sharding_by_index``).

``sharding_filter`` splits whole shards between readers, so 7 shards over 6 readers leave one
reader with twice the data and 8 readers with one idle. With the index (``shardpipes index``),
this stage splits *samples*: the epoch's shard order (from the shared-seed shuffle before it)
is read as one sequence of samples, cut into equal contiguous pieces, one per reader
(``rank * num_workers + worker``). Each piece is a few ``ShardRange`` items: a shard URL plus a
sample range and its byte span, read with one seek or one range request.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES, _ShardingIterDataPipe

from shardpipes.datapipes.iter.base import register
from shardpipes.index.document import ShardIndex, default_index_url, find_index
from shardpipes.plan.epoch import Resume
from shardpipes.plan.partition import EpochLayout
from shardpipes.plan.readers import POLICIES, per_reader
from shardpipes.plan.resume import ReaderPlan, Runs
from shardpipes.storage.ranges import ShardRange

__all__ = ["IndexSharderIterDataPipe"]

logger = logging.getLogger(__name__)

# Largest sparse read of a resumed shuffle buffer (bounds the memory of one remote fetch).
_SPARSE_BYTES = 16 << 20


@register("sharding_by_index")
class IndexSharderIterDataPipe(_ShardingIterDataPipe):
    """Split the samples of the incoming shards equally between readers (functional name: ``sharding_by_index``).

    Write it where ``sharding_filter()`` would go, after the shard-level shuffle. Every reader
    gets exactly the same number of samples each epoch (``policy="drop"`` leaves out fewer
    samples than there are readers; ``"pad"`` repeats as few), for any number of shards,
    including fewer shards than readers. Reading services apply it with rank and worker as
    they apply ``sharding_filter``; iterated on its own it is one reader that gets everything.

    Args:
        source_datapipe: Shard URLs (all of them, in the epoch's order).
        index: The index's URL, or a loaded ``ShardIndex``. Default: the sidecar
            ``shardpipes index`` writes next to the shards (``default_index_url``).
        policy: ``"drop"`` (default) or ``"pad"``.
        storage_options: Passed to fsspec to read the index.

    Yields:
        ShardRange: This reader's sample ranges.

    Raises:
        FileNotFoundError: No index given and none next to the shards; the message says how
            to build one.
        KeyError: A shard URL that the index does not list.

    Examples:
        >>> import tempfile
        >>> from shardpipes.index import build_index
        >>> from shardpipes.synthetic import write_synthetic
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> paths = write_synthetic(tempfile.mkdtemp(), shards=2, samples=[3, 4])
        >>> index = build_index(paths, progress=False)
        >>> dp = IterableWrapper(paths).sharding_by_index(index)
        >>> dp.apply_sharding(2, 1)
        >>> [(r.start, r.stop) for r in dp]  # 7 samples, 2 readers: reader 1 gets samples 3..5
        [(0, 3)]
    """

    # Traits (datapipes/iter/base.py), declared without the stage base: the class must be torch's
    # sharding kind for apply_sharding. It starts the steps from ranges to samples.
    range_to_samples = ("urls", "ranges")
    resumable = True
    seeks = "reads"  # a resumed epoch starts its reads where the reader was (set_resume)

    def __init__(
        self,
        source_datapipe: Iterable[str],
        index: str | ShardIndex | None = None,
        *,
        policy: Literal["drop", "pad"] = "drop",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r} is not known; must be one of 'drop', 'pad'")
        self.source_datapipe = source_datapipe
        self.index = index
        self.policy = policy
        self.storage_options = dict(storage_options or {})
        self.groups: dict[int, tuple[int, int]] = {}
        self.num_of_instances = 1
        self.instance_id = 0
        self.per_reader: int | None = None  # samples per reader in the current epoch
        self._loaded: ShardIndex | None = None
        # Handed for one epoch by the loader when it resumes from a state (set_resume).
        self._resume: Resume | None = None
        # Handed for one epoch by mix(): the epoch's shards listed ahead, the positions to read.
        self._planned: tuple[list[str], ShardIndex | None, np.ndarray, EpochLayout] | None = None
        self._positions: Runs | None = None

    def apply_sharding(  # type: ignore[override]  # torch's base declares it abstract (-> Never)
        self,
        num_of_instances: int,
        instance_id: int,
        sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
    ) -> None:
        """Make this stage reader ``instance_id`` of ``num_of_instances`` for ``sharding_group``.

        Groups combine mixed-radix as ``sharding_filter``'s do (distributed outer,
        multiprocessing inner).
        """
        if not 0 <= instance_id < num_of_instances:
            raise ValueError(
                f"instance_id({instance_id}) should be smaller than num_of_instances({num_of_instances})"
            )
        if sharding_group == SHARDING_PRIORITIES.DEFAULT:
            if self.groups and SHARDING_PRIORITIES.DEFAULT not in self.groups:
                raise RuntimeError("ShardingGroup.DEFAULT cannot be mixed with other groups")
        elif SHARDING_PRIORITIES.DEFAULT in self.groups:
            raise RuntimeError("ShardingGroup.DEFAULT cannot be mixed with other groups")
        self.groups[sharding_group] = (num_of_instances, instance_id)
        self.num_of_instances, self.instance_id = 1, 0
        for group in sorted(self.groups, reverse=True):  # multiprocessing (inner) first
            n, i = self.groups[group]
            self.instance_id += self.num_of_instances * i
            self.num_of_instances *= n

    def set_resume(self, resume: Resume | None) -> IndexSharderIterDataPipe:
        """Continue a resumed epoch in the next iteration (loader hook; ``None``: start afresh)."""
        self._resume = resume
        return self

    def plan_epoch(self) -> EpochLayout:
        """List the next epoch's shards now and return their layout (for ``mix()``).

        The next iteration reads that listing instead of listing the shards again.
        """
        urls = list(self.source_datapipe)
        if not urls:
            self._planned = (urls, None, np.zeros(0, np.int64), EpochLayout([]))
        else:
            index = self._index(urls)
            where = index.positions(urls)
            self._planned = (urls, index, where, EpochLayout(index.count_array[where]))
        return self._planned[3]

    def epoch_samples(self) -> int:
        """Samples in the shards of an epoch, from the index (for the loader's ``len()``).

        Lists a copy of the source (the shard list; the real source's state does not move) and
        reads no sample.
        """
        urls = list(copy.deepcopy(self.source_datapipe))
        if not urls:
            return 0
        index = self._index(urls)
        return int(index.count_array[index.positions(urls)].sum())

    def set_positions(self, positions: Runs | None) -> IndexSharderIterDataPipe:
        """Read these positions of the planned epoch (read circularly) in the next iteration (``mix()``'s hook)."""
        self._positions = positions
        return self

    def load_index(self) -> ShardIndex:
        """The index of the shards it reads, loaded once (what ``DistributedReadingService`` shares)."""
        return self._index(list(self.source_datapipe))

    def _index(self, urls: list[str]) -> ShardIndex:
        if self._loaded is not None:
            return self._loaded
        if isinstance(self.index, ShardIndex):
            self._loaded = self.index
        else:
            url = self.index or find_index(urls, storage_options=self.storage_options)
            if url is None:
                raise FileNotFoundError(
                    f"sharding_by_index found no index at {default_index_url(urls)}: build it with "
                    f"`shardpipes index {urls[0]} ...`, or pass index=URL"
                )
            self._loaded = ShardIndex.load(url, storage_options=self.storage_options)
        return self._loaded

    def __iter__(self) -> Iterator[ShardRange]:
        resume, self._resume = self._resume, None
        planned, self._planned = self._planned, None
        positions, self._positions = self._positions, None
        if planned is not None:
            urls, found, where, layout = planned
        else:
            urls = list(self.source_datapipe)
        if not urls:
            self.per_reader = 0
            return
        if planned is None or found is None:
            found = self._index(urls)
            # The URLs come in the epoch's order (the shard shuffle is upstream): lay them out
            # as they come. O(shards) once per epoch; each range is then a bisection.
            where = found.positions(urls)
            layout = EpochLayout(found.count_array[where])
        index = found
        total = layout.total
        n, i = self.num_of_instances, self.instance_id
        runs: list[tuple[int, int]] = []
        if positions is not None:
            self.per_reader = len(positions)
            runs = positions.runs
        elif resume is not None:
            plan = self._resumed(resume, total)
            self.per_reader = plan.samples
            yield from self._sparse(plan.read_order()[0], urls, index, where, layout)
            runs = plan.rest.runs
        else:
            per = per_reader(total, n, self.policy)
            runs = [(i * per, (i + 1) * per)] if per else []
            self.per_reader = per
        for a, b in runs:
            for r in layout.ranges(a, b):
                offset, size = index.shards[int(where[r.shard])].byte_range(r.start, r.stop)
                yield ShardRange(urls[r.shard], r.start, r.stop, offset, size)

    @staticmethod
    def _sparse(
        positions: list[int],
        urls: list[str],
        index: ShardIndex,
        where: np.ndarray,
        layout: EpochLayout,
    ) -> Iterator[ShardRange]:
        """Sparse ranges that read ``positions`` (sorted), in order.

        One range per shard, of at most ``_SPARSE_BYTES`` bytes: one open and a seek per
        sample locally, one ``cat_ranges`` call remotely.
        """
        group: list[int] = []
        spans: list[tuple[int, int]] = []
        nbytes = 0
        shard = -1

        def emit() -> ShardRange:
            size = sum(s for _, s in spans)
            return ShardRange(urls[shard], group[0], group[-1] + 1, spans[0][0], size, tuple(spans))

        for pos in positions:
            at, sample = layout.shard_at(pos)
            if group and (at != shard or nbytes >= _SPARSE_BYTES):
                yield emit()
                group, spans, nbytes = [], [], 0
            shard = at
            group.append(sample)
            off, size = index.shards[int(where[at])].byte_range(sample, sample + 1)
            if spans and spans[-1][0] + spans[-1][1] == off:
                spans[-1] = (spans[-1][0], spans[-1][1] + size)
            else:
                spans.append((off, size))
            nbytes += size
        if group:
            yield emit()

    def _resumed(self, resume: Resume, total: int) -> ReaderPlan:
        """This reader's part of a resumed epoch (its sample shuffle reads it from ``resume``)."""
        plan = resume.plan_reader(total, self.policy, self.num_of_instances, self.instance_id)
        if (plan.dropped or plan.padded) and self.instance_id == 0:
            logger.warning(
                "resuming epoch %d with another topology: %d samples not yet yielded were %s to "
                "keep the ranks' lengths equal (policy %r)",
                resume.epoch,
                plan.dropped or plan.padded,
                "left out" if plan.dropped else "added as repeats",
                self.policy,
            )
        return plan

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]
        if self.index is None or isinstance(self.index, str):
            state["_loaded"] = None  # each process loads the index file itself, once
        # (a ShardIndex object the caller passed travels with the graph)
        return state
