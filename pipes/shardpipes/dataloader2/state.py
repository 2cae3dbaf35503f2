"""The loader's state as a typed value: what ``DataLoader2.state_dict()`` returns, and reads back.

:class:`LoaderState` is frozen; ``to_dict()`` is the dict ``state_dict()`` returns (small,
JSON-compatible unless the pickled graph is in it) and ``from_dict()`` reads it back, including
the states earlier releases wrote (version 1, and version 2 without the keys added since).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardpipes.plan.restore import Position, Topology
from shardpipes.plan.resume import Segment

__all__ = [
    "RANDOMNESS_STATE_KEY_NAME",
    "READING_SERVICE_STATE_KEY_NAME",
    "SERIALIZED_DATAPIPE_KEY_NAME",
    "STATE_FORMAT",
    "STATE_VERSION",
    "LoaderState",
    "is_torchdata09_state",
]

STATE_FORMAT = "shardpipes-loader-state"
STATE_VERSION = 2
_REQUIRED = ("format", "version", "seed", "epoch", "consumed", "world_size", "num_workers")
#: torchdata 0.9's keys, also in our state: the pickled graph (after the adapters, before the
#: reading service) and a checkpointable reading service's own state.
SERIALIZED_DATAPIPE_KEY_NAME = "serialized_datapipe"
READING_SERVICE_STATE_KEY_NAME = "reading_service_state"
#: 0.9's key of the seed generator's state; ours keeps the seed and epoch under "seed"/"epoch".
RANDOMNESS_STATE_KEY_NAME = "randomness_state"
BINDING_KEY = "binding"


def is_torchdata09_state(state: Mapping[str, Any]) -> bool:
    """A state of torchdata 0.9's ``DataLoader2``: it brings only the graph."""
    return "format" not in state and SERIALIZED_DATAPIPE_KEY_NAME in state


@dataclass(frozen=True)
class LoaderState:
    """A loader's position, the same on every rank (see ``DataLoader2.state_dict``).

    ``distributed`` is ``None`` in states of version 1, which did not record it (the loader
    then takes its own). ``binding`` is what the state is bound to (``_binding.py``);
    ``mixture`` the mixture's sources (``graph/mixing.py``).
    """

    seed: int | None
    epoch: int
    consumed: int
    world_size: int
    num_workers: int
    seeded: bool = True
    distributed: bool | None = None
    segments: tuple[Segment, ...] = ()
    skipped: int = 0
    epochs_run: int | None = None
    mixture: Any = None
    binding: Mapping[str, Any] | None = None
    serialized_datapipe: bytes | None = None
    reading_service_state: Any = None
    version: int = STATE_VERSION
    #: Keys a version-1 state lacked; ``to_dict`` leaves them out again.
    absent: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Read a state of this or an earlier shardpipes.

        Raises:
            KeyError: A key every version has is missing, naming it.
            ValueError: The state is of another format or a version this code does not read.
        """
        missing = [k for k in _REQUIRED if k not in state]
        if missing:
            raise KeyError(f"loader state is missing {', '.join(missing)}")
        if state["format"] != STATE_FORMAT or state["version"] not in (1, STATE_VERSION):
            raise ValueError(
                f"loader state is {state['format']!r} version {state['version']}; this shardpipes "
                f"reads {STATE_FORMAT!r} versions 1 and {STATE_VERSION}"
            )
        optional = (
            "seeded",
            "distributed",
            "segments",
            "skipped",
            "epochs_run",
            "mixture",
            BINDING_KEY,
            SERIALIZED_DATAPIPE_KEY_NAME,
            READING_SERVICE_STATE_KEY_NAME,
        )
        seed = state["seed"]
        return cls(
            seed=None if seed is None else int(seed),
            epoch=int(state["epoch"]),
            consumed=int(state["consumed"]),
            world_size=int(state["world_size"]),
            num_workers=int(state["num_workers"]),
            seeded=bool(state.get("seeded", True)),
            distributed=None if state.get("distributed") is None else bool(state["distributed"]),
            segments=tuple(Segment.from_list(s) for s in state.get("segments") or ()),
            skipped=int(state.get("skipped", 0)),
            epochs_run=None if state.get("epochs_run") is None else int(state["epochs_run"]),
            mixture=state.get("mixture"),
            binding=state.get(BINDING_KEY),
            serialized_datapipe=state.get(SERIALIZED_DATAPIPE_KEY_NAME),
            reading_service_state=state.get(READING_SERVICE_STATE_KEY_NAME),
            version=int(state["version"]),
            absent=frozenset(k for k in optional if k not in state),
        )

    def to_dict(self) -> dict[str, Any]:
        """The dict form, as ``state_dict()`` returns it (keys in the order it always had)."""
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": self.version,
            "seed": self.seed,
            "seeded": self.seeded,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "distributed": self.distributed,
            "segments": [seg.as_list() for seg in self.segments],
            "skipped": self.skipped,
            "epochs_run": self.epochs_run,
            "mixture": self.mixture,
            BINDING_KEY: None if self.binding is None else dict(self.binding),
            SERIALIZED_DATAPIPE_KEY_NAME: self.serialized_datapipe,
            READING_SERVICE_STATE_KEY_NAME: self.reading_service_state,
        }
        for key in self.absent:
            out.pop(key, None)
        return out

    def position(self) -> Position:
        """The saved position, for :func:`shardpipes.plan.restore.restore`."""
        return Position(
            seed=self.seed,
            seeded=self.seeded,
            epoch=self.epoch,
            consumed=self.consumed,
            segments=self.segments,
            skipped=self.skipped,
            epochs_run=self.epoch if self.epochs_run is None else self.epochs_run,
        )

    def topology(self, default_distributed: bool) -> Topology:
        """The topology the state was saved on (``distributed`` from the loader's for version 1)."""
        distributed = default_distributed if self.distributed is None else self.distributed
        return Topology(self.world_size, self.num_workers, distributed)
