"""What the loop that consumes a ``DataLoader2`` needs: the epoch's length, and where it really is.

Two things a training loop (PyTorch Lightning's, above all) asks of a loader:

- ``len(dl)``: the items this rank yields in an epoch, when the loader knows it exactly
  (:func:`loader_length`). Python's protocol for "no length" is a ``TypeError``.
- the state to checkpoint. Lightning fetches one batch *ahead* of the step it runs whenever the
  loader has no length (``lightning/pytorch/loops/fetchers.py``, ``_PrefetchDataFetcher``), so
  at a checkpoint the loader has handed out one batch more than the steps took, and the
  loader's own state resumes one batch late. :class:`Consumer` finds that fetcher when an epoch
  starts, keeps the state after each of the last few batches it handed out, and answers a
  state request with the state after the last batch the fetcher passed on to a step. Lightning
  writes the checkpoint of rank 0 only, so when Lightning's checkpoint code asks under
  ``torch.distributed``, every rank's state goes into the one checkpoint
  (``{"ranks": [...]}``) and :func:`own_state` takes this rank's back.

Nothing here imports Lightning: the fetcher is recognised by its module's name and read
through two of its attributes (``batches``, the list of batches fetched ahead).
"""

from __future__ import annotations

import collections
import copy
import sys
import warnings
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import describe
from shardpipes.datapipes.iter._index_length import exact_length_plan
from shardpipes.errors import ShardpipesWarning
from shardpipes.plan.readers import batches, per_reader, reader_count

__all__ = ["Consumer", "length", "lightning_probe", "loader_length", "own_state"]

#: The modules of Lightning's data fetchers (the 2.x package and the older standalone one).
_FETCHERS = ("lightning.pytorch.loops.fetchers", "pytorch_lightning.loops.fetchers")
#: Where Lightning asks the loaders of a combined loader for their states at a checkpoint.
_CHECKPOINT = (
    "lightning.pytorch.utilities.combined_loader",
    "pytorch_lightning.utilities.combined_loader",
)
#: Where Lightning calls ``iter()`` on a loader only to see that it can.
_PROBE = (
    "lightning.pytorch.trainer.connectors.data_connector",
    "pytorch_lightning.trainer.connectors.data_connector",
)
_LIGHTNING = ("lightning.", "pytorch_lightning.")
_DEPTH = 16  # frames between DataLoader2.__iter__ (or state_dict) and Lightning's fetcher


def length(dl: Any) -> int:
    """``len(dl)`` of a ``DataLoader2``: :func:`loader_length` under its service's topology, once an epoch."""
    if dl._length is None or dl._length[0] != dl._epochs_run:
        t = dl.reading_service.topology()
        n = loader_length(dl.datapipe, dl._graph, t.ranks, t.readers_per_rank, t.distributed)
        dl._length = (dl._epochs_run, n)
    return int(dl._length[1])


def loader_length(
    datapipe: IterDataPipe[Any] | None,
    running: IterDataPipe[Any] | None,
    world: int,
    workers: int,
    distributed: bool,
) -> int:
    """Items this rank yields in one (whole) epoch, when that is known exactly.

    ``datapipe`` is the user's graph, ``running`` the loader's copy once it runs (or ``None``).

    Known for a graph that reads with ``sharding_by_index`` followed by one-to-one stages and at
    most one ``batch()`` (every reader gets the same number of samples: the index says how
    many, under ``drop`` or ``pad``), with any number of ranks and workers; and for a graph
    with a length (torch's ``len()``) read in this process alone.

    Raises:
        TypeError: The length is not known, saying why (Python's "no length").
    """
    if datapipe is None:
        raise TypeError("DataLoader2 instance doesn't have valid length: it has no graph yet")
    plan = exact_length_plan(datapipe)
    if plan is not None:
        # The running graph's sharder first: it holds the index the ranks shared (rank 0 read
        # the descriptor once for the job), so a length costs no read of its own.
        sharders = [
            dp
            for graph in ((running, datapipe) if running is not None else (datapipe,))
            for dp in describe(graph).index_sharders()
        ][:1]
        if sharders:
            sharder = sharders[0]
            readers = reader_count(world if distributed else 1, workers)
            samples = per_reader(sharder.epoch_samples(), readers, sharder.policy)
            return max(workers, 1) * batches(samples, *plan)
    if workers or distributed:
        raise TypeError(
            "DataLoader2 instance doesn't have valid length: with worker processes or ranks "
            "only a graph read with sharding_by_index (a shard index) followed by one-to-one "
            "stages and at most one batch() has an exact length"
        )
    try:
        return len(datapipe)
    except TypeError as exc:
        raise TypeError(f"DataLoader2 instance doesn't have valid length: {exc}") from None


