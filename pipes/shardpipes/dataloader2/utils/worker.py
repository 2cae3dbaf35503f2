"""torchdata 0.9's worker helpers: ``WorkerInfo``, ``process_init_fn``, ``process_reset_fn``.

``MultiProcessingReadingService`` calls ``worker_init_fn(datapipe, worker_info)`` once per
worker and ``worker_reset_fn(datapipe, worker_info, seed_generator)`` before each epoch, with a
:class:`WorkerInfo`. It is an ``int`` equal to the worker id (what shardpipes passed before)
that also has 0.9's ``worker_id`` and ``num_workers``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.graph import DataPipe, traverse_dps
from torch.utils.data.graph_settings import apply_sharding

from shardpipes.dataloader2.graph.settings import set_datapipes_seed, set_graph_random_seed
from shardpipes.dataloader2.graph.utils import list_dps
from shardpipes.dataloader2.random.seed_generator import SeedGenerator

__all__ = ["WorkerInfo", "process_init_fn", "process_reset_fn", "seed_global_rngs"]


class WorkerInfo(int):
    """The worker id (as an ``int``) with ``worker_id`` and ``num_workers`` attributes.

    Args:
        num_workers: Worker processes of the reading service.
        worker_id: This worker's number.
    """

    num_workers: int
    worker_id: int

    def __new__(cls, num_workers: int, worker_id: int) -> WorkerInfo:  # noqa: D102
        info = super().__new__(cls, worker_id)
        info.num_workers = num_workers
        info.worker_id = worker_id
        return info

    def __getnewargs__(self) -> tuple[int, int]:  # type: ignore[override]
        return self.num_workers, self.worker_id

    def __repr__(self) -> str:
        return f"WorkerInfo(num_workers={self.num_workers}, worker_id={self.worker_id})"


def seed_global_rngs(seeds: tuple[int, int, int]) -> None:
    """Seed ``random``, ``torch`` and ``numpy`` of this process with three seeds."""
    random.seed(seeds[0])
    torch.manual_seed(seeds[1])
    np.random.seed(seeds[2] >> 32 if seeds[2] >= 2**32 else seeds[2])


def _checked(datapipe: Any, who: str) -> DataPipe:
    if not isinstance(datapipe, IterDataPipe | MapDataPipe):
        raise TypeError(f"{who} should return a DataPipe, got {type(datapipe).__name__}")
    return datapipe


def process_init_fn(
    datapipe: DataPipe,
    worker_info: WorkerInfo,
    custom_init_fn: Callable[[DataPipe, WorkerInfo], DataPipe] | None = None,
    worker_prefetch_cnt: int = 0,
    dispatching_req_queue: Any = None,
    dispatching_res_queue: Any = None,
) -> DataPipe:
    """Shard ``datapipe`` for this worker, apply ``custom_init_fn``, add a prefetch stage."""
    if dispatching_req_queue is not None or dispatching_res_queue is not None:
        raise NotImplementedError("shardpipes has no dispatching process")
    apply_sharding(
        datapipe,
        worker_info.num_workers,
        worker_info.worker_id,
        SHARDING_PRIORITIES.MULTIPROCESSING,
    )
    if custom_init_fn is not None:
        datapipe = _checked(custom_init_fn(datapipe, worker_info), "worker_init_fn")
    if worker_prefetch_cnt > 0:
        datapipe = datapipe.prefetch(worker_prefetch_cnt)
    return datapipe


def process_reset_fn(
    datapipe: DataPipe,
    worker_info: WorkerInfo,
    seed_generator: SeedGenerator,
    distributed_shared_seed: bool = False,
    iter_reset_fn: Callable[[DataPipe], DataPipe] | None = None,
    custom_reset_fn: Callable[[DataPipe, WorkerInfo, SeedGenerator], DataPipe] | None = None,
) -> DataPipe:
    """Seed this process's ``random``/``torch``/``numpy`` and the graph from ``seed_generator``."""
    draw = (
        seed_generator.generate_shared_seed
        if distributed_shared_seed
        else seed_generator.generate_seed
    )
    seed_global_rngs((draw(), draw(), draw()))
    if distributed_shared_seed:
        set_datapipes_seed(
            list_dps(traverse_dps(datapipe)), seed_generator, distributed_shared=True
        )
    else:
        set_graph_random_seed(datapipe, seed_generator)
    if iter_reset_fn is not None:
        datapipe = _checked(iter_reset_fn(datapipe), "iter_reset_fn")
    if custom_reset_fn is not None:
        datapipe = _checked(
            custom_reset_fn(datapipe, worker_info, seed_generator), "worker_reset_fn"
        )
    return datapipe
