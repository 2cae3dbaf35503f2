"""`shardpipes splits` / partition.shard_order preview exactly the shard order the loader reads."""

from __future__ import annotations

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.plan.partition import assign_shards, shard_order


def urls(n):
    return [f"s-{i:03d}.tar" for i in range(n)]


@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (0, 3), (7, 1)])
def test_shard_order_is_the_loaders_order(seed, epoch):
    names = urls(9)
    # the usual graph: shard shuffle first, then sample-level shuffles after it
    dp = IterableWrapper(names).shuffle().map(str.upper).shuffle(buffer_size=3)
    with DataLoader2(IterableWrapper(names).shuffle()) as dl:
        dl.seed(seed)
        for _ in range(epoch):
            list(dl)
        loaded = list(dl)
    assert loaded == [names[i] for i in shard_order(9, seed=seed, epoch=epoch)]
    del dp


def test_assign_shards_is_what_each_worker_reads():
    names = urls(10)
    dp = IterableWrapper(names).shuffle().sharding_filter().batch(100)
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        dl.seed(4)
        per_worker = [list(b) for b in dl]
    expected = assign_shards(10, world_size=1, num_workers=2, seed=4, epoch=0)
    assert per_worker == [[names[i] for i in shards] for shards in expected]
