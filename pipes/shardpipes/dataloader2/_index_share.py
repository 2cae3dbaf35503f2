"""One read of each index descriptor per job: rank 0 reads, the other ranks receive it.

Without this every reader process (ranks x workers) reads every ``sharding_by_index``'s
descriptor itself: for a million-shard index (70 MB) on 4096 ranks x 8 workers, about 2.3 TB
of requests at job start. ``DistributedReadingService`` calls :func:`share_indexes` once,
before it starts workers: rank 0 loads each index and broadcasts it over the loader's gloo
group; every rank puts the loaded index into its sharders, and the workers receive it with
the graph. Per-shard sample files (version 2 sidecars) are still read by the readers that read
those shards, each once.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import describe
from shardpipes.datapipes.iter.sync import settled
from shardpipes.index.document import ShardIndex

__all__ = ["share_indexes"]


def _unloaded(datapipe: IterDataPipe[Any]) -> list[Any]:
    """The graph's ``sharding_by_index`` stages whose index is not loaded (a URL or ``None``)."""
    return [
        dp for dp in describe(datapipe).index_sharders() if not isinstance(dp.index, ShardIndex)
    ]


def share_indexes(datapipe: IterDataPipe[Any], group: Any, rank: int) -> int:
    """Load the graph's indexes on rank 0 and give them to every rank; return how many were shared.

    A collective: every rank calls it at the same point. An index rank 0 cannot load raises
    the same error on every rank (no rank is left waiting).
    """
    sharders = _unloaded(datapipe)
    if not sharders:
        return 0
    payload: list[Any] = [None]
    if rank == 0:
        try:
            payload[0] = [s.load_index() for s in sharders]
        except Exception as exc:  # every rank raises it, instead of the others hanging
            payload[0] = exc
    found = _broadcast(payload[0], rank, group)
    if isinstance(found, BaseException):
        raise found
    for sharder, index in zip(sharders, found, strict=True):
        sharder.index = index  # loaded: the sharder reads no index file again
    return len(sharders)


def _broadcast(obj: Any, rank: int, group: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``broadcast_object_list``, its tensors settled).

    Made here rather than by ``dist.broadcast_object_list`` so that the tensors of the two
    collectives are freed by this thread, not torch's gloo thread: a loader forks its workers
    right after this (``settled`` says why that matters).
    """
    data = pickle.dumps(obj) if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    settled(dist.broadcast(size, src=0, group=group, async_op=True), [size], None)
    n = int(size.item())
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if rank == 0
        else torch.empty(n, dtype=torch.uint8)
    )
    settled(dist.broadcast(buf, src=0, group=group, async_op=True), [buf], None)
    return obj if rank == 0 else pickle.loads(buf.numpy().tobytes())
