"""Batches for a consumer outside torch's DataLoader, such as NVIDIA DALI's ``external_source``.

``worker_batches(pattern, worker_id, num_workers, rank=..., world_size=..., epoch=...)`` returns
a plain Python iterator over the batches of one reader: its own shards of a fixed shard set,
in an order fixed by ``(seed, epoch)``. Readers ``(rank, worker_id)`` split the shards the way
``DataLoader2`` with ``DistributedReadingService`` and ``MultiProcessingReadingService`` would
(``shardpipes.nodes.as_node`` applies the graph's ``sharding_filter``), so together they read
every shard exactly once per epoch.

Each batch is ``(payloads, labels, ids)``, three lists of NumPy arrays, the form DALI's
``external_source(..., num_outputs=3, batch=True)`` takes. With DALI (not needed here)::

    source = worker_batches(pattern, worker_id=0, num_workers=1, rank=rank, world_size=world)
    with pipeline:
        payloads, labels, ids = fn.external_source(source=source, num_outputs=3, batch=True)

Unlike ``DataLoader2`` with ``DistributedReadingService``, nothing here makes the ranks yield
the same number of batches: a DDP consumer must stop every rank at the same step itself.

Run the demo (two readers, checked for disjoint and complete coverage, twice per epoch)::

    python examples/external_consumer.py [--workers 2] [--world 1] [--epochs 2]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.nodes import as_node
from shardpipes.synthetic import write_synthetic

Batch = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]


def to_arrays(sample: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One decoded sample -> ``(payload bytes, label, global id)`` as NumPy arrays."""
    return (
        np.frombuffer(bytes(sample[".bin"]), dtype=np.uint8).copy(),  # writable, not a view
        np.array(sample[".cls"], dtype=np.int64),
        np.array(sample[".json"]["id"], dtype=np.int64),
    )


def to_columns(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Batch:
    """A batch of samples -> one list per output, as ``external_source(batch=True)`` wants."""
    payloads, labels, ids = zip(*rows, strict=True)
    return list(payloads), list(labels), list(ids)


def build_pipeline(pattern: str, batch_size: int) -> Any:
    """The graph every reader runs; ``as_node`` keeps each reader's own shards."""
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()  # shard order: from (seed, epoch) only, so every reader agrees on it
        .sharding_filter()  # reader (rank, worker) keeps its shards of that order
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(to_arrays)
        .shuffle(buffer_size=100)  # sample order: seeded per reader
        .batch(batch_size)
        .map(to_columns)
    )


def worker_batches(
    pattern: str,
    worker_id: int,
    num_workers: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    epoch: int = 0,
    seed: int = 0,
    batch_size: int = 32,
) -> Iterator[Batch]:
    """Return an iterator over the batches of reader ``(rank, worker_id)`` in ``epoch``.

    Args:
        pattern: The shard set, e.g. ``"shards/train-{000000..000006}.tar"`` or an ``s3://`` URL.
        worker_id: This reader's index on its rank, in ``[0, num_workers)``.
        num_workers: Readers per rank.
        rank: This rank, in ``[0, world_size)``. Default: ``0``.
        world_size: Number of ranks. Default: ``1``.
        epoch: The epoch; the same ``(seed, epoch)`` gives the same batches. Default: ``0``.
        seed: The run's seed, the same for every reader. Default: ``0``.
        batch_size: Samples per batch (each reader's last batch may be smaller). Default: ``32``.
    """
    node = as_node(
        build_pipeline(pattern, batch_size),
        rank=rank,
        world_size=world_size,
        worker=worker_id,
        num_workers=num_workers,
        seed=seed,
        equal_length=None,  # no torch.distributed here: ranks are not synchronised
    )
    # A node's state is (seed, epoch, items consumed): starting from this one opens `epoch`
    # directly, with the order DataLoader2 would give it.
    node.reset({"seed": seed, "epoch": epoch, "consumed": 0})
    return node


def shard_counts(shards: int, samples: int) -> list[int]:
    """Uneven samples per shard, so readers get different amounts of data."""
    return [samples + 7 * i for i in range(shards)]


def count_samples(pattern: str) -> int:
    """Samples in all shards, read once in this process."""
    samples = IterableWrapper([pattern]).shard_expand().open_files_by_fsspec().load_from_tar()
    return sum(1 for _ in samples.webdataset())


