"""Tensors of the loader's collectives are freed by the thread that made them, not gloo's.

gloo's thread drops its references to a collective's tensors just after the work completes;
a tensor Python let go of first is freed on gloo's thread, which then makes itself a Python
thread state, and CPython up to 3.11.7 deadlocks a process forked at that instant
(gh-112275): a rank's loader worker once hung in ``PyOS_AfterFork_Child`` in CI.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from _dist import run_ranks
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper, sync
from shardpipes.datapipes.iter.sync import settled
from shardpipes.synthetic import write_synthetic

pytestmark = pytest.mark.distributed


def rank_settled(rank, world, n):
    counts = []
    for i in range(n):
        t = torch.tensor([i, rank], dtype=torch.int64)
        settled(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), [t], 60)
        counts.append(t._use_count())  # 1: the Python object's own reference, gloo's gone
        assert t.tolist() == [i, world - 1]
    return counts


def test_settled_returns_once_gloo_has_let_go_of_the_tensors():
    for counts in run_ranks(rank_settled, 2, 200):
        assert counts == [1] * 200


def rank_fullsync_buffer(rank, world):
    dp = IterableWrapper(range(10 + 3 * rank)).fullsync(sync_every=2)
    dp.set_process_group(dist.group.WORLD)
    out = list(dp)
    return len(out), dp.stats.collectives, dp._agree_buf._use_count()


def test_fullsync_reuses_one_tensor_for_its_collectives():
    results = run_ranks(rank_fullsync_buffer, 2)
    assert [r[0] for r in results] == [10, 10]  # stop policy: the shorter rank's count
    assert all(r[1] > 3 and r[2] == 1 for r in results)


def rank_held(rank, world):
    t = torch.tensor([rank], dtype=torch.int64)
    work = dist.all_reduce(t, async_op=True)
    keep = work  # a reference settled() is not given: it cannot wait for gloo to let go
    settled(work, [t], 60)
    del keep
    return len(sync._HELD)


def test_a_tensor_gloo_may_still_hold_is_kept_rather_than_freed_on_its_thread():
    assert run_ranks(rank_held, 2) == [1, 1]


def rank_attested(rank, world, paths):
    rs = SequentialReadingService(
        DistributedReadingService(timeout=60), MultiProcessingReadingService(num_workers=2)
    )
    dp = IterableWrapper(paths).shuffle().sharding_filter().open_files_by_fsspec()
    dp = dp.load_from_tar().webdataset().batch(2)
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.attest(every=2)
        n = sum(len(b) for _ in range(2) for b in dl)
    return n, len(sync._HELD)


def test_the_loaders_collectives_all_settle(tmp_path):
    # Every collective of a distributed loader with attestation (seed check, fullsync,
    # attestation) waited for gloo to let go: none ran into settled()'s bound.
    paths = write_synthetic(tmp_path, shards=4, samples=[5, 6, 7, 8], payload_bytes=16)
    for n, held in run_ranks(rank_attested, 2, paths):
        assert n > 0 and held == 0
