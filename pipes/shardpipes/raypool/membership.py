"""The trainer's side of the reader pool: the pool actor, the reader actors it knows, who is in.

Ray is imported only when the pool is first used (:func:`import_ray`), so that a missing Ray
is an error naming the extra to install.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from shardpipes.raypool.actors import NAMESPACE, PoolActor

__all__ = ["PoolClient", "import_ray"]

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    """The ``ray`` module; an ``ImportError`` naming the extra when it is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("RayReadingService needs Ray: pip install 'shardpipes[ray]'") from exc
    return ray


class PoolClient:
    """One trainer's handle on the pool ``pool`` (made with ``readers`` reader actors if new).

    The pool actor is detached and restartable; a restarted one is rebuilt from the reader
    actors this trainer has used (:meth:`membership`).
    """

    def __init__(
        self, pool: str, readers: int, reader_options: dict[str, Any], timeout: float
    ) -> None:
        self.pool = pool
        self.readers = readers
        self.reader_options = reader_options
        self.timeout = timeout
        self.trainer = uuid.uuid4().hex[:12]
        self.known: set[str] = set()  # reader actors this trainer has used
        self._actor: Any = None

    def actor(self) -> Any:
        """The pool actor (found by its name, or made, with its first readers)."""
        ray = import_ray()
        if self._actor is None:
            self._actor = (
                ray.remote(PoolActor)
                .options(
                    name=f"{self.pool}-pool",
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    max_restarts=-1,
                    max_task_retries=-1,
                    num_cpus=0,
                )
                .remote(self.pool, self.reader_options)
            )
            ray.get(self._actor.hello.remote(self.trainer))
            active, _, _ = ray.get(self._actor.state.remote())
            if not active:
                ray.get(self._actor.scale.remote(self.readers))
        return self._actor

    def membership(self) -> tuple[list[str], set[str]]:
        """``(active, leaving)``; rebuilds a restarted pool from what this trainer knows."""
        ray = import_ray()
        pool = self.actor()
        active, leaving, restarted = ray.get(pool.state.remote(), timeout=self.timeout)
        if restarted or not active:
            ray.get(pool.adopt.remote(sorted(self.known), self.trainer))
            active, leaving, _ = ray.get(pool.state.remote(), timeout=self.timeout)
        if not active:
            active = ray.get(pool.scale.remote(self.readers))
        return list(active), set(leaving)

    def handle(self, name: str) -> Any:
        """The reader actor ``name`` (remembered, to rebuild a restarted pool)."""
        self.known.add(name)
        return import_ray().get_actor(name, namespace=NAMESPACE)

    def scale(self, readers: int) -> list[str]:
        """Make the pool ``readers`` actors; return the active names."""
        names: list[str] = import_ray().get(self.actor().scale.remote(readers))
        return names

    def bye(self) -> None:
        """This trainer is done with the pool (the last one out stops the readers)."""
        if self._actor is None:
            return
        try:
            import_ray().get(self._actor.bye.remote(self.trainer), timeout=self.timeout)
        except Exception as exc:  # the pool may be gone with its cluster
            logger.warning("reader pool %s: bye failed: %s", self.pool, exc)
        self._actor = None
