"""``shardpipes verify``: replay a run's plan and compare it with its checkpoints and id logs.

Two kinds of evidence, either or both:

- **The run's loader states**, in the order they were saved (one per checkpoint; any rank's,
  they hold the same position). Each state's ``binding`` counts the items the rank yielded in
  the run (``steps``) and its position (epoch, batch). Between two states the loader yielded
  ``steps`` difference items; if its position advanced by fewer, the difference was read twice
  (a restart); if by more, it was skipped. With the index and the topology the plan gives
  each epoch's length, so a jump across an epoch boundary is counted too.
- **The id logs** the loader writes with ``dl.attest(log_dir=...)`` (``ids-rank{R}.bin``):
  every sample each rank yielded. Compared with the index's keys, per epoch: the samples
  expected, read, read more than once, and never read (``policy="drop"`` leaves out fewer
  samples than there are readers, by design: they are counted apart).

For a run of a ``mix()`` (``mixture=``, one index per source, in the mix's order) each epoch's
counts per source come from the mixture (:meth:`~shardpipes.plan.mixture.Mixture.counts`), and
the id logs are also compared per source (a sample's id names its shard, so its source): the
samples expected, read, read more often than the epoch's proportion asks, and never read. A
source read ``q`` times and a fraction ``r`` more per epoch has each sample read ``q`` or
``q + 1`` times; a source read less than once per epoch (``choose``, ``repeat < 1``) has no
sample read twice, and ``missing`` counts its shortfall. The states count batches, not
sources: they give the epoch's totals only.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardpipes.index.document import ShardIndex
from shardpipes.plan.identity import sample_id
from shardpipes.plan.mixture import Mixture
from shardpipes.plan.readers import batches, per_reader

__all__ = ["EpochReport", "SourceReport", "read_id_log", "verify"]


@dataclass
class SourceReport:
    """What one epoch read of one source of a mixture (samples over all ranks)."""

    name: str
    expected: int
    read: int = 0
    duplicated: int = 0
    missing: int = 0

    def line(self) -> str:
        """One line of the printed report."""
        return (
            f"source {self.name}: expected {self.expected}, read {self.read}, "
            f"duplicated {self.duplicated}, missing {self.missing}"
        )


@dataclass
class EpochReport:
    """What one epoch of a run read, against its plan (samples over all ranks)."""

    seed: int
    epoch: int
    expected: int
    read: int = 0
    duplicated: int = 0
    missing: int = 0
    dropped_by_policy: int = 0
    notes: list[str] = field(default_factory=list)
    sources: list[SourceReport] = field(default_factory=list)

    def line(self) -> str:
        """One line of the printed report."""
        text = (
            f"seed {self.seed} epoch {self.epoch}: expected {self.expected}, read {self.read}, "
            f"duplicated {self.duplicated}, missing {self.missing}"
        )
        if self.dropped_by_policy:
            text += f" (+{self.dropped_by_policy} left out by policy 'drop')"
        lines = [s.line() for s in self.sources] + self.notes
        return text + "".join(f"\n    {n}" for n in lines)

    @property
    def ok(self) -> bool:
        """Nothing read twice, nothing missing."""
        return not (self.duplicated or self.missing)


def read_id_log(path: str) -> list[tuple[int, int, int, np.ndarray]]:
    """The records of one rank's id log: ``(seed, epoch, batch, ids)``."""
    raw = np.fromfile(path, dtype=np.int64)
    out, i = [], 0
    while i + 4 <= len(raw):
        seed, epoch, step, n = (int(v) for v in raw[i : i + 4])
        out.append((seed, epoch, step, raw[i + 4 : i + 4 + n].view(np.uint64)))
        i += 4 + n
    if i != len(raw):
        raise ValueError(f"{path}: the id log ends inside a record (at int64 {i} of {len(raw)})")
    return out


