"""What runs inside worker processes, and the stage that reads from the pool.

The pool is torchdata's ``StatefulDataLoader`` (docs/worker-pool.md says why):
it owns process start-up, prefetching, in-order round-robin across workers, worker-death
detection, pinning and per-worker state. We give it a plain ``IterableDataset`` (not an
``IterDataPipe``, so torch applies none of its own DataPipe sharding or seeding) that applies
ours: multiprocessing-priority sharding once per worker, and per-epoch seeds read from a small
shared-memory tensor that the main process writes before each epoch (workers persist across
epochs, so this is how a new seed reaches them). A batch's tensors and large ``bytes`` values
and arrays travel through each worker's ring of shared-memory blocks (``ring.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, IterDataPipe, get_worker_info
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes.dataloader2._stats import (
    FetchChanges,
    flow_stages,
    flows_to_list,
    merge_skips,
    read_flows,
    skip_counters,
    skips_to_dict,
)
from shardpipes.dataloader2.graph import apply_epoch_plan
from shardpipes.dataloader2.random.seed_generator import SeedGenerator
from shardpipes.dataloader2.telemetry.reporter import WorkerReporter
from shardpipes.dataloader2.utils.dispatch import shard_for_worker
from shardpipes.dataloader2.utils.worker import WorkerInfo, seed_global_rngs
from shardpipes.dataloader2.workers.blocks import Handle
from shardpipes.dataloader2.workers.bundles import bundles
from shardpipes.dataloader2.workers.graph_copy import copy_graph
from shardpipes.dataloader2.workers.ring import Ring
from shardpipes.formats.placed import SupportsPlacedOutput
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Segment

__all__ = ["EpochSlot", "WorkerDataset"]

# Slots of the shared epoch tensor: seed, epoch, the spawn path's length, the path (rank, ...),
# then the number of stretches of a resumed epoch and the stretches (4 numbers each).
_MAX_PATH = 4
_MAX_SEGMENTS = 8


class EpochSlot:
    """A shared-memory record of the current epoch's seed generator, read by the workers.

    With it, :attr:`bundle`: how many items a worker sends per message (``bundles.py``), set by
    the main process and read by the workers before each message.
    """

    def __init__(self) -> None:
        self.tensor = torch.zeros(4 + _MAX_PATH + 4 * _MAX_SEGMENTS, dtype=torch.int64)
        self.tensor.share_memory_()  # type: ignore[no-untyped-call]
        self._bundle = torch.ones(1, dtype=torch.int64)
        self._bundle.share_memory_()  # type: ignore[no-untyped-call]

    @property
    def bundle(self) -> np.ndarray:
        """The shared bundle size, as a one-element array (reading a tensor costs more)."""
        return self._bundle.numpy()

    def write(self, gen: EpochPlan) -> None:
        """Publish ``gen`` (called in the main process before each epoch)."""
        if len(gen.path) > _MAX_PATH:
            raise ValueError(f"seed path {gen.path} is deeper than {_MAX_PATH}")
        if len(gen.resume) > _MAX_SEGMENTS:
            raise ValueError(
                f"the epoch was resumed with another topology {len(gen.resume) - 1} times; at most "
                f"{_MAX_SEGMENTS - 1} are supported within one epoch"
            )
        path = [*gen.path, *[0] * (_MAX_PATH - len(gen.path))]
        segments = [v for seg in gen.resume for v in seg.as_list()]
        values = [gen.seed, gen.epoch, len(gen.path), *path, len(gen.resume), *segments]
        self.tensor[: len(values)] = torch.tensor(values, dtype=torch.int64)

    def read(self) -> EpochPlan:
        """Return the published generator (called in a worker at the start of each epoch)."""
        values = [int(v) for v in self.tensor.tolist()]
        seed, epoch, depth = values[:3]
        path = tuple(values[3 : 3 + depth])
        count = values[3 + _MAX_PATH]
        at = 4 + _MAX_PATH
        resume = tuple(Segment.from_list(values[at + 4 * i : at + 4 * i + 4]) for i in range(count))
        return EpochPlan(seed, epoch, path, resume)


def _tune_malloc() -> None:
    """Keep freed memory in this worker's heap instead of returning it to the system at once.

    glibc serves allocations above a (dynamic) threshold with ``mmap`` and trims the heap
    eagerly; with 100 KB samples a worker then spends much of its time faulting fresh pages in
    (measured on the large benchmark preset: 1 worker 7.2k -> 11-13k samples/s). Only worker
    processes, which shardpipes owns, are tuned. Elsewhere than glibc this does nothing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # the largest glibc accepts on 64-bit
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)  # at most 64 MiB kept beyond what is used
    except (OSError, AttributeError):
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h


