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
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.sync import settled

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
