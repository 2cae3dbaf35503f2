"""From figures to what to change: a pure function of a :class:`~.snapshot.Snapshot`.

The rules are written out in docs/telemetry.md ("The verdict"); keep the two in step.
"""

from __future__ import annotations

import dataclasses

from shardpipes.dataloader2.telemetry.sampler import LOADER
from shardpipes.dataloader2.telemetry.snapshot import Snapshot

__all__ = ["BLOCKED", "BUSY", "DATA_BOUND", "IDLE", "Verdict", "verdict"]

#: The training loop waits at least this share of step time: data-bound.
DATA_BOUND = 0.10
#: Workers busy at least this share of their time make items as fast as they can.
BUSY = 0.85
#: Workers busy less than this share (and not data-bound) are more than the job needs.
IDLE = 0.50
#: Workers whose busy time is at least this share off-CPU are waiting on storage.
BLOCKED = 0.50

# What makes a costly stage cheaper, by its name.
_HINTS = {
    "decode": "the fused decode_random_resized_crop(), or decode(image=...) at a smaller size",
    "decode_random_resized_crop": "threads=... on decode_random_resized_crop(), or smaller images",
    "map": "a cheaper function in map() (or one that takes whole batches, after batch())",
    "shuffle": "a smaller shuffle buffer",
    "webdataset": "a shard index: sharding_by_index() reads samples at their offsets",
    "load_from_tar": "a shard index: sharding_by_index() reads samples at their offsets",
    "open_files_by_fsspec": "more read-ahead: open_files_by_fsspec(readahead=...)",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the figures say, and what to change.

    Attributes:
        data_bound: The loop waits at least :data:`DATA_BOUND` of step time.
        wait_share: The share of step time it waits.
        stage: The costliest stage (not counting the loader's own work), or ``None``.
        stage_share: Its share of the sampled CPU of where it runs.
        where: ``"worker"`` or ``"loader"`` (in-process: the main process's).
        workers: Worker processes that reported (``0``: the graph runs in-process).
        busy: Their mean busy share (``None`` without workers).
        advice: What to change, most useful first.
    """

    data_bound: bool
    wait_share: float
    stage: str | None
    stage_share: float
    where: str
    workers: int
    busy: float | None
    advice: tuple[str, ...]

    @property
    def text(self) -> str:
        """One paragraph: the finding, then the advice."""
        parts = [
            f"data-bound at {self.wait_share:.0%} of step time"
            if self.data_bound
            else f"not data-bound: the loop waits {self.wait_share:.0%} of step time"
        ]
        if self.stage is not None:
            parts.append(
                f"the `{self.stage}` stage costs {self.stage_share:.0%} of {self.where} CPU"
            )
        if self.busy is not None:
            plural = "s are" if self.workers != 1 else " is"
            parts.append(f"{self.workers} worker{plural} busy {self.busy:.0%} of the time")
        text = "; ".join(parts)
        return f"{text}: {'; '.join(self.advice)}" if self.advice else text

    def __str__(self) -> str:
        return self.text


def verdict(snapshot: Snapshot) -> Verdict:
    """Read ``snapshot`` (or the difference of two, :meth:`Snapshot.since`) by the rules of docs/telemetry.md."""
    s = snapshot
    share = s.wait_share
    bound = share >= DATA_BOUND
    n = len(s.workers)
    busy = sum(w.busy_share for w in s.workers) / n if n else None
    where = "workers" if n else "main"
    shares = {k: v for k, v in s.stage_share(where).items() if k != LOADER}
    stage = max(shares, key=lambda k: shares[k]) if shares else None
    cost = shares.get(stage, 0.0) if stage is not None else 0.0
    cheaper = _HINTS.get(stage.split("#")[0], f"a cheaper `{stage}`") if stage else None
    advice: list[str] = []
    if not bound:
        if busy is not None and busy < IDLE:
            need = max(1, round(n * busy / BUSY))
            advice.append(f"the loader keeps up; {need} worker{'s' if need > 1 else ''} would do")
        else:
            advice.append("the loader keeps up; nothing to change")
    elif not n:
        advice.append(
            "run the graph in worker processes: MultiProcessingReadingService(num_workers=...)"
        )
        if cheaper:
            advice.append(cheaper)
    elif _blocked(s) >= BLOCKED and s.storage.opened:
        advice.append(
            "the workers wait on storage: more read-ahead (open_files_by_fsspec(readahead=...)) "
            "or more workers would help"
        )
    elif _blocked(s) >= BLOCKED:
        advice.append(
            f"the workers are on a CPU only {1 - _blocked(s):.0%} of their busy time: the machine "
            "has fewer free cores than busy processes; more cores, or fewer processes"
        )
    elif busy is not None and busy >= BUSY:
        advice.append("more workers" + (f" or {cheaper}" if cheaper else "") + " would help")
    else:
        main = s.stage_share("main")
        top = max(main, key=lambda k: main[k]) if main else LOADER
        advice.append(
            f"the workers wait to be asked, so the main process is the bottleneck (most of its "
            f"CPU: `{top}`): fewer main-process stages, or larger batches"
        )
    retried = sum(s.storage.retries.values())
    if retried:
        causes = ", ".join(f"{c}: {k}" for c, k in sorted(s.storage.retries.items()))
        advice.append(f"storage retried {retried} reads ({causes})")
    if s.skipped:
        advice.append(f"error handlers skipped {s.skipped} samples or shards")
    return Verdict(
        data_bound=bound,
        wait_share=share,
        stage=stage,
        stage_share=cost,
        where="worker" if n else "loader",
        workers=n,
        busy=busy,
        advice=tuple(advice),
    )


def _blocked(s: Snapshot) -> float:
    """The share of the workers' busy time spent off-CPU (waiting on storage, mostly)."""
    busy = sum(w.busy for w in s.workers)
    cpu = sum(min(w.cpu, w.busy) for w in s.workers)
    return (busy - cpu) / busy if busy > 0 else 0.0
