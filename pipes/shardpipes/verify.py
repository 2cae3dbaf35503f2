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
from shardpipes.plan.readers import batches, per_reader

__all__ = ["EpochReport", "read_id_log", "verify"]


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

    def line(self) -> str:
        """One line of the printed report."""
        text = (
            f"seed {self.seed} epoch {self.epoch}: expected {self.expected}, read {self.read}, "
            f"duplicated {self.duplicated}, missing {self.missing}"
        )
        if self.dropped_by_policy:
            text += f" (+{self.dropped_by_policy} left out by policy 'drop')"
        return text + "".join(f"\n    {n}" for n in self.notes)

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


def _plan(index: ShardIndex, world: int, workers: int, batch: int, policy: str) -> tuple[int, int]:
    """(samples read per epoch over all readers, batches per rank per epoch)."""
    readers = world * max(workers, 1)
    each = per_reader(index.num_samples, readers, policy)
    return each * readers, batches(each, batch, False) * max(workers, 1)


def verify(
    index: ShardIndex,
    *,
    world: int,
    workers: int,
    batch_size: int,
    policy: str = "drop",
    states: Sequence[dict[str, Any]] = (),
    log_dir: str | None = None,
) -> list[EpochReport]:
    """Replay the plan of a run; return one report per epoch seen (see the module docstring)."""
    per_epoch, length = _plan(index, world, workers, batch_size, policy)
    reports: dict[tuple[int, int], EpochReport] = {}

    def report(seed: int, epoch: int) -> EpochReport:
        if (seed, epoch) not in reports:
            reports[seed, epoch] = EpochReport(seed, epoch, per_epoch)
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
        r.read = min(reached.get(key, 0) * scale, per_epoch)
        if prev is not None and key[0] == prev[0] and key[1] < prev[1]:
            r.missing = per_epoch - r.read  # an epoch the run left behind
    if log_dir is not None:
        _compare_logs(index, log_dir, reports, report, per_epoch)
    return [reports[k] for k in sorted(reports)]


def _compare_logs(
    index: ShardIndex, log_dir: str, reports: dict[Any, EpochReport], report: Any, per_epoch: int
) -> None:
    counts: dict[tuple[int, int], Counter[int]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "ids-rank*.bin"))):
        for seed, epoch, _, ids in read_id_log(path):
            counts.setdefault((seed, epoch), Counter()).update(ids.tolist())
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
