"""The loader's position out (a :class:`LoaderState`) and in (the restore, applied).

``take`` reads the loader's counters into the typed state. ``load`` is the restore: parse the
state, ask the reading service its topology, check what the state is bound to, call the pure
:func:`shardpipes.plan.restore.restore` with plain facts of the graph, and apply its decision
to the loader's next epoch (or raise with its refusal).
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2 import _binding
from shardpipes.dataloader2.graph import carries_across_epochs, resume_shape
from shardpipes.dataloader2.graph.mixing import check_mixture_state, mixture_state
from shardpipes.dataloader2.state import (
    READING_SERVICE_STATE_KEY_NAME,
    SERIALIZED_DATAPIPE_KEY_NAME,
    LoaderState,
    is_torchdata09_state,
)
from shardpipes.errors import StateMismatchError
from shardpipes.plan.restore import Decision, GraphFacts, Refusal, Topology, restore

__all__ = ["apply", "describe", "graph_facts", "load", "load_dict", "take"]

logger = logging.getLogger("shardpipes.dataloader2.dataloader2")


def describe(dl: Any) -> None:
    """Find what the loader's states are bound to: the data its index describes, the plan."""
    # The running graph once there is one: its sharders hold the index the reading service
    # shared (one read of the descriptor per job); else the user's graph (also when a 0.9
    # service's iter_reset_fn made the graph something else, or a service's graph does not
    # expose the stages it runs).
    graph = dl._graph if isinstance(dl._graph, IterDataPipe) else dl.datapipe
    data = _binding.describe_data(graph)
    if data is None and graph is not dl.datapipe:
        data = _binding.describe_data(dl.datapipe)
    dl._attest.data = data
    dl._attest.plan = _binding.describe_plan(dl.datapipe, dl.reading_service.parts())


def load_dict(dl: Any, state: dict[str, Any], on_change: str) -> None:
    """``DataLoader2.load_state_dict``: the graph and service state it brings, then the restore."""
    if state.get(SERIALIZED_DATAPIPE_KEY_NAME) is not None:
        if dl.datapipe is None:
            dl.datapipe = dl._adapt(pickle.loads(state[SERIALIZED_DATAPIPE_KEY_NAME]))
        dl._serialized = state[SERIALIZED_DATAPIPE_KEY_NAME]
    if READING_SERVICE_STATE_KEY_NAME in state:
        dl.reading_service_state = state[READING_SERVICE_STATE_KEY_NAME]
    if is_torchdata09_state(state):
        return  # torchdata 0.9's state: the graph only
    if dl.datapipe is None:
        raise ValueError(
            "this loader has no graph and the state does not carry one: take the state with "
            "state_dict(graph=True), or build the graph and pass it to DataLoader2"
        )
    load(dl, LoaderState.from_dict(state), on_change)


def take(dl: Any, skipped_now: int, serialized: bytes | None) -> LoaderState:
    """The loader's position now: in an epoch, between epochs, or restored and not yet run."""
    topology = dl.reading_service.topology()
    current = dl._current if dl._active is not None else None
    if current is not None:
        seed, seeded = dl._epoch_seed, dl._seeded_epoch
        epoch, consumed = current.epoch, dl._consumed
        earlier, skipped = current.resume[:-1], skipped_now - dl._skipped_at_start
    else:  # between epochs, or restored and not iterated yet (the pending position counts)
        if dl._pending is not None:
            (seed, epoch), seeded = dl._pending, False
        else:
            seed, epoch, seeded = dl._seed, dl._epoch, dl._seed is not None
        earlier, skipped = dl._resume_segments[:-1], 0
        consumed = dl._resume_segments[-1].consumed if dl._resume_segments else dl._skip
    dl._describe()
    rs = dl.reading_service
    return LoaderState(
        seed=seed,
        seeded=seeded,
        epoch=epoch,
        consumed=consumed,
        world_size=topology.ranks,
        num_workers=topology.readers_per_rank,
        distributed=topology.distributed,
        segments=tuple(earlier),
        skipped=skipped,
        epochs_run=dl._epochs_run - (1 if current is not None else 0),
        mixture=_mixture(dl),
        binding=dl._attest.binding(seed, epoch),
        serialized_datapipe=serialized,
        reading_service_state=rs.checkpoint() if rs.checkpointable else dl.reading_service_state,
    )