class WorkerDataset(IterableDataset[Any]):
    """The dataset each worker iterates: its own copy of the graph, sharded and seeded."""

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        slot: EpochSlot,
        user_init: Callable[[IterDataPipe[Any], Any], IterDataPipe[Any]] | None,
        shm_blocks: list[list[Handle]] | None = None,
        shm_owner: str = "",
        user_reset: Callable[[IterDataPipe[Any], Any, Any], IterDataPipe[Any]] | None = None,
        shm_tensors: bool = True,
        telemetry: tuple[float | None, float] | None = None,
    ) -> None:
        self.datapipe = datapipe
        self.slot = slot
        self.user_init = user_init
        self.user_reset = user_reset
        # each worker's shared-memory blocks (Attachments.make); None: pickle everything
        self.shm_blocks = shm_blocks
        self._owner = shm_owner  # the loader the blocks belong to
        self.shm_tensors = shm_tensors  # False: tensors go through torch's queues (to be pinned)
        self._ring: Ring | None = None
        self._sharded = False
        self._counters: list[Any] = []
        self._flows: list[Any] = []
        self.telemetry = telemetry  # on: (stack-sample interval or None, budget); off: None
        self._reporter: WorkerReporter | None = None

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if not self._sharded:
            # Under 'fork' the graph object is shared copy-on-write; shard a private copy.
            sharded = shard_for_worker(copy_graph(self.datapipe), num_workers, worker)
            if not isinstance(sharded, IterDataPipe):
                raise TypeError(f"expected an IterDataPipe graph, got {type(sharded).__name__}")
            self.datapipe = sharded
            if self.user_init is not None:
                self.datapipe = self.user_init(self.datapipe, WorkerInfo(num_workers, worker))
            self._counters = skip_counters(self.datapipe)
            self._flows = flow_stages(self.datapipe)
            self._sharded = True
            if info is not None:
                _tune_malloc()
        gen = self.slot.read().spawn(worker)
        apply_epoch_plan(self.datapipe, gen)
        if info is not None:  # a worker process: its own random, numpy and torch, per epoch
            seed_global_rngs(gen.process_seeds())
        if self.user_reset is not None:
            self.datapipe = self.user_reset(
                self.datapipe, WorkerInfo(num_workers, worker), SeedGenerator.from_plan(gen)
            )
        if info is None:
            return iter(self.datapipe)
        if self.shm_blocks is not None and self._ring is None:
            for other, handles in enumerate(self.shm_blocks):
                if other != worker:  # another worker's blocks: this one lets go of them
                    for handle in handles:
                        handle.close()
            own = self.shm_blocks[worker]
            self._ring = Ring(own, self._owner, tensors=self.shm_tensors)
            # Large members no stage here reads are sent by where they lie in their shard,
            # and read once, by the main process (formats/placed.py): asked of each stage
            # that can make them so.
            for stage in _stages(self.datapipe):
                if isinstance(stage, SupportsPlacedOutput):
                    stage.enable_placed_output()
        if self.telemetry is not None and self._reporter is None:
            self._reporter = WorkerReporter(self.datapipe, *self.telemetry)
        # Several items per message, the epoch's drop totals with the last (bundles.py).
        return bundles(
            worker,
            iter(self.datapipe),
            self.slot.bundle,
            self._ring,
            self._skip_total,
            self._skip_state,
            self._epoch_end,
            self._reporter.report if self._reporter is not None else None,
            FetchChanges(),
        )

    def _skip_total(self) -> int:
        return sum(c.samples + c.shards for c in self._counters)

    def _skip_state(self) -> dict[str, Any]:
        return skips_to_dict(merge_skips(self._counters))

    def _epoch_end(self) -> list[list[Any]]:
        return flows_to_list(read_flows(self._flows))

    # The skip counters of the worker's copy of the graph reach the main process with the
    # bundles, made only when their sum moved (_skip_total, _skip_state). The counters were
    # found once (walking the graph per batch cost ~15% of a worker's time on small samples).
    # StatefulDataLoader, its per-item snapshots off, still asks for this at a worker's epoch end.
    def state_dict(self) -> dict[str, Any]:
        """Return this worker's skip counters."""
        return {"skipped": self._skip_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the loader resumes by replay, not from worker snapshots."""


def _stages(graph: IterDataPipe[Any]) -> list[Any]:
    """Every stage of ``graph`` (each once)."""
    return list(get_all_graph_pipes(traverse_dps(graph)))