def _plan(total: int, world: int, workers: int, batch: int, policy: str) -> tuple[int, int]:
    """(samples read per epoch over all readers, batches per rank per epoch)."""
    readers = world * max(workers, 1)
    each = per_reader(total, readers, policy)
    return each * readers, batches(each, batch, False) * max(workers, 1)


def _indexes(index: ShardIndex | Sequence[ShardIndex]) -> list[ShardIndex]:
    return [index] if isinstance(index, ShardIndex) else list(index)


def verify(
    index: ShardIndex | Sequence[ShardIndex],
    *,
    world: int,
    workers: int,
    batch_size: int,
    policy: str = "drop",
    states: Sequence[dict[str, Any]] = (),
    log_dir: str | None = None,
    mixture: Mixture | None = None,
    names: Sequence[str] | None = None,
) -> list[EpochReport]:
    """Replay the plan of a run; return one report per epoch seen (see the module docstring).

    Args:
        index: The index of the data the run read; for a mixture, one per source.
        world: Ranks.
        workers: Worker processes per rank.
        batch_size: The ``batch()``'s size.
        policy: ``sharding_by_index``'s policy (``"drop"`` or ``"pad"``).
        states: The run's loader states, in the order they were saved.
        log_dir: The folder of the id logs (``dl.attest(log_dir=...)``).
        mixture: The run's :class:`~shardpipes.plan.mixture.Mixture` (the arguments of its
            ``mix()``), for a mixture.
        names: The mixture's sources' names. Default: ``0``, ``1``, ...
    """
    indexes = _indexes(index)
    if mixture is None and len(indexes) != 1:
        raise ValueError(f"{len(indexes)} indexes without a mixture: pass mixture=Mixture(...)")
    if mixture is not None and mixture.sources != len(indexes):
        raise ValueError(f"a mixture of {mixture.sources} sources, {len(indexes)} indexes")
    labels = list(names) if names is not None else [str(i) for i in range(len(indexes))]
    if len(labels) != len(indexes):
        raise ValueError(f"{len(labels)} names for {len(indexes)} sources")
    sizes = [ix.num_samples for ix in indexes]

    def counts(epoch: int) -> list[int]:
        return mixture.counts(sizes, epoch) if mixture is not None else sizes

    def plan(epoch: int) -> tuple[int, int]:
        # A mixture's readers get equal shares of its positions, the rest left out ("drop").
        return _plan(sum(counts(epoch)), world, workers, batch_size, policy)

    per_epoch, length = plan(0)
    reports: dict[tuple[int, int], EpochReport] = {}

    def report(seed: int, epoch: int) -> EpochReport:
        if (seed, epoch) not in reports:
            r = EpochReport(seed, epoch, plan(epoch)[0])
            if mixture is not None:
                r.sources = [SourceReport(n, c) for n, c in zip(labels, counts(epoch), strict=True)]
            reports[seed, epoch] = r
        return reports[seed, epoch]

    scale = batch_size * world  # samples per batch position, over all ranks
    reached: dict[tuple[int, int], int] = {}  # furthest batch seen per epoch
    prev: tuple[int, int, int, int] | None = None  # seed, epoch, batch, steps
    for n, state in enumerate(states):
        b = state.get("binding") or {}
        if "steps" not in b or state.get("seed") is None:
            continue
        here = (int(state["seed"]), int(state["epoch"]), int(state["consumed"]), int(b["steps"]))
        r = report(here[0], here[1])
        reached[here[:2]] = max(reached.get(here[:2], 0), here[2])
        if prev is not None and here[0] == prev[0] and here[1] >= prev[1]:
            for e in range(prev[1], here[1]):  # epochs the run went through: complete
                report(here[0], e)
                if e > prev[1]:
                    reached.setdefault((here[0], e), 0)
            if here[1] > prev[1]:
                reached[prev[:2]] = length if here[1] == prev[1] + 1 else reached[prev[:2]]
            yielded = here[3] - prev[3]
            advanced = (
                here[2] - prev[2]
                if here[1] == prev[1]
                else (length - prev[2]) + (here[1] - prev[1] - 1) * length + here[2]
            )
            if yielded > advanced:
                r.duplicated += (yielded - advanced) * scale
                r.notes.append(
                    f"state {n}: {yielded} batches per rank were yielded since state {n - 1} but "
                    f"the position advanced by {advanced}: a restart read {yielded - advanced} again"
                )
            elif yielded < advanced:
                r.notes.append(
                    f"state {n}: the position advanced by {advanced} batches since state {n - 1} "
                    f"but only {yielded} were yielded: {advanced - yielded} skipped"
                )
        prev = here
    for key, r in reports.items():
        r.read = min(reached.get(key, 0) * scale, r.expected)
        if prev is not None and key[0] == prev[0] and key[1] < prev[1]:
            r.missing = r.expected - r.read  # an epoch the run left behind
    if log_dir is not None:
        if mixture is None:
            _compare_logs(indexes[0], log_dir, reports, report, per_epoch)
        else:
            _compare_mixture_logs(indexes, log_dir, report)
    return [reports[k] for k in sorted(reports)]


