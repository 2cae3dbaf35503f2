"""A ``DataLoader2`` as a PyTorch Lightning training loader whose checkpoints resume exactly.

Lightning saves the state of a training loader that has ``state_dict``/``load_state_dict`` in
its checkpoints and gives it back on ``fit(ckpt_path=...)``. But it fetches a batch *ahead* of
the step it runs (to know whether the epoch is over), so at a checkpoint the loader's own
state is one batch past the last step, and a run resumed from it skips that batch without an
error. And Lightning writes the checkpoint of rank 0 only, while a loader state is refused on
another rank than the one that saved it.

:class:`LightningLoader` wraps the loader: it remembers the state after each batch it hands
out, and :meth:`LightningLoader.step` (called from the data module's or the model's
``on_before_batch_transfer`` while training, the hook a batch passes when a step takes it)
marks that batch used, so :meth:`LightningLoader.state_dict` is the state after the last batch
a step used. Under ``torch.distributed`` it gathers every rank's state into the one checkpoint,
and each rank takes its own back (any rank's state when the number of ranks changed: the
loader's elastic resume then redistributes the rest of the epoch).

It imports nothing from Lightning: the wrapper is what Lightning sees as the loader.

A ``DataLoader2`` handed to Lightning as it is does the same by itself (its ``len()`` where it
knows one; otherwise it finds Lightning's fetcher and how many batches it holds ahead:
``dataloader2/_consumers.py``). This wrapper stays for code that marks the steps explicitly.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch.distributed as dist

from shardpipes.dataloader2.dataloader2 import DataLoader2

__all__ = ["LightningLoader"]

T = TypeVar("T")


class LightningLoader(Generic[T]):
    """The loader as Lightning sees it; its state is that of the batches the steps used.

    Args:
        loader: The ``DataLoader2`` (seeded, with its reading service).

    Example (a ``LightningDataModule``)::

        def train_dataloader(self):
            self.batches = LightningLoader(DataLoader2(graph, reading_service=service))
            return self.batches

        def on_before_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training:
                self.batches.step()  # a step takes this batch
            return batch
    """

    def __init__(self, loader: DataLoader2[T]) -> None:
        self.loader = loader
        self._ahead: collections.deque[dict[str, Any]] = collections.deque()
        self._used: dict[str, Any] | None = None  # the state after the last batch a step used
        self._fetched = 0  # batches handed out since the last load or the start
        self._steps = 0  # of which step() marked used

    def __iter__(self) -> Iterator[T]:
        if self._used is None:  # before the first batch: where this epoch starts
            self._used = self.loader.state_dict()
        for batch in self.loader:
            self._ahead.append(self.loader.state_dict())
            self._fetched += 1
            yield batch
        end = self.loader.state_dict()  # the same position, as the start of the next epoch
        if self._ahead:
            self._ahead[-1] = end
        else:
            self._used = end

    def __len__(self) -> int:
        return len(self.loader)

    def step(self) -> None:
        """A training step takes the oldest batch handed out and not yet taken."""
        if not self._ahead:
            raise RuntimeError(
                "LightningLoader.step() with no batch handed out: call it once per batch a "
                "training step takes (in on_before_batch_transfer while trainer.training)"
            )
        self._used = self._ahead.popleft()
        self._steps += 1
        if self.loader.telemetry is not None:
            self.loader.telemetry.step()  # where a step begins: its wait share (docs/telemetry.md)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch a step used (every rank's, when distributed)."""
        if self._fetched > 1 and not self._steps:
            raise RuntimeError(
                f"LightningLoader handed out {self._fetched} batches and step() marked none "
                "used, so it cannot tell which batch the checkpoint follows (Lightning fetches "
                "one ahead): call self.batches.step() in on_before_batch_transfer while "
                "trainer.training"
            )
        state = self.loader.state_dict() if self._used is None else self._used
        if not (dist.is_available() and dist.is_initialized()):
            return state
        ranks: list[Any] = [None] * dist.get_world_size()  # Lightning writes rank 0's only
        dist.all_gather_object(ranks, state)
        return {"ranks": ranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's state (any rank's, when the number of ranks changed)."""
        if "ranks" in state:
            ranks = state["ranks"]
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            state = ranks[rank % len(ranks)]
        self.loader.load_state_dict(state)
        self._ahead.clear()
        self._used = None
        self._fetched = self._steps = 0

    def shutdown(self) -> None:
        """Shut the loader down (its worker processes end here, not at exit)."""
        self.loader.shutdown()