def _mixture(dl: Any) -> Any:
    # The running graph's (its mixers hold what the readers planned), else the user's: a
    # service's graph need not expose the stages it runs.
    found = mixture_state(dl._graph) if dl._graph is not None else None
    return found if found is not None else mixture_state(dl.datapipe)


def graph_facts(datapipe: Any) -> GraphFacts:
    """What the restore needs to know of the graph, as plain values."""
    shape = resume_shape(datapipe)
    return GraphFacts(shape if isinstance(shape, str) else None, carries_across_epochs(datapipe))


def load(dl: Any, state: LoaderState, on_change: str) -> None:
    """Decide how the loader continues ``state`` and set its next epoch so (or raise)."""
    check_mixture_state(dl.datapipe, state.mixture)
    topology = dl.reading_service.topology()
    change = _check_binding(dl, state, on_change, topology)
    old = state.topology(topology.distributed)
    found = restore(state.position(), graph_facts(dl.datapipe), old, topology, on_change=change)
    if isinstance(found, Refusal):
        raise ValueError(found.reason)
    binding = dict(state.binding or {})
    if change is not None and binding:
        binding["steps"] = binding.get("before", 0)
    apply(dl, found, binding)


def apply(dl: Any, decision: Decision, binding: dict[str, Any]) -> None:
    """Set the loader's next epoch as ``decision`` says."""
    dl._close_active()
    if decision.seed is None:  # between epochs of a loader without seed()
        dl._seed, dl._epoch, dl._pending = None, 0, None
    elif not decision.pending:
        dl._seed, dl._epoch, dl._pending = decision.seed, decision.epoch, None
    else:  # an epoch whose seed was drawn: replay it, then draw again
        dl._seed, dl._epoch = None, 0
        dl._pending = (decision.seed, decision.epoch)
    dl._skip, dl._resume_segments = decision.skip, decision.segments
    dl._epochs_run = decision.epochs_run
    dl._attest.restore(binding)


def _check_binding(
    dl: Any, state: LoaderState, on_change: str, topology: Topology
) -> Any:  # "restart_epoch" | "next_epoch" | None
    """Refuse a state bound to other data, plan or rank; say how to continue when allowed."""
    if on_change not in _binding.ON_CHANGE:
        raise ValueError(
            f"on_change {on_change!r} is not known; must be one of {', '.join(_binding.ON_CHANGE)}"
        )
    binding = state.binding
    if not binding:
        return None  # a state of an earlier shardpipes: not bound
    faults = _binding.position_faults(state.to_dict())
    if faults:
        raise StateMismatchError(
            "this loader state contradicts itself: " + "; ".join(faults), changes=tuple(faults)
        )
    rank, world = topology.rank, topology.ranks
    if binding.get("rank", rank) != rank and state.world_size == world:
        raise StateMismatchError(
            f"this loader state was saved by rank {binding['rank']} and is loaded on rank "
            f"{rank} of the same {world} ranks: each rank loads the state it saved (only "
            "when the job restarts with another number of ranks may a rank load any rank's)",
            changes=(f"rank {binding['rank']} -> {rank}",),
        )
    dl._describe()
    found = _binding.changes(dict(binding), dl._attest.data, dl._attest.plan)
    if not found:
        return None
    if on_change == "raise":
        raise StateMismatchError(
            "this loader state was taken with other data or another plan: "
            + "; ".join(found)
            + ". Resuming by position would yield the wrong samples; pass "
            "load_state_dict(state, on_change='restart_epoch' or 'next_epoch') to continue "
            "on the new data",
            changes=tuple(found),
        )
    logger.warning("loader state: %s; continuing with on_change=%r", "; ".join(found), on_change)
    return on_change