def _lightning_caller(modules: tuple[str, ...]) -> tuple[bool, Any]:
    """Whether Lightning's code in ``modules`` called the loader method that calls this, directly.

    Walks up from that method's caller through Lightning's own frames only: a wrapper between
    Lightning and the loader (``shardpipes.lightning.LightningLoader``, which keeps the state of
    the steps' batches itself) makes it not Lightning's call. Also returns the ``self`` of the
    first frame in ``modules`` that has one (the fetcher).
    """
    # this <- Consumer.find/state <- DataLoader2.__iter__/state_dict
    frame: FrameType | None = sys._getframe(3)
    found = False
    for _ in range(_DEPTH):
        if frame is None:
            break
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_LIGHTNING):
            break
        if name in modules:
            found = True
            owner = frame.f_locals.get("self")  # None in a comprehension's own frame
            if owner is not None:
                return True, owner
        frame = frame.f_back
    return found, None


def lightning_probe() -> bool:
    """Whether Lightning calls ``iter()`` only to check that the loader is iterable.

    Lightning does so once before fitting (``_check_dataloader_iterable``) and drops the
    iterator; the loader answers without starting an epoch, so that Lightning's first epoch is
    the loader's first (the plan of ``(seed, 0)``), as in a plain loop.
    """
    return _lightning_caller(_PROBE)[0]


class AheadWarning(ShardpipesWarning):
    """A loop fetches batches ahead of its steps and the loader cannot tell how many."""


class Consumer:
    """Lightning's fetcher iterating this epoch, and the states after its last few batches.

    Made by :meth:`find` when an epoch starts; ``None`` when the loop is not Lightning's.
    """

    def __init__(self, fetcher: Any, start: dict[str, Any]) -> None:
        self._fetcher = weakref.ref(fetcher)
        # The state before the epoch's first batch, then after each batch handed out.
        self._states: collections.deque[dict[str, Any]] = collections.deque([start], maxlen=8)
        self._warned = False

    @classmethod
    def find(cls, state: Callable[[], dict[str, Any]]) -> Consumer | None:
        """The consumer of the epoch starting now (call from ``DataLoader2.__iter__``).

        Args:
            state: The loader's own state now (called only when the consumer is Lightning's).
        """
        fetcher = _lightning_caller(_FETCHERS)[1]
        return None if fetcher is None else cls(fetcher, state())

    def handed_out(self, state: dict[str, Any]) -> None:
        """Note the loader's state after a batch it handed out."""
        self._states.append(state)

    def _ahead(self) -> int | None:
        fetcher = self._fetcher()
        found = getattr(fetcher, "batches", None) if fetcher is not None else []
        return len(found) if isinstance(found, list) else None

    def state(self, current: dict[str, Any]) -> dict[str, Any]:
        """The state after the last batch the consumer passed on (every rank's at a checkpoint)."""
        ahead = self._ahead()
        if ahead is None:
            ahead = 0
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "Lightning's data fetcher has changed and shardpipes cannot tell how many "
                    "batches it fetched ahead of the step, so the checkpoint may resume late; "
                    "wrap the loader in shardpipes.lightning.LightningLoader",
                    AheadWarning,
                    stacklevel=3,
                )
        # A batch still ahead belongs to this epoch (the fetcher fetches none past its end).
        state = self._states[max(len(self._states) - 1 - ahead, 0)] if ahead else current
        if _lightning_caller(_CHECKPOINT)[0] and dist.is_available() and dist.is_initialized():
            # Lightning asks on every rank and writes rank 0's checkpoint only.
            ranks: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, state)
            return {"ranks": ranks}
        return state


def own_state(state: dict[str, Any]) -> dict[str, Any]:
    """This rank's state of a checkpoint holding every rank's (any rank's when their number changed)."""
    if "ranks" not in state:
        return state
    ranks = state["ranks"]
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return copy.copy(ranks[rank % len(ranks)])
