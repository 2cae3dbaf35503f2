"""The restore decision: from a saved position and the loader's new topology, what every reader does.

A pure function of plain values (no torch, no I/O). ``DataLoader2.load_state_dict`` parses the
state, asks its reading service for the topology, calls :func:`restore` and applies the
:class:`Decision` it gets, or raises with the :class:`Refusal`'s reason. The maths of where a
seeking reader continues is :mod:`shardpipes.plan.resume`'s; this module only decides which of
four things happens:

- ``"fresh"``: the epoch had not started (or is restarted): every reader starts it at its beginning;
- ``"next_epoch"``: the epoch after the state's starts fresh (``on_change="next_epoch"``);
- ``"replay"``: every reader starts the epoch again and the loader drops the first ``skip``
  items of its rank, which are exactly those yielded before (same topology, no index);
- ``"seek"``: every reader reads only what it has left (:meth:`Decision.reader_plan`), from the
  epoch's stretches so far; a new topology splits what the old one had not yielded.

A refusal is given exactly when a started epoch (items yielded, or earlier stretches) would
have to seek and the graph cannot: the topology changed, or the state already continues an
epoch resumed elsewhere; or when the graph keeps a position across epochs (``fixed_length``)
and the state is past the first epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from shardpipes.plan.readers import reader_count
from shardpipes.plan.resume import ReaderPlan, Segment, Shape, reader_plan

__all__ = [
    "NUMBERINGS",
    "Action",
    "Decision",
    "GraphFacts",
    "Position",
    "Refusal",
    "Topology",
    "restore",
]

#: How readers are numbered. ``"rank-major"``: reader ``rank * max(readers_per_rank, 1) +
#: worker`` (distributed outer, workers inner), the rule of :mod:`shardpipes.plan.readers` that
#: partitions, seeds and resumes follow. It is the only numbering the plan knows.
NUMBERINGS = ("rank-major",)

Action = Literal["fresh", "next_epoch", "replay", "seek"]


@dataclass(frozen=True)
class Topology:
    """Who reads: ``ranks`` ranks of ``readers_per_rank`` readers each, numbered by ``numbering``.

    ``readers_per_rank=0`` means one reader per rank, in the rank's own process (no worker
    part in its seed path). ``distributed``: the ranks split the data (the rank is part of every
    reader's seed path), as states record it. ``rank`` is this process's rank; the restore
    decision does not depend on it.
    """

    ranks: int = 1
    readers_per_rank: int = 0
    distributed: bool = False
    rank: int = 0
    numbering: str = "rank-major"

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.readers_per_rank < 0 or not 0 <= self.rank < self.ranks:
            raise ValueError(
                f"a topology needs ranks >= 1, readers_per_rank >= 0 and 0 <= rank < ranks, got "
                f"ranks={self.ranks}, readers_per_rank={self.readers_per_rank}, rank={self.rank}"
            )
        if self.numbering not in NUMBERINGS:
            raise ValueError(
                f"reader numbering {self.numbering!r} is not known; must be one of "
                f"{', '.join(NUMBERINGS)}"
            )

    @property
    def readers(self) -> int:
        """All readers: ``ranks * max(readers_per_rank, 1)``."""
        return reader_count(self.ranks, self.readers_per_rank)

    def same_split(self, other: Topology) -> bool:
        """Whether ``other`` splits an epoch the same way (the rank aside)."""
        return (self.ranks, self.readers_per_rank, self.distributed, self.numbering) == (
            other.ranks,
            other.readers_per_rank,
            other.distributed,
            other.numbering,
        )

    def segment(self, consumed: int) -> Segment:
        """A stretch of an epoch run under this topology, ``consumed`` items per rank."""
        return Segment(self.ranks, self.readers_per_rank, self.distributed, consumed)

    def describe(self) -> str:
        """``"R rank(s) x W worker(s)"``, for messages."""
        return f"{self.ranks} rank(s) x {self.readers_per_rank} worker(s)"


@dataclass(frozen=True)
class Position:
    """Where a saved state is: the seed and epoch, and how far the epoch got.

    ``seed`` is ``None`` between epochs of a loader that was never seeded; ``seeded`` is
    ``False`` when the epoch's seed was drawn (the epoch is replayed, the next one draws again).
    ``consumed``: items each rank yielded in the current stretch; ``segments``: earlier
    stretches of the epoch under other topologies; ``skipped``: what handlers skipped in the
    epoch; ``epochs_run``: epochs started before this one.
    """

    seed: int | None
    seeded: bool
    epoch: int
    consumed: int
    segments: tuple[Segment, ...] = ()
    skipped: int = 0
    epochs_run: int = 0

    @property
    def started(self) -> bool:
        """Whether the epoch had yielded anything (in this stretch or an earlier one)."""
        return bool(self.consumed or self.segments)


@dataclass(frozen=True)
class GraphFacts:
    """What the restore needs to know of the graph, as plain values.

    ``seek_refusal``: ``None`` when an epoch of the graph can be resumed by seeking (a shard
    index, :func:`shardpipes.dataloader2.graph.resume_shape`), else the reason it cannot.
    ``carries_across_epochs``: a stage keeps its position from one epoch to the next.
    """

    seek_refusal: str | None = None
    carries_across_epochs: bool = False


@dataclass(frozen=True)
class Refusal:
    """The state cannot be continued by this loader; ``reason`` says why and what to do."""

    reason: str


@dataclass(frozen=True)
class Decision:
    """What every reader does at the next epoch start.

    ``seed``/``epoch``: the epoch to run (``seed`` ``None``: draw it, as an unseeded loader
    does); ``pending``: the seed was drawn by the saved run, so only this epoch uses it;
    ``skip``: items of each rank to drop first (``"replay"``); ``segments``: the epoch's
    stretches, the last one this topology's (``"seek"``).
    """

    action: Action
    seed: int | None
    epoch: int
    pending: bool = False
    skip: int = 0
    segments: tuple[Segment, ...] = ()
    epochs_run: int = 0

    def reader_plan(
        self,
        reader: int,
        total: int,
        policy: str,
        shape: Shape,
        reader_seed: Callable[[tuple[int, ...]], int],
    ) -> ReaderPlan | None:
        """What ``reader`` still reads of an epoch of ``total`` samples; ``None``: its whole part."""
        if self.action != "seek":
            return None
        return reader_plan(total, policy, self.segments, reader, shape, reader_seed)


def _seeds(position: Position, epoch: int) -> tuple[int | None, int, bool]:
    if position.seed is None:  # between epochs of a loader without seed()
        return None, 0, False
    return position.seed, epoch, not position.seeded


def restore(
    position: Position,
    graph: GraphFacts,
    old: Topology,
    new: Topology,
    *,
    on_change: Literal["restart_epoch", "next_epoch"] | None = None,
) -> Decision | Refusal:
    """Decide how a loader on ``new`` continues ``position``, saved on ``old``.

    ``on_change`` is set when the data or the plan changed under the state and the caller
    chose to restart its epoch, or start the next one, rather than fail.
    """
    epoch = position.epoch + (1 if on_change == "next_epoch" else 0)
    if max(epoch, position.epochs_run) > 0 and graph.carries_across_epochs:
        return Refusal(
            "this graph has fixed_length(), whose position carries over from one epoch to the "
            "next; exact resume after the first epoch is not supported for it yet"
        )
    seed, epoch, pending = _seeds(position, epoch)
    kept = Decision("fresh", seed, epoch, pending, epochs_run=position.epochs_run)
    if on_change is not None:
        action: Action = "next_epoch" if on_change == "next_epoch" else "fresh"
        return Decision(action, seed, epoch, pending, epochs_run=position.epochs_run)
    if not position.started:
        return kept
    here = old.segment(position.consumed)
    cannot = graph.seek_refusal or (
        f"handlers skipped {position.skipped} samples or shards of this epoch before the state "
        "was taken, so positions in the index no longer match what was yielded"
        if position.skipped
        else None
    )
    if not old.same_split(new):
        if cannot is not None:
            return Refusal(
                f"loader state was saved with {old.describe()}, this loader runs "
                f"{new.ranks} x {new.readers_per_rank}; resuming with another topology needs a graph that can seek "
                f"with a shard index, and this one cannot: {cannot}"
            )
        segments = (*position.segments, here, new.segment(0))
        return Decision("seek", seed, epoch, pending, segments=segments, epochs_run=kept.epochs_run)
    if cannot is None:
        segments = (*position.segments, here)
        return Decision("seek", seed, epoch, pending, segments=segments, epochs_run=kept.epochs_run)
    if position.segments:
        return Refusal(
            "this state continues an epoch resumed with another topology, but this graph cannot "
            "resume by seeking (is it the same graph?)"
        )
    return Decision(
        "replay", seed, epoch, pending, skip=position.consumed, epochs_run=kept.epochs_run
    )
