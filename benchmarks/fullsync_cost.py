"""Cost of equalising epoch lengths across ranks: chunked fullsync vs one collective per item.

Runs 2 gloo ranks on 127.0.0.1; each iterates N items (uneven: rank 1 has 10% fewer) through
``fullsync`` with several ``sync_every`` values (1 = a collective per item, as torchdata 0.9's
FullSync did) and with no synchronisation, and prints microseconds per item and collectives.

    python benchmarks/fullsync_cost.py [--items 20000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from shardpipes.datapipes.iter import IterableWrapper


def _rank(rank: int, world: int, store: str, items: int, q) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    n = items if rank == 0 else int(items * 0.9)
    rows = []
    for sync_every in (None, 1, 4, 16, 64):
        dp = IterableWrapper(range(n))
        if sync_every is not None:
            dp = dp.fullsync(sync_every=sync_every)
        dist.barrier()
        t0 = time.perf_counter()
        count = sum(1 for _ in dp)
        dt = time.perf_counter() - t0
        collectives = dp.stats.collectives if sync_every is not None else 0
        rows.append((sync_every, count, dt, collectives))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=20000)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, 2, store, args.items, q)) for r in range(2)]
        for p in procs:
            p.start()
        rows = q.get()
        for p in procs:
            p.join()
    print(f"{'sync_every':>10} {'items':>7} {'us/item':>8} {'collectives':>11}")
    for sync_every, count, dt, coll in rows:
        label = "none" if sync_every is None else str(sync_every)
        print(f"{label:>10} {count:>7} {dt / count * 1e6:>8.2f} {coll:>11}")


if __name__ == "__main__":
    main()
