"""Trainer CPU per batch under RayReadingService, against Ray's raw transfer of the same bytes.

    python benchmarks/ray_cost.py [--batches 400] [--batch-bytes 262144] [--readers 2]

One local Ray instance (127.0.0.1, no dashboard). Both runs in one process, one after the other:

- ``service``: a ``DataLoader2`` with ``RayReadingService(readers)`` over indexed synthetic
  shards whose batches hold ``--batch-bytes`` of payload; the trainer's CPU time
  (``time.process_time``: every thread of the process, Ray's own included) per batch.
- ``raw``: a Ray actor's streaming generator yielding the same batches (taken from the first
  run, the same objects and bytes) in messages of the same size; the trainer ``ray.get``s them.

Prints both and their ratio. The machine this was written on had 2 cores shared with other
work: read the ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.raypool import RayReadingService
from shardpipes.synthetic import write_synthetic


def payload(sample: dict[str, Any]) -> bytes:
    return bytes(sample[".bin"])


class Replay:
    """An actor that yields given batches in messages of ``bundle`` (Ray's raw transfer)."""

    def run(self, batches: list[Any], bundle: int) -> Any:
        for i in range(0, len(batches), bundle):
            yield batches[i : i + bundle]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-bytes", type=int, default=256 << 10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--bundle", type=int, default=4)
    p.add_argument("--settle", type=float, default=20.0, help="seconds the readers get to fill up")
    args = p.parse_args()
    import ray

    per_sample = args.batch_bytes // args.batch_size
    samples = args.batches * args.batch_size
    with tempfile.TemporaryDirectory(prefix="sp-raycost-") as tmp:
        shards = 8
        paths = write_synthetic(
            tmp, shards=shards, samples=samples // shards, payload_bytes=per_sample
        )
        build_index(paths, progress=False).save(default_index_url(paths))
        dp = (
            IterableWrapper(paths)
            .sharding_by_index()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .map(payload)
            .batch(args.batch_size)
        )
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            # Every message may be made ahead (prefetch), and the trainer starts counting once
            # they were: on 2 cores the readers are slower than the trainer, and a trainer that
            # waits for them spends CPU in Ray's waiting (both runs are measured this way).
            ahead = args.batches // (args.bundle * args.readers) + 2
            rs = RayReadingService(
                args.readers,
                pool="cost",
                reader_options={"num_cpus": 0.5},
                bundle=args.bundle,
                prefetch=ahead,
                check_every=1 << 20,
            )
            kept = []
            with DataLoader2(dp, reading_service=rs) as dl:
                dl.seed(0)
                it = iter(dl)
                kept.append(next(it))  # the pool is up, the first messages made
                time.sleep(args.settle)
                cpu0, wall0 = time.process_time(), time.perf_counter()
                kept.extend(it)
                service_cpu = time.process_time() - cpu0
                service_wall = time.perf_counter() - wall0
            n = len(kept) - 1
            actor = ray.remote(Replay).options(num_cpus=0.5).remote()
            ref = ray.put(kept[1:])
            gen = actor.run.options(
                num_returns="streaming", _generator_backpressure_num_objects=ahead * args.readers
            ).remote(ref, args.bundle)
            first = ray.get(next(gen))
            time.sleep(args.settle)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            got = len(first)
            for r in gen:
                got += len(ray.get(r))
            raw_cpu = time.process_time() - cpu0
            raw_wall = time.perf_counter() - wall0
            raw_n = got - len(first)
        finally:
            ray.shutdown()
    mb = args.batch_bytes / 2**20
    print(f"batches of {args.batch_size} samples, {mb:.2f} MiB each; messages of {args.bundle}")
    print(
        f"service: {n} batches, trainer CPU {1e3 * service_cpu / n:.3f} ms/batch "
        f"(wall {1e3 * service_wall / n:.3f} ms/batch)"
    )
    print(
        f"raw ray.get: {raw_n} batches, trainer CPU {1e3 * raw_cpu / raw_n:.3f} ms/batch "
        f"(wall {1e3 * raw_wall / raw_n:.3f} ms/batch)"
    )
    ratio = (service_cpu / n) / (raw_cpu / raw_n)
    print(f"ratio service / raw (trainer CPU per batch): {ratio:.2f}")


if __name__ == "__main__":
    main()