def _read_logs(log_dir: str) -> dict[tuple[int, int], Counter[int]]:
    counts: dict[tuple[int, int], Counter[int]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "ids-rank*.bin"))):
        for seed, epoch, _, ids in read_id_log(path):
            counts.setdefault((seed, epoch), Counter()).update(ids.tolist())
    return counts


def _compare_mixture_logs(indexes: list[ShardIndex], log_dir: str, report: Any) -> None:
    """Per epoch and per source: the ids of the logs against each source's count."""
    members = [{sample_id(s.url, k) for s in ix.shards for k in s.keys} for ix in indexes]
    source_of = {i: src for src, ids in enumerate(members) for i in ids}
    for (seed, epoch), seen in _read_logs(log_dir).items():
        r = report(seed, epoch)
        split: list[Counter[int]] = [Counter() for _ in indexes]
        strangers = 0
        for i, c in seen.items():
            src = source_of.get(i)
            if src is None:
                strangers += c
            else:
                split[src][i] = c
        for src, got, ids in zip(r.sources, split, members, strict=True):
            size = len(ids)
            src.read = sum(got.values())
            most = -(-src.expected // size) if size else 0  # ceil: a sample's reads at most
            over = sum(c - most for c in got.values() if c > most)
            src.duplicated = max(over, src.read - src.expected)
            least = src.expected // size if size else 0
            if least:  # every sample is read at least this often
                src.missing = sum(max(0, least - got.get(i, 0)) for i in ids)
            else:
                src.missing = max(0, src.expected - len(got))
        r.read = sum(seen.values())
        r.duplicated = sum(x.duplicated for x in r.sources)
        missed = sum(x.missing for x in r.sources)
        dropped = sum(x.expected for x in r.sources) - r.expected  # left out to keep readers equal
        r.dropped_by_policy = min(missed, dropped)
        r.missing = missed - r.dropped_by_policy
        if strangers:
            r.notes.append(f"{strangers} ids that no source's index lists (another dataset?)")


def _compare_logs(
    index: ShardIndex, log_dir: str, reports: dict[Any, EpochReport], report: Any, per_epoch: int
) -> None:
    counts = _read_logs(log_dir)
    everything = {sample_id(s.url, k) for s in index.shards for k in s.keys}
    for (seed, epoch), seen in counts.items():
        r = report(seed, epoch)
        r.read = sum(seen.values())
        r.duplicated = sum(c - 1 for c in seen.values() if c > 1)
        missed = len(everything - seen.keys())
        r.dropped_by_policy = min(missed, len(everything) - per_epoch)
        r.missing = missed - r.dropped_by_policy
        strangers = len(seen.keys() - everything)
        if strangers:
            r.notes.append(f"{strangers} ids that the index does not list (another dataset?)")
