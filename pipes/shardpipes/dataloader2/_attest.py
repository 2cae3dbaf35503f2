"""The loader's evidence that it yields the right samples: ids of batches, the ranks' check, the id log.

Each rank folds the ids of the samples in the batches it yields (:mod:`shardpipes.plan.identity`)
into the digest of the current window. At the start of every epoch and every ``every`` batches
the ranks gather a few bytes each (a fingerprint of their position and binding, the window's
digest and id count): 24 bytes per rank. When the fingerprints differ the ranks gather their
positions (72 bytes per rank, only then) and name the fault:

- ``dropped-state``: some ranks resume a run, others start without a state;
- ``other-run``: ranks resume states of different runs (a stale state file);
- ``other-data``: ranks read other shard lists or plans;
- ``out-of-step``: ranks in different epochs or seeds, or at different batches of one epoch
  (a position reset to zero, a stretch skipped);
- ``duplicate``: two ranks yielded the same samples in a window (every rank on one seed, or
  sharding not applied).

The policy is ``"raise"`` (an :class:`~shardpipes.errors.AttestationError` on every rank at
once, so none waits for a collective that never comes), ``"warn"`` or ``"off"``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from shardpipes.dataloader2._binding import data_digest
from shardpipes.datapipes.iter.sync import settled
from shardpipes.errors import AttestationError, AttestationWarning
from shardpipes.plan.identity import MASK, SampleIds, id_term, sample_id

__all__ = ["Attestor", "Policy", "batch_ids", "batch_samples"]

Policy = Literal["raise", "warn", "off"]
POLICIES = ("raise", "warn", "off")
_FIELDS = ("run", "proposal", "seed", "epoch", "consumed", "steps", "data", "plan", "rank")


def _signed(value: int) -> int:
    value &= MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def _hex(value: str | None) -> int:
    return int(value, 16) if value else 0


def batch_samples(item: Any) -> list[tuple[str, str]] | None:
    """``(url, key)`` of the samples in ``item``: a batch of sample dicts, a collated dict, a sample.

    ``None`` when they do not carry ``__url__`` and ``__key__`` (a ``map`` replaced them).
    """
    if isinstance(item, list | tuple):
        if item and isinstance(item[0], dict) and "__key__" in item[0] and "__url__" in item[0]:
            try:
                return [(s["__url__"], s["__key__"]) for s in item]
            except (KeyError, TypeError):
                return None
        return None
    if isinstance(item, dict):
        keys, urls = item.get("__key__"), item.get("__url__")
        if isinstance(keys, str) and isinstance(urls, str):
            return [(urls, keys)]
        if isinstance(keys, list | tuple) and isinstance(urls, list | tuple):
            return list(zip(urls, keys, strict=True))
    return None


def batch_ids(item: Any) -> list[int] | None:
    """The 64-bit ids of the samples in ``item``: its ``ids``, else from its samples' keys.

    ``item.ids`` is the :class:`SampleIds` the loader's graph set on the batch; without it the
    ids come from the samples' ``__url__`` and ``__key__`` (see :func:`batch_samples`).
    """
    carried = getattr(item, "ids", None)
    if type(carried) is SampleIds:
        return list(carried)
    found = batch_samples(item)
    return None if found is None else [sample_id(url, key) for url, key in found]


class Attestor:
    """One loader's identities, counters and cross-rank checks (see the module docstring)."""

    def __init__(self) -> None:
        self.every: int | None = None  # window checks are opt-in (docs/attestation.md: cost)
        self.policy: Policy = "raise"
        self.log_dir: str | None = None
        self.run: int | None = None  # set on the first epoch, or restored from a state
        self.saved_rank: int | None = None  # the rank whose state was restored
        self.steps = 0  # items yielded in this run (restored ones included)
        self.before = 0  # ... in epochs before the current one
        self.last: list[int] | None = None  # [seed, epoch, items] of the last complete epoch
        self.data: dict[str, Any] | None = None
        self.plan: list[str] = []
        self._group: Any = None
        self._distributed = False
        self._rank = 0
        self._position = (0, 0, 0)  # seed, epoch, consumed at the last check
        self._digest = 0
        self._ids = 0
        self._epoch_digest = 0  # the whole epoch's, on this rank
        self._epoch_ids = 0
        self._whole = False  # this epoch started at its first batch (nothing to carry over)
        self._readers = 1
        self._expected: tuple[int, int] | None = None  # the dataset's digest and samples
        self.source: Any = None  # the graph (for the dataset's digest)
        self._timeout = 1800.0
        self._plan_hash = ""
        self._log: Any = None

    @property
    def wants_ids(self) -> bool:
        """Whether batches should carry their samples' ids (a check interval or an id log)."""
        return self.policy != "off" and (self.every is not None or self.log_dir is not None)

    def configure(self, every: int | None, policy: Policy, log_dir: str | None) -> None:
        """Set the interval (batches), the policy and the folder of the per-rank id logs."""
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every should be an int >= 1, got {every!r}")
        if policy not in POLICIES:
            raise ValueError(
                f"policy {policy!r} is not known; must be one of {', '.join(POLICIES)}"
            )
        self.every, self.policy, self.log_dir = every, policy, log_dir

    def binding(self, seed: int | None, epoch: int) -> dict[str, Any]:
        """The ``"binding"`` entry of a state (see ``_binding``)."""
        return {
            "run": None if self.run is None else f"{self.run:016x}",
            "rank": self._rank if self._distributed else 0,
            "data": self.data,
            "plan": self.plan,
            "steps": self.steps,
            "before": self.before,
            "last": self.last,
        }

    def restore(self, binding: dict[str, Any]) -> None:
        """Continue the run of a state's binding."""
        self.run = int(binding["run"], 16) if binding.get("run") else None
        self.saved_rank = binding.get("rank")
        self.steps = int(binding.get("steps", 0))
        self.before = int(binding.get("before", 0))
        self.last = binding.get("last")

    # --- the epoch -------------------------------------------------------------------------

    def start_epoch(
        self,
        group: Any,
        distributed: bool,
        seed: int,
        epoch: int,
        consumed: int,
        timeout: float,
        readers: int = 1,
    ) -> None:
        """Before an epoch's first item: agree on the run, check positions (one collective)."""
        self._group, self._distributed = group, distributed
        self._whole, self._readers = consumed == 0, readers
        self._epoch_digest = self._epoch_ids = 0
        self._rank = dist.get_rank() if distributed else 0
        self._position = (seed, epoch, consumed)
        self._digest = self._ids = 0
        self._timeout = timeout
        self._plan_hash = plan_hash(self.plan)
        self.before = self.steps - consumed
        if self.policy == "off" or not distributed:
            if self.run is None:
                self.run = secrets.randbits(63)
            return
        rows = self._gather_details(secrets.randbits(63))
        runs = {r["run"] for r in rows}
        if runs == {0}:  # a new run on every rank: rank 0's proposal names it
            self.run = rows[0]["proposal"] & MASK
        self._judge(rows, first=True)

    def end_epoch(self, seed: int, epoch: int, consumed: int) -> None:
        """After an epoch's last item: check the last (partial) window."""
        if self._distributed and self.policy != "off" and self.every and consumed % self.every:
            self._check(consumed)
        if self._distributed and self.policy != "off" and self.every and self._whole:
            self._check_epoch(consumed)
        self.last = [seed, epoch, consumed]
        self.before = self.steps

    def yielded(self, item: Any, consumed: int) -> None:
        """Count and fold one yielded item; check with the other ranks every ``every`` items."""
        self.steps += 1
        if self.policy == "off" or (self.every is None and self.log_dir is None):
            return
        ids = batch_ids(item)
        if ids is not None:
            d = self._digest
            for i in ids:
                d += id_term(i)
            self._epoch_digest = (self._epoch_digest + d - self._digest) & MASK
            self._digest = d & MASK
            self._ids += len(ids)
            self._epoch_ids += len(ids)
            if self.log_dir is not None:
                self._write(consumed, ids)
        if self.every is not None and consumed % self.every == 0 and self._distributed:
            self._check(consumed)

    # --- collectives -----------------------------------------------------------------------

    def _check(self, consumed: int) -> None:
        seed, epoch, _ = self._position
        self._position = (seed, epoch, consumed)
        finger = hash_position(self.run or 0, seed, epoch, consumed, self.data, self._plan_hash)
        mine = torch.tensor([_signed(finger), _signed(self._digest), self._ids], dtype=torch.int64)
        out = [torch.zeros(3, dtype=torch.int64) for _ in range(dist.get_world_size())]
        settled(
            dist.all_gather(out, mine, group=self._group, async_op=True),
            [mine, *out],
            self._timeout,
        )
        fingers = [int(t[0]) for t in out]
        windows = [(int(t[1]), int(t[2])) for t in out]
        self._digest = self._ids = 0
        if len(set(fingers)) > 1:
            self._judge(self._gather_details(0), first=False)
        seen: dict[tuple[int, int], int] = {}
        for rank, (digest, n) in enumerate(windows):
            if n == 0:
                continue
            if (digest, n) in seen:
                other = seen[(digest, n)]
                self._fault(
                    "duplicate",
                    f"ranks {other} and {rank} yielded the same {n} samples in the batches before "
                    f"batch {consumed} (every rank on one seed, or the graph's sharding not "
                    "applied per rank)",
                )
                return
            seen[(digest, n)] = rank

    def _sum(self, values: Sequence[int]) -> list[int]:
        """Sums over the ranks of 64-bit values, modulo 2**64 (as 16-bit limbs: no overflow)."""
        limbs = [(v >> (16 * i)) & 0xFFFF for v in values for i in range(4)]
        t = torch.tensor(limbs, dtype=torch.int64)
        settled(dist.all_reduce(t, group=self._group, async_op=True), [t], self._timeout)
        got = [int(x) for x in t.tolist()]
        return [
            sum(got[4 * j + i] << (16 * i) for i in range(4)) & MASK for j in range(len(values))
        ]

    def _check_epoch(self, consumed: int) -> None:
        """At the end of a whole epoch: the union of what all ranks yielded is the dataset.

        Only where the plan promises every sample exactly once: a graph with an index whose
        samples divide evenly among the readers and whose batches drop nothing.
        """
        data = self.data
        if (
            self.source is None
            or data is None
            or data["samples"] % self._readers
            or any("d=True" in line for line in self.plan)
        ):
            return
        if self._expected is None:  # the ranks share the reading of the keys, once per loader
            world = dist.get_world_size()
            part = data_digest(self.source, self._rank, world)
            total, count = self._sum(part)
            self._expected = (total, count)
        got_digest, got_ids, without = self._sum(
            [self._epoch_digest, self._epoch_ids, int(self._epoch_ids == 0)]
        )
        if without:
            return  # a rank's batches carry no ids: nothing to compare
        want_digest, want_ids = self._expected
        if (got_digest, got_ids) == (want_digest, want_ids):
            return
        if got_ids > want_ids:
            kind, what = "duplicate", f"{got_ids - want_ids} more samples than the dataset holds"
        elif got_ids < want_ids:
            kind, what = (
                "skipped",
                f"{want_ids - got_ids} of the dataset's samples were not yielded",
            )
        else:
            kind, what = (
                "other-range",
                "as many samples as the dataset holds, but other ones (some twice, some never)",
            )
        self._position = (self._position[0], self._position[1], consumed)
        self._fault(
            kind,
            f"the ranks together yielded {got_ids} samples this epoch, the plan {want_ids}: {what}",
        )

    def _gather_details(self, proposal: int) -> list[dict[str, int]]:
        seed, epoch, consumed = self._position
        values = [
            self.run or 0,
            proposal,
            seed,
            epoch,
            consumed,
            self.steps,
            _hex((self.data or {}).get("content")),
            _hex(self._plan_hash),
            -1 if self.saved_rank is None else self.saved_rank,
        ]
        mine = torch.tensor([_signed(v) for v in values], dtype=torch.int64)
        out = [torch.zeros(len(values), dtype=torch.int64) for _ in range(dist.get_world_size())]
        settled(
            dist.all_gather(out, mine, group=self._group, async_op=True),
            [mine, *out],
            self._timeout,
        )
        return [dict(zip(_FIELDS, (int(v) for v in t.tolist()), strict=True)) for t in out]

    def _judge(self, rows: list[dict[str, int]], *, first: bool) -> None:
        """Name the fault the gathered rows show (every rank reaches the same verdict)."""
        if self.run is None and first:
            self.run = rows[0]["run"] & MASK or None
        for field, kind, what in (
            ("run", "run", ""),
            ("data", "other-data", "other shard lists (or other index content)"),
            ("plan", "other-data", "other plans (stages or their parameters differ)"),
            ("seed", "out-of-step", "different seeds"),
            ("epoch", "out-of-step", "different epochs"),
            ("consumed", "out-of-step", "different batches of the epoch"),
        ):
            groups = _groups(rows, field)
            if len(groups) < 2:
                continue
            if field == "run":
                fresh = groups.get(0, [])
                if fresh:
                    resumed = [r for v, ranks in groups.items() if v for r in ranks]
                    self._fault(
                        "dropped-state",
                        f"rank(s) {_ranks(fresh)} start without a loader state while rank(s) "
                        f"{_ranks(resumed)} resume one: a rank's state was dropped (a change of "
                        "world size, or a missing file); load a state on every rank",
                    )
                else:
                    self._fault(
                        "other-run",
                        "the ranks resume states of different runs ("
                        + "; ".join(
                            f"run {v & MASK:016x}: rank(s) {_ranks(r)}" for v, r in groups.items()
                        )
                        + "): a stale state file from another run",
                    )
            else:
                detail = "; ".join(
                    f"{field} {v if field in ('seed', 'epoch', 'consumed') else f'{v & MASK:016x}'}: "
                    f"rank(s) {_ranks(r)}"
                    for v, r in groups.items()
                )
                hint = (
                    " (a position reset to zero on some ranks, or a stretch skipped)"
                    if field == "consumed"
                    else ""
                )
                self._fault(kind, f"the ranks are at {what}: {detail}{hint}")
            return

    def _fault(self, kind: str, message: str) -> None:
        seed, epoch, consumed = self._position
        text = f"rank {self._rank}: epoch {epoch}, step {consumed}: {kind}: {message}"
        if self.policy == "raise":
            raise AttestationError(text, fault=kind)
        warnings.warn(text, AttestationWarning, stacklevel=4)

    # --- the id log ------------------------------------------------------------------------

    def _write(self, consumed: int, ids: Sequence[int]) -> None:
        if self._log is None:
            assert self.log_dir is not None
            os.makedirs(self.log_dir, exist_ok=True)
            self._log = open(os.path.join(self.log_dir, f"ids-rank{self._rank}.bin"), "ab")  # noqa: SIM115 - closed by close()
        seed, epoch, _ = self._position
        head = np.array([_signed(seed), epoch, consumed, len(ids)], dtype=np.int64)
        self._log.write(head.tobytes() + np.array(ids, dtype=np.uint64).tobytes())

    def close(self) -> None:
        """Close the id log."""
        log, self._log = self._log, None
        if log is not None:
            log.close()


def _groups(rows: list[dict[str, int]], field: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rank, row in enumerate(rows):
        out.setdefault(row[field], []).append(rank)
    return out


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")


def plan_hash(plan: Sequence[str]) -> str:
    """A 64-bit hash (hex) of a plan description."""
    return hashlib.blake2b("\n".join(plan).encode(), digest_size=8).hexdigest()


def hash_position(
    run: int, seed: int, epoch: int, consumed: int, data: dict[str, Any] | None, plan: str
) -> int:
    """The fingerprint the ranks compare every ``every`` batches (``plan``: its hash)."""
    text = f"{run}:{seed}:{epoch}:{consumed}:{(data or {}).get('content')}:{plan}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
