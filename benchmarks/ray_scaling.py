"""Throughput of RayReadingService against the size of its reader pool.

    python benchmarks/ray_scaling.py [--mode cpu|wait] [--sizes 1 2 4] [--readers 4] [--address auto]

Each run reads the same indexed synthetic shards with ``V = --readers`` logical readers, on a
pool of each size in turn, and prints batches per second and the trainer's wait per batch.
What a reader does per sample:

- ``--mode cpu`` (default): ``--work`` rounds of SHA-256 (stands for decoding and
  augmentation). On one 2-core machine it cannot grow past what 2 cores make.
- ``--mode wait``: sleeps ``--wait-ms`` (stands for a read's first-byte latency from an
  object store: the reader waits and uses no CPU). Throughput then grows with the pool on one
  machine too: this shows the pool overlapping its readers' waiting, not CPU scaling. A reader
  actor runs one step of one of its logical readers at a time, so it is the number of actors,
  not of logical readers, that overlaps the waits.

Without ``--address`` it starts a local Ray instance with ``--cpus`` logical CPUs; on real nodes
pass ``--address auto`` (and ``--cpus`` is ignored): throughput then grows with the pool until
the trainer or the storage is the limit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local: 127.0.0.1 only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.raypool import RayReadingService
from shardpipes.synthetic import write_synthetic


class Work:
    """``rounds`` of SHA-256 over the sample's payload: stands for decoding and augmentation."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __call__(self, sample: dict[str, Any]) -> bytes:
        data = bytes(sample[".bin"])
        for _ in range(self.rounds):
            data = hashlib.sha256(data).digest() + data[32:]
        return data[:32]


class Wait:
    """Sleep ``ms`` per sample (a read's first-byte latency: waiting, no CPU)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, sample: dict[str, Any]) -> bytes:
        time.sleep(self.ms / 1e3)
        return bytes(sample[".bin"])[:32]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--mode", choices=["cpu", "wait"], default="cpu")
    p.add_argument("--work", type=int, default=300, help="--mode cpu: hash rounds per sample")
    p.add_argument("--wait-ms", type=float, default=4.0, help="--mode wait: ms per sample")
    p.add_argument("--cpus", type=int, default=4)
    p.add_argument("--address", default=None)
    args = p.parse_args()
    import ray

    with tempfile.TemporaryDirectory(prefix="sp-rayscale-") as tmp:
        paths = write_synthetic(tmp, shards=8, samples=args.samples // 8, payload_bytes=4096)
        build_index(paths, progress=False).save(default_index_url(paths))
        dp = (
            IterableWrapper(paths)
            .sharding_by_index()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .map(Work(args.work) if args.mode == "cpu" else Wait(args.wait_ms))
            .batch(16)
        )
        if args.address:
            ray.init(address=args.address)
        else:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        try:
            what = f"{args.work} hash rounds" if args.mode == "cpu" else f"{args.wait_ms} ms wait"
            print(f"{args.readers} logical readers, {args.samples} samples, {what} per sample")
            for size in args.sizes:
                rs = RayReadingService(
                    args.readers, pool=f"scale-{size}", readers=size, reader_options={"num_cpus": 1}
                )
                with DataLoader2(dp, reading_service=rs) as dl:
                    dl.seed(0)
                    it = iter(dl)
                    next(it)  # the pool is up
                    start, waited = time.perf_counter(), rs.stats["wait_s"]
                    n = sum(1 for _ in it)
                    took = time.perf_counter() - start
                wait = (rs.stats["wait_s"] - waited) / max(n, 1)
                print(
                    f"pool of {size}: {n / took:.1f} batches/s "
                    f"(trainer wait {1e3 * wait:.2f} ms/batch)"
                )
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
