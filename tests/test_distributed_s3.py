"""The distributed guarantees with the shards on S3 (moto's server on 127.0.0.1, through s3fs)."""

from __future__ import annotations

import collections

import pytest

from _dist import run_ranks
from _graphs import sample_id
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper

pytestmark = [pytest.mark.distributed, pytest.mark.s3]


def rank_reads_s3(rank, world, pattern, options):
    dp = (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(storage_options=options)
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .shuffle(buffer_size=8)
        .batch(3)
    )
    rs = SequentialReadingService(
        DistributedReadingService(timeout=120),
        MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork"),
    )
    with DataLoader2(dp, reading_service=rs) as dl:
        return [[list(b) for b in dl] for _ in range(2)]


def test_three_ranks_two_workers_from_s3(s3, shards):
    s3.put("train", shards.data)
    total = len(shards.expected)
    results = run_ranks(
        rank_reads_s3, 3, "s3://train/train-{000000..000006}.tar", s3.options(), timeout=300
    )
    for e in range(2):
        per_rank = [r[e] for r in results]
        assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
        seen = collections.Counter(x for batches in per_rank for b in batches for x in b)
        assert all(c == 1 for c in seen.values()), "a sample was read by two ranks"
        assert 0 < len(seen) <= total and set(seen) <= set(range(total))
    assert [r[0] for r in results] != [r[1] for r in results]
