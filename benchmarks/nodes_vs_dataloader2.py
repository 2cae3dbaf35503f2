"""Throughput of the same graph driven by DataLoader2 and by torchdata.nodes.Loader(as_node(...)).

    python benchmarks/nodes_vs_dataloader2.py [--shards 8 --samples 4000 --trials 3]

Both run in-process on the same synthetic shards (~256-byte payloads); prints samples/s
(median of the trials, after one warm-up epoch) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from torchdata.nodes import Loader

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.nodes import as_node
from shardpipes.synthetic import write_synthetic


def graph(pattern: str):
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .shuffle(buffer_size=1000)
        .batch(64)
    )


def rate(iterable_factory, trials: int) -> float:
    it = iterable_factory()
    sum(len(b) for b in it)  # warm-up epoch
    rates = []
    for _ in range(trials):
        t0 = time.perf_counter()
        n = sum(len(b) for b in it)
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic(tmp, shards=args.shards, samples=args.samples, payload_bytes=256)
        pattern = f"{tmp}/train-{{000000..{args.shards - 1:06d}}}.tar"
        dl2 = rate(lambda: DataLoader2(graph(pattern)), args.trials)
        nodes = rate(lambda: Loader(as_node(graph(pattern))), args.trials)
    print(f"DataLoader2 (in-process):           {dl2:>10,.0f} samples/s")
    print(f"torchdata.nodes.Loader(as_node(dp)): {nodes:>10,.0f} samples/s")
    print(f"ratio nodes / DataLoader2: {nodes / dl2:.2f}")


if __name__ == "__main__":
    main()
