"""Small helpers with webdataset's names: the security flag, worker info, ``PipelineStage``."""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch.distributed as dist

__all__ = [
    "PipelineStage",
    "enforce_security",
    "identity",
    "is_iterable",
    "make_seed",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
]

#: Refuse to unpickle (``.pkl``, ``.pyd``, ``.pth``) while decoding. webdataset defaults to
#: ``False`` (``WDS_SECURE=1`` turns it on); shardpipes never unpickles by default, so here it
#: defaults to ``True`` and ``WDS_SECURE=0`` (or setting it to ``False``) turns it off.
enforce_security = bool(int(os.environ.get("WDS_SECURE", "1")))


def identity(x: Any) -> Any:
    """Return ``x``."""
    return x


def is_iterable(obj: Any) -> bool:
    """Whether ``obj`` is iterable and not a string or bytes."""
    if isinstance(obj, str | bytes):
        return False
    try:
        iter(obj)
    except TypeError:
        return False
    return True


def make_seed(*args: Any) -> int:
    """Combine ``args`` into one 63-bit seed (structurally, by ``numpy.random.SeedSequence``)."""
    # Not hash(): str hashes change from process to process (PYTHONHASHSEED).
    parts = [abs(a) if isinstance(a, int) else zlib.crc32(repr(a).encode()) for a in args]
    return int(np.random.SeedSequence(parts).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)


def pytorch_worker_info(group: Any = None) -> tuple[int, int, int, int]:
    """Return ``(rank, world_size, worker, num_workers)`` of this process.

    ``rank``/``world_size`` come from ``torch.distributed`` when it is initialised, else 0/1;
    ``worker``/``num_workers`` from ``torch.utils.data.get_worker_info()``, else 0/1.
    """
    rank, world = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank, world, worker, workers


def pytorch_worker_seed(group: Any = None) -> int:
    """Webdataset's per-reader seed: ``rank * 1000 + worker`` (the same in every epoch)."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def repeatedly(
    source: Iterable[Any], nepochs: int | None = None, nbatches: int | None = None
) -> Iterator[Any]:
    """Iterate ``source`` again and again: ``nepochs`` times, at most ``nbatches`` items each."""
    epoch = 0
    while nepochs is None or epoch < nepochs:
        yield from islice(source, nbatches if nbatches is not None else sys.maxsize)
        epoch += 1


class PipelineStage:
    """Base of stateful pipeline stages: ``run(src)`` returns an iterator over the output."""

    def invoke(self, *args: Any, **kw: Any) -> Any:
        """Call :meth:`run`."""
        return self.run(*args, **kw)

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        """Process ``src``."""
        raise NotImplementedError
