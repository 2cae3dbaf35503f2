"""Readers: how rank and worker make a reader number and a seed path, and equal shares.

The one home of three rules that the partition, the resume plan, the sharder, the loader and
``as_node`` all follow:

- a reader's number is ``rank * max(num_workers, 1) + worker`` (distributed outer,
  multiprocessing inner);
- its seed path is ``(rank, worker)`` without the parts a reading service did not add
  (no rank part without ``DistributedReadingService``, no worker part without worker processes);
- an epoch of ``total`` samples gives each of ``readers`` readers ``total // readers`` samples
  under ``"drop"`` and ``ceil(total / readers)`` under ``"pad"``; ``batch(B)`` turns ``n``
  samples into ``n // B`` items with ``drop_last`` and ``ceil(n / B)`` without.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "POLICIES",
    "batches",
    "check_int",
    "per_reader",
    "reader_count",
    "reader_index",
    "reader_path",
    "split_reader",
]

#: The equal-length policies of an indexed epoch.
POLICIES = ("drop", "pad")


def reader_count(world_size: int, num_workers: int) -> int:
    """``world_size * max(num_workers, 1)``: ``num_workers=0`` reads in the rank's main process."""
    return world_size * max(num_workers, 1)


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (``TypeError``/``ValueError`` naming ``name`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} should be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} ({value}) should be >= {minimum}")
    return int(value)


def reader_index(rank: int, worker: int, *, world_size: int, num_workers: int) -> int:
    """Return the reader number of ``(rank, worker)``: ``rank * max(num_workers, 1) + worker``.

    ``num_workers=0`` means one reader per rank (worker ``0``, the rank's main process).

    Raises:
        ValueError: ``rank`` or ``worker`` out of range, naming the value and the range.

    Examples:
        >>> reader_index(1, 2, world_size=2, num_workers=4)
        6
    """
    world_size = check_int("world_size", world_size, 1)
    workers = max(check_int("num_workers", num_workers, 0), 1)
    rank = check_int("rank", rank, 0)
    worker = check_int("worker", worker, 0)
    if rank >= world_size:
        raise ValueError(f"rank ({rank}) should be smaller than world_size ({world_size})")
    if worker >= workers:
        raise ValueError(
            f"worker ({worker}) should be smaller than max(num_workers, 1) ({workers})"
        )
    return rank * workers + worker


def split_reader(reader: int, num_workers: int) -> tuple[int, int]:
    """``(rank, worker)`` of reader number ``reader``."""
    return divmod(reader, max(num_workers, 1))


def reader_path(rank: int, worker: int, *, distributed: bool, num_workers: int) -> tuple[int, ...]:
    """The seed path of reader ``(rank, worker)``: the parts its reading services add.

    Examples:
        >>> reader_path(1, 0, distributed=True, num_workers=0)
        (1,)
        >>> reader_path(0, 2, distributed=False, num_workers=4)
        (2,)
        >>> reader_path(0, 0, distributed=True, num_workers=1)
        (0, 0)
    """
    return ((rank,) if distributed else ()) + ((worker,) if num_workers else ())


def per_reader(total: int, readers: int, policy: str) -> int:
    """Samples each reader gets of ``total``: floor under ``"drop"``, ceiling under ``"pad"``.

    Examples:
        >>> per_reader(7, 2, "drop"), per_reader(7, 2, "pad")
        (3, 4)
    """
    return total // readers if policy == "drop" else -(-total // readers)


def batches(samples: int, batch_size: int | None, drop_last: bool) -> int:
    """Items that ``batch(batch_size, drop_last)`` makes of ``samples`` (``None``: no batching).

    Examples:
        >>> batches(10, 4, False), batches(10, 4, True), batches(10, None, False)
        (3, 2, 10)
    """
    if batch_size is None:
        return samples
    return samples // batch_size if drop_last else -(-samples // batch_size)
