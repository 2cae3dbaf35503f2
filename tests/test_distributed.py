"""DistributedReadingService with real gloo ranks on 127.0.0.1 (each rank a spawned process)."""

from __future__ import annotations

import collections

import pytest
import torch.distributed as dist

from _dist import run_ranks
from _graphs import id_graph
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic

pytestmark = pytest.mark.distributed

COUNTS = [11, 13, 17, 19, 23, 29, 31]  # 7 uneven shards, prime sizes
TOTAL = sum(COUNTS)


@pytest.fixture(scope="module")
def pattern(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist-shards")
    write_synthetic(d, shards=len(COUNTS), samples=COUNTS, payload_bytes=32)
    return f"{d}/train-{{000000..{len(COUNTS) - 1:06d}}}.tar"


def run_epochs(rank, world, pattern, workers, policy, n_epochs, seed):
    rs = SequentialReadingService(
        DistributedReadingService(timeout=120, policy=policy),
        MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork"),
    )
    out = []
    with DataLoader2(id_graph(pattern, batch_size=3, buffer_size=8), reading_service=rs) as dl:
        dl.seed(seed)
        for _ in range(n_epochs):
            out.append([list(b) for b in dl])
        stats = rs.reading_services[0]._datapipe.stats.as_dict()
    return {"epochs": out, "stats": stats}


def check_equal_and_disjoint(results, n_epochs, padded=False):
    coverage = []
    for e in range(n_epochs):
        per_rank = [r["epochs"][e] for r in results]
        assert len({len(b) for b in per_rank}) == 1, (
            f"epoch {e}: batch counts {[len(b) for b in per_rank]}"
        )
        own = [collections.Counter(x for b in batches for x in b) for batches in per_rank]
        for i in range(len(own)):
            for j in range(i + 1, len(own)):
                assert not (own[i].keys() & own[j].keys()), (
                    f"epoch {e}: ranks {i} and {j} share samples"
                )
        if not padded:
            assert all(c == 1 for counts in own for c in counts.values()), (
                "a sample repeated within a rank"
            )
        seen = set().union(*(c.keys() for c in own))
        assert seen <= set(range(TOTAL))
        coverage.append(len(seen) / TOTAL)
    return coverage


@pytest.mark.parametrize(
    ("world", "workers"), [(3, 2), (2, 0)], ids=["3ranks-2workers", "2ranks-0workers"]
)
def test_stop_policy_equal_batches_disjoint_ranks(pattern, world, workers, capsys):
    results = run_ranks(run_epochs, world, pattern, workers, "stop", 2, 0)
    coverage = check_equal_and_disjoint(results, 2)
    with capsys.disabled():
        print(
            f"\n[stop, R={world}, W={workers}] coverage per epoch: {[f'{c:.0%}' for c in coverage]}"
        )
    assert all(0 < c <= 1 for c in coverage)
    for r in results:
        assert (
            r["stats"]["collectives"] <= 2 + len(r["epochs"][-1]) // 16 + 4
        )  # chunks, not batches


def test_pad_policy_covers_everything_with_equal_batches(pattern):
    results = run_ranks(run_epochs, 3, pattern, 2, "pad", 1, 0)
    check_equal_and_disjoint(results, 1, padded=True)
    seen = {x for r in results for b in r["epochs"][0] for x in b}
    assert seen == set(range(TOTAL)), "pad must not drop any sample"


def run_loaders(rank, world, pattern, runs):
    """``run_epochs`` for each ``(workers, policy, n_epochs, seed)`` in turn, on the same ranks."""
    return [run_epochs(rank, world, pattern, *run) for run in runs]


def test_same_seed_same_batches_new_order_each_epoch(pattern):
    # One job of 2 ranks runs the three loaders one after the other (three jobs before).
    runs = [(2, "stop", 2, 5), (2, "stop", 2, 5), (2, "stop", 1, 6)]
    a, b, c = zip(*run_ranks(run_loaders, 2, pattern, runs), strict=True)
    assert [r["epochs"] for r in a] == [r["epochs"] for r in b]
    for r in a:
        assert r["epochs"][0] != r["epochs"][1]
    assert [r["epochs"][0] for r in a] != [r["epochs"][0] for r in c]


def shard_order(rank, world, pattern):
    # Shard-level shuffle before sharding_filter: every rank must see the same order.
    dp = IterableWrapper([pattern]).shard_expand().shuffle()
    rs = DistributedReadingService(timeout=60)
    with DataLoader2(dp, reading_service=rs) as dl:
        return list(dl)  # no sharding_filter: every rank sees all shards (with a warning)


def test_shard_shuffle_agrees_across_ranks(pattern):
    orders = run_ranks(shard_order, 3, pattern)
    assert orders[0] == orders[1] == orders[2]
    assert orders[0] != sorted(orders[0])


def boom_on_rank_1(x):
    if dist.get_rank() == 1 and x > 10:
        raise KeyError(f"stage failed on item {x}")
    return x


def fail_on_rank_1(rank, world):
    dp = IterableWrapper(range(200)).sharding_filter().map(boom_on_rank_1).batch(2)
    with DataLoader2(dp, reading_service=DistributedReadingService(timeout=60)) as dl:
        return len(list(dl))


def test_error_on_one_rank_stops_the_others_without_hanging():
    results = run_ranks(fail_on_rank_1, 3, timeout=120, expect_errors=True)
    assert results[1][0] == "error" and "stage failed on item" in results[1][1]
    for r in (0, 2):
        assert results[r][0] == "error"
        assert "another rank failed while loading data" in results[r][1]


def seeded_by_rank(rank, world):
    with DataLoader2(
        IterableWrapper(range(8)).sharding_filter(),
        reading_service=DistributedReadingService(timeout=60),
    ) as dl:
        dl.seed(rank)
        return list(dl)


def test_ranks_that_disagree_on_the_seed_fail_clearly():
    results = run_ranks(seeded_by_rank, 2, expect_errors=True)
    for r in results:
        assert r[0] == "error" and "disagree on the loader seed" in r[1]
