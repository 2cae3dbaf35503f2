"""The two kinds of Ray actor: a reader, which makes logical readers' items, and the pool, which knows the readers.

Plain classes: :mod:`shardpipes.raypool.service` turns them into Ray actors (``ray.remote``) when
Ray is installed, so this module imports Ray only inside the pool's methods, which run in an
actor. Readers are detached named actors: they outlive the pool actor, whose state (the
members, the target size) the trainers rebuild when it restarts (:meth:`PoolActor.adopt`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from shardpipes.plan.epoch import EpochPlan
from shardpipes.raypool.reader import (
    Bundle,
    InitFn,
    ResetFn,
    TelemetryOn,
    logical_reader,
    reader_bundles,
)

__all__ = ["NAMESPACE", "PoolActor", "ReaderActor"]

logger = logging.getLogger(__name__)

#: The Ray namespace of the pool and its readers (named actors are found by name in it).
NAMESPACE = "shardpipes"


class ReaderActor:
    """Makes the items of logical readers under leases; several at once (a threaded actor)."""

    def ping(self) -> str:
        """Answer (a liveness check)."""
        return "ok"

    def run(
        self,
        graph: Any,
        plan: EpochPlan,
        reader: int,
        num_readers: int,
        world_size: int,
        after: int,
        fence: int,
        bundle: int,
        replay: bool,
        hooks: tuple[InitFn | None, ResetFn | None] = (None, None),
        telemetry: TelemetryOn | None = None,
    ) -> Iterator[Bundle]:
        """Logical ``reader``'s items from its item ``after`` on, in bundles (a streaming generator).

        ``hooks``: the service's ``(worker_init_fn, worker_reset_fn)``, run for this reader.
        ``telemetry``: when on, the lease's figures travel with its bundles, as a worker's do.
        Ray runs the generator in one thread of the actor, which the figures measure.
        """
        items, found = logical_reader(
            graph,
            plan,
            reader,
            num_readers,
            world_size=world_size,
            after=after,
            replay=replay,
            init_fn=hooks[0],
            reset_fn=hooks[1],
            telemetry=telemetry,
        )
        reporter = found.reporter
        try:
            yield from reader_bundles(
                items,
                reader,
                fence,
                after,
                bundle,
                found.counters,
                flows=found.flows,
                report=reporter.report if reporter is not None else None,
            )
        finally:  # also when the trainer cancels the lease: its sampler thread ends with it
            found.close()


class PoolActor:
    """Membership of the reader pool: who is in it, who is leaving, and the size it should have.

    The trainers hold the truth about the leases; the pool holds only names. Readers leaving
    (:meth:`scale` down) are killed once every trainer said it moved its leases off them
    (:meth:`drained`).
    """

    def __init__(self, name: str, reader_options: dict[str, Any]) -> None:
        import ray

        self.name = name
        self.reader_options = reader_options
        self.members: list[str] = []
        self.leaving: set[str] = set()
        self.trainers: set[str] = set()
        self.drained_by: dict[str, set[str]] = {}
        self.next_id = 0
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if self.restarted:  # the readers outlived the pool: find them by their names
            prefix = f"{name}-reader-"
            found = [
                a["name"]
                for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)
            ]
            self.members = sorted(found, key=lambda n: int(n.rsplit("-", 1)[1]))
            self.next_id = max((int(n.rsplit("-", 1)[1]) + 1 for n in found), default=0)

    def hello(self, trainer: str) -> None:
        """A trainer uses the pool."""
        self.trainers.add(trainer)

    def state(self) -> tuple[list[str], list[str], bool]:
        """``(active members, leaving members, restarted and not yet rebuilt)``."""
        active = [m for m in self.members if m not in self.leaving]
        return active, sorted(self.leaving), self.restarted

    def adopt(self, names: list[str], trainer: str) -> None:
        """Rebuild the membership after a restart from what a trainer knows (live readers only)."""
        import ray

        self.trainers.add(trainer)
        for name in names:
            if name in self.members:
                continue
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                continue  # gone
            self.members.append(name)
            self.next_id = max(self.next_id, int(name.rsplit("-", 1)[1]) + 1)
        self.restarted = False

    def scale(self, n: int) -> list[str]:
        """Make the pool ``n`` readers: start new ones, or mark the newest as leaving."""
        import ray

        if n < 1:
            raise ValueError(f"a reader pool needs at least 1 reader, got {n}")
        active = [m for m in self.members if m not in self.leaving]
        remote = ray.remote(ReaderActor)
        while len(active) < n:
            name = f"{self.name}-reader-{self.next_id}"
            self.next_id += 1
            remote.options(
                name=name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                **self.reader_options,
            ).remote()
            self.members.append(name)
            active.append(name)
        for name in active[n:]:
            self.leaving.add(name)
            self._maybe_kill(name)
        return active[:n]

    def dead(self, name: str) -> None:
        """A trainer saw ``name`` die: drop it (the trainers re-lease its readers)."""
        if name in self.members:
            self.members.remove(name)
        self.leaving.discard(name)

    def drained(self, name: str, trainer: str) -> None:
        """``trainer`` holds no lease on ``name`` any more; kill it once every trainer said so."""
        self.drained_by.setdefault(name, set()).add(trainer)
        self._maybe_kill(name)

    def _maybe_kill(self, name: str) -> None:
        if name in self.leaving and self.drained_by.get(name, set()) >= self.trainers:
            self._kill(name)
            self.leaving.discard(name)
            self.members.remove(name)

    def _kill(self, name: str) -> None:
        import ray

        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            pass  # already gone

    def bye(self, trainer: str) -> bool:
        """``trainer`` is done; the last one out kills the readers. Return whether it was the last."""
        self.trainers.discard(trainer)
        for drained in self.drained_by.values():
            drained.discard(trainer)
        if self.trainers:
            for name in list(self.leaving):
                self._maybe_kill(name)
            return False
        for name in self.members:
            self._kill(name)
        self.members, self.leaving = [], set()
        return True
