"""What a reading service tells ``DataLoader2`` about itself: the reading-service protocol.

``DataLoader2`` never asks which class a service is. It calls the four call-time methods
(``initialize``, ``initialize_iteration``, ``finalize_iteration``, ``finalize``; see
:mod:`shardpipes.dataloader2.reading_service`) and asks these questions, each answered by a
method of :class:`~shardpipes.dataloader2.reading_service.ReadingServiceInterface` with a default
for a service that runs everything in one process:

- ``topology() -> Topology``: how many ranks, how many readers per rank, how readers are
  numbered, whether the ranks split the data. States record it; a restore compares it.
- ``share_seed(seed) -> int``: the seed every rank uses for an epoch whose seed the loader drew
  from torch (rank 0's draw); a one-rank service returns ``seed``.
- ``collectives() -> Collectives | None``: the process group the loader's checks run on
  (attestation: ``all_gather`` and ``all_reduce`` of a few int64 tensors), or ``None`` with one rank.
- ``parts()``: the services it is made of, outermost first (itself for a simple service); the
  plan parameters of each are bound into states.
- ``checkpointable``: ``True`` when it has a state of its own (``checkpoint()``/``restore()``,
  torchdata 0.9's ``CheckpointableReadingServiceInterface``).
- ``skipped()``, ``flows()``: counters of what the stages it runs skipped and dropped, or ``None``.

Seeding is the service's job in ``initialize_iteration``: it is handed the epoch's
:class:`~shardpipes.plan.epoch.EpochPlan` and gives each reader ``plan.spawn(rank)`` (when
``topology().distributed``) and then ``.spawn(worker)`` (when ``readers_per_rank > 0``), applied to
the reader's graph with :func:`shardpipes.dataloader2.graph.apply_epoch_plan`; the graph's
``sharding_filter``/``sharding_by_index`` gets ``apply_sharding`` with the reader's rank and worker.
A resumed epoch's plan carries where every reader continues, so a service that does this gets
exact and elastic resume with nothing more. A service whose readers yield in turn (reader 0,
1, ... of a rank, each leaving the rotation when it runs out) is one the resume maths describes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.restore import NUMBERINGS, Topology

__all__ = ["NUMBERINGS", "Collectives", "EpochPlan", "ReadingService", "Topology"]


@dataclass(frozen=True)
class Collectives:
    """Where the loader's checks run: a ``torch.distributed`` process group (gloo: CPU tensors).

    ``group`` ``None`` is the default group. ``timeout``: seconds to wait for the other ranks.
    """

    group: Any = None
    timeout: float = 1800.0


@runtime_checkable
class ReadingService(Protocol):
    """Every method ``DataLoader2`` calls on a reading service (the structural protocol)."""

    checkpointable: bool

    def initialize(self, datapipe: Any) -> Any:
        """Prepare the graph once; return the graph the loader iterates."""

    def initialize_iteration(self, seed_generator: Any, iter_reset_fn: Any = None) -> Any:
        """Seed the readers with the epoch's plan; return it for the next service."""

    def finalize_iteration(self) -> None:
        """Clean up after an epoch (ended, left or failed)."""

    def finalize(self) -> None:
        """Release everything; called once by ``DataLoader2.shutdown``."""

    def topology(self) -> Topology:
        """Ranks, readers per rank and their numbering."""

    def share_seed(self, seed: int) -> int:
        """The seed every rank uses for an epoch whose seed each rank drew."""

    def collectives(self) -> Collectives | None:
        """Where the loader's checks across ranks run; ``None`` with one rank."""

    def parts(self) -> tuple[Any, ...]:
        """The services this one is made of, outermost first."""

    def skipped(self) -> Any:
        """What its stages skipped so far (``SkipStats``), or ``None``."""

    def flows(self) -> Any:
        """Totals of its dropping stages and its graph's source, or ``None``."""