def batch_ids(batches: Iterator[Batch]) -> list[tuple[int, ...]]:
    """The sample ids of each batch, to compare runs."""
    return [tuple(int(i) for i in ids) for _, _, ids in batches]


def dataloader2_epochs(
    pattern: str, workers: int, epochs: int, batch_size: int
) -> list[list[tuple[int, ...]]]:
    """The same graph through DataLoader2 with worker processes (seed 0), for comparison."""
    rs = MultiProcessingReadingService(num_workers=workers)
    with DataLoader2(build_pipeline(pattern, batch_size), reading_service=rs) as dl:
        dl.seed(0)
        return [batch_ids(iter(dl)) for _ in range(epochs)]


def read_reader(
    args: argparse.Namespace, pattern: str, rank: int, worker: int, epoch: int
) -> list[tuple[int, ...]]:
    """All batches (as sample ids) of one reader in one epoch."""
    batches = worker_batches(
        pattern,
        worker,
        args.workers,
        rank=rank,
        world_size=args.world,
        epoch=epoch,
        batch_size=args.batch_size,
    )
    return batch_ids(batches)


def demo(args: argparse.Namespace, pattern: str, total: int) -> bool:
    """Consume every reader for each epoch; check disjoint, complete, repeatable, reordered."""
    # DataLoader2 runs on one rank here (several would need torch.distributed).
    reference = (
        dataloader2_epochs(pattern, args.workers, args.epochs, args.batch_size)
        if args.world == 1
        else None
    )
    ok = True
    previous: list[int] | None = None
    for epoch in range(args.epochs):
        everyone: list[tuple[int, ...]] = []
        for rank in range(args.world):
            for worker in range(args.workers):
                batches = read_reader(args, pattern, rank, worker, epoch)
                again = read_reader(args, pattern, rank, worker, epoch) == batches
                n = sum(map(len, batches))
                print(
                    f"epoch {epoch}: rank {rank} worker {worker}: {n} samples in {len(batches)} "
                    f"batches; the same batches when asked again: {again}"
                )
                ok = ok and again
                everyone += batches
        seen = [i for batch in everyone for i in batch]
        disjoint = len(seen) == len(set(seen))
        covered = sorted(seen) == list(range(total))
        print(f"epoch {epoch}: readers disjoint: {disjoint}; cover all {total} samples: {covered}")
        ok = ok and disjoint and covered
        if reference is not None:
            same = sorted(everyone) == sorted(reference[epoch])
            print(
                f"epoch {epoch}: the same batches as DataLoader2 with {args.workers} worker "
                f"processes: {same}"
            )
            ok = ok and same
        if previous is not None:
            reordered = seen != previous
            print(f"epoch {epoch}: a new order from epoch {epoch - 1}: {reordered}")
            ok = ok and reordered
        previous = seen
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data",
        default=None,
        help="folder with train-*.tar shards as write_synthetic makes them (ids 0..N-1), written "
        "if it has none (default: a temporary folder)",
    )
    p.add_argument("--shards", type=int, default=7, help="shards to write (default: 7)")
    p.add_argument(
        "--samples",
        type=int,
        default=50,
        help="samples in the first shard; shard i has SAMPLES + 7*i (default: 50)",
    )
    p.add_argument("--workers", type=int, default=2, help="readers per rank (default: 2)")
    p.add_argument("--world", type=int, default=1, help="ranks to simulate (default: 1)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: 2)")
    p.add_argument("--batch-size", type=int, default=16, help="batch size (default: 16)")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="shardpipes-consumer-example-") as tmp:
        folder = args.data or tmp
        if not glob.glob(os.path.join(folder, "train-*.tar")):
            write_synthetic(
                folder, shards=args.shards, samples=shard_counts(args.shards, args.samples)
            )
        n = len(glob.glob(os.path.join(folder, "train-*.tar")))
        pattern = f"{folder}/train-{{000000..{n - 1:06d}}}.tar"
        total = sum(shard_counts(n, args.samples)) if folder == tmp else count_samples(pattern)
        ok = demo(args, pattern, total)
    print("all checks passed" if ok else "error: a check failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))
