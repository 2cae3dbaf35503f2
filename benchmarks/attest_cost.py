"""Cost of the ranks' check (docs/attestation.md): the loader with ``attest(policy="off")``,
with the default (``every=64``) and with a check every batch, on 2 gloo ranks on 127.0.0.1.

Each rank reads an indexed dataset of small samples (batches of sample dicts, which carry
their identity) in process, one epoch per setting, the settings alternated over ``--rounds``
rounds; the best epoch time of each setting is reported as a ratio to ``off``. Also prints the
bytes each rank sends and receives per check at 2 and 1024 ranks.

    python benchmarks/attest_cost.py [--samples 20000] [--batch 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from shardpipes.dataloader2 import DataLoader2, DistributedReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic

SETTINGS = (("off", "off", 64), ("every=64", "raise", 64), ("every=1", "raise", 1))
#: Per check: a 3 x int64 row per rank, all-gathered (a second gather of 9 x int64 only on a fault).
ROW_BYTES = 3 * 8


def _graph(paths: list[str], batch: int):
    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .batch(batch)
    )


def _rank(rank: int, world: int, store: str, paths: list[str], args, q) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    best: dict[str, float] = {}
    batches = 0
    for _ in range(args.rounds):
        for name, policy, every in SETTINGS:
            with DataLoader2(
                _graph(paths, args.batch), reading_service=DistributedReadingService()
            ) as dl:
                dl.attest(every=every, policy=policy)
                dl.seed(0)
                dist.barrier()
                t0 = time.perf_counter()
                batches = sum(1 for _ in dl)
                dt = time.perf_counter() - t0
            best[name] = min(best.get(name, float("inf")), dt)
    if rank == 0:
        q.put((best, batches))
    dist.destroy_process_group()


def main() -> None:
    """Run the measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_synthetic(tmp, shards=8, samples=args.samples // 8, payload_bytes=64)
        build_index(paths, progress=False).save(default_index_url(paths))
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, 2, store, paths, args, q)) for r in range(2)]
        for p in procs:
            p.start()
        best, batches = q.get(timeout=1200)
        for p in procs:
            p.join(60)
    off = best["off"]
    print(
        f"2 gloo ranks, {args.samples} samples, batches of {args.batch}: {batches} batches per rank"
    )
    print(f"{'setting':>10} {'epoch time / off':>17} {'us per batch over off':>22}")
    for name, _, _ in SETTINGS:
        print(f"{name:>10} {best[name] / off:17.3f} {(best[name] - off) / batches * 1e6:22.1f}")
    for world in (2, 1024):
        print(
            f"per check at {world} ranks: {ROW_BYTES} bytes sent per rank, "
            f"{ROW_BYTES * world} bytes received per rank"
        )


if __name__ == "__main__":
    main()
