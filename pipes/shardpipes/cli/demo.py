"""``shardpipes demo``: make a small dataset in a temporary folder and stream it."""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register ``demo``."""
    p = sub.add_parser("demo", help="make a small dataset and stream it through the full pipeline")
    p.add_argument("--shards", type=int, default=8, help="number of shards (default: 8)")
    p.add_argument("--samples", type=int, default=2000, help="samples per shard (default: 2000)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default: 64)")
    p.set_defaults(func=run)


def pipeline(pattern: str, batch_size: int) -> Any:
    """The demo's graph: expand -> shuffle shards -> shard -> open -> tar -> group -> decode -> shuffle -> batch."""
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
        .shuffle(buffer_size=1000)
        .batch(batch_size)
    )


def run(args: argparse.Namespace) -> int:
    """Write the dataset, stream one epoch, print counts and throughput."""
    from shardpipes.synthetic import write_synthetic

    with tempfile.TemporaryDirectory(prefix="shardpipes-demo-") as tmp:
        t0 = time.perf_counter()
        write_synthetic(tmp, shards=args.shards, samples=args.samples, payload_bytes=256)
        print(f"wrote {args.shards} shards x {args.samples} samples to {tmp} in {time.perf_counter() - t0:.1f} s")
        pattern = f"{tmp}/train-{{000000..{args.shards - 1:06d}}}.tar"
        t0 = time.perf_counter()
        samples = batches = 0
        for batch in pipeline(pattern, args.batch_size):
            batches += 1
            samples += len(batch)
        dt = time.perf_counter() - t0
        print(f"streamed {samples} samples in {batches} batches in {dt:.2f} s: {samples / dt:,.0f} samples/s")
        expected = args.shards * args.samples
        if samples != expected:
            print(f"error: expected {expected} samples")
            return 1
    return 0
