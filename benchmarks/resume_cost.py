"""What a resume costs: seeking with a shard index vs replaying without one.

Makes synthetic shards (default 40 x 2,500 samples of ~1 KB), indexes them, and for resume
points early and late in an epoch measures the time from ``load_state_dict`` to the first batch
and the samples read in the resumed epoch, for the same graph with ``sharding_by_index`` (seek)
and with ``sharding_filter`` (replay). In-process and with 2 workers.

    python benchmarks/resume_cost.py [--shards 40] [--samples 2500] [--buffer 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic


def sample_id(sample: dict[str, Any]) -> int:
    return int(sample[".json"]["id"])


def graph(paths: list[str], indexed: bool, buffer: int) -> Any:
    dp = IterableWrapper(paths).shuffle()
    dp = dp.sharding_by_index() if indexed else dp.sharding_filter()
    return (
        dp.open_files_by_fsspec().load_from_tar().webdataset().decode()
        .map(sample_id).shuffle(buffer_size=buffer).batch(64)
    )  # fmt: skip


def state_at(workers: int, k: int) -> dict[str, Any]:
    """The state after ``k`` batches of epoch 0 (written out: taking it would mean reading them)."""
    return {
        "format": "shardpipes-loader-state", "version": 2, "seed": 0, "epoch": 0,
        "consumed": k, "world_size": 1, "num_workers": workers, "distributed": False,
        "segments": [], "skipped": 0,
    }  # fmt: skip


def first_batch_seconds(
    paths: list[str], indexed: bool, buffer: int, workers: int, k: int
) -> float:
    state = state_at(workers, k)
    rs = MultiProcessingReadingService(num_workers=workers)
    with DataLoader2(graph(paths, indexed, buffer), reading_service=rs) as dl:
        t0 = time.perf_counter()
        dl.load_state_dict(state)
        next(iter(dl))
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", type=int, default=40)
    p.add_argument("--samples", type=int, default=2500)
    p.add_argument("--buffer", type=int, default=10_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = write_synthetic(
            folder, shards=args.shards, samples=args.samples, payload_bytes=1000
        )
        build_index(paths, progress=False).save(default_index_url(paths))
        total = args.shards * args.samples
        batches = total // 64
        print(
            f"{total} samples, batch 64 ({batches} batches per epoch), shuffle buffer {args.buffer}"
        )
        print("| resume after | workers | seek (index) | replay (no index) |")
        print("| --- | --- | --- | --- |")
        for workers in (0, 2):
            for k in (10, batches // 2, batches - 10):
                seek = first_batch_seconds(paths, True, args.buffer, workers, k)
                replay = first_batch_seconds(paths, False, args.buffer, workers, k)
                print(f"| {k} batches | {workers} | {seek:.2f} s | {replay:.2f} s |")


if __name__ == "__main__":
    main()
