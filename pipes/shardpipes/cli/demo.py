"""``shardpipes demo``: make a small dataset and stream it with 2 local ranks x 2 workers."""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from typing import Any

from shardpipes.cli._command import Command, arg

__all__ = ["COMMAND", "pipeline", "run"]

COMMAND = Command(
    "demo",
    help="make a small dataset and stream it through the full distributed pipeline",
    description="Writes synthetic shards to a temporary folder and streams them with "
    "DataLoader2 on WORLD local ranks (torch.distributed, gloo on 127.0.0.1) x WORKERS "
    "worker processes, then prints per-rank counts and throughput.",
    args=(
        arg("--shards", type=int, default=8, help="number of shards (default: 8)"),
        arg("--samples", type=int, default=2000, help="samples per shard (default: 2000)"),
        arg("--batch-size", type=int, default=64, help="batch size (default: 64)"),
        arg(
            "--world", type=int, default=2, help="local ranks; 1 runs in this process (default: 2)"
        ),
        arg("--workers", type=int, default=2, help="worker processes per rank (default: 2)"),
        arg("--epochs", type=int, default=2, help="epochs (default: 2)"),
    ),
)


def sample_key(sample: dict[str, Any]) -> str:
    """Keep only what the demo counts: the sample's shard and key."""
    return f"{sample['__url__'].rsplit('/', 1)[-1]}/{sample['__key__']}"


def pipeline(pattern: str, batch_size: int) -> Any:
    """The demo's graph: expand, shuffle shards, shard, open, tar, group, decode, shuffle, batch."""
    from shardpipes.datapipes.iter import IterableWrapper

    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_key)
        .shuffle(buffer_size=1000)
        .batch(batch_size)
    )


def _rank_main(
    rank: int, world: int, store: str, out: str, args: argparse.Namespace, pattern: str
) -> None:
    import torch.distributed as dist

    from shardpipes.dataloader2 import (
        DataLoader2,
        DistributedReadingService,
        MultiProcessingReadingService,
        SequentialReadingService,
    )

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on this machine's loopback
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    services: list[Any] = [MultiProcessingReadingService(num_workers=args.workers)]
    if world > 1:
        services.insert(0, DistributedReadingService(timeout=300))
    epochs = []
    try:
        with DataLoader2(
            pipeline(pattern, args.batch_size), reading_service=SequentialReadingService(*services)
        ) as dl:
            for _ in range(args.epochs):
                t0 = time.perf_counter()
                keys: list[str] = []
                batches = 0
                for batch in dl:
                    batches += 1
                    keys.extend(batch)
                epochs.append(
                    {"keys": keys, "seconds": time.perf_counter() - t0, "batches": batches}
                )
    finally:
        if world > 1:
            dist.destroy_process_group()
    with open(f"{out}.{rank}", "wb") as f:
        pickle.dump(epochs, f)


def run(args: argparse.Namespace) -> int:
    """Write the dataset, stream it, print what each rank saw."""
    from torch.multiprocessing.spawn import start_processes

    from shardpipes.synthetic import write_synthetic

    if args.world < 1 or args.workers < 0 or args.epochs < 1 or args.shards < 1:
        raise ValueError("--world and --epochs and --shards must be >= 1, --workers >= 0")
    with tempfile.TemporaryDirectory(prefix="shardpipes-demo-") as tmp:
        t0 = time.perf_counter()
        write_synthetic(tmp, shards=args.shards, samples=args.samples, payload_bytes=256)
        total = args.shards * args.samples
        print(
            f"wrote {args.shards} shards x {args.samples} samples to {tmp} ({time.perf_counter() - t0:.1f} s)"
        )
        pattern = f"{tmp}/train-{{000000..{args.shards - 1:06d}}}.tar"
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "result")
        print(
            f"streaming with {args.world} rank(s) x {args.workers} worker(s), {args.epochs} epoch(s)..."
        )
        if args.world == 1:
            _rank_main(0, 1, store, out, args, pattern)
        else:
            start_processes(  # type: ignore[no-untyped-call]
                _rank_main,
                args=(args.world, store, out, args, pattern),
                nprocs=args.world,
                start_method="spawn",
            )
        results = []
        for rank in range(args.world):
            with open(f"{out}.{rank}", "rb") as f:
                results.append(pickle.load(f))
    ok = True
    for e in range(args.epochs):
        per_rank = [r[e] for r in results]
        seen: dict[str, int] = {}
        for r in per_rank:
            for k in r["keys"]:
                seen[k] = seen.get(k, 0) + 1
        shared = sum(1 for c in seen.values() if c > 1)
        seconds = max(r["seconds"] for r in per_rank)
        n = sum(len(r["keys"]) for r in per_rank)
        counts = ", ".join(
            f"rank {i}: {len(r['keys'])} samples / {r['batches']} batches"
            for i, r in enumerate(per_rank)
        )
        print(f"epoch {e}: {counts}")
        print(
            f"         samples on more than one rank: {shared}; covered {len(seen)}/{total}; "
            f"{n / seconds:,.0f} samples/s" + (" (includes starting the workers)" if e == 0 else "")
        )
        ok = ok and shared == 0 and len({len(r["keys"]) for r in per_rank}) == 1
    if not ok:
        print("error: ranks overlapped or got different counts")
        return 1
    return 0
