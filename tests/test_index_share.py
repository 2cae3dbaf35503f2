"""One read of each index descriptor per job: DistributedReadingService's rank 0 reads, the others receive it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from _dist import run_ranks
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import ShardIndex, build_index
from shardpipes.synthetic import write_synthetic

pytestmark = [pytest.mark.distributed, pytest.mark.http]


def key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def _ids(urls: list[str], index_url: str, rank: int, world: int) -> Any:
    dp = (
        IterableWrapper(urls)
        .shuffle()
        .sharding_by_index(index_url)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(key)
    )
    rs = SequentialReadingService(
        DistributedReadingService(timeout=60),
        MultiProcessingReadingService(2, multiprocessing_context="fork"),
    )
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.seed(1)
        return list(dl)


def _rank(rank: int, world: int, urls: list[str], index_url: str) -> Any:
    return _ids(urls, index_url, rank, world)


def test_the_descriptor_is_read_once_per_job(tmp_path, http_server):
    paths = write_synthetic(tmp_path / "shards", shards=4, samples=[5, 6, 7, 8], payload_bytes=8)
    index_path = os.fspath(tmp_path / "shards" / "train.index.json")
    build_index(paths, progress=False).save(index_path)
    for root, _, files in os.walk(tmp_path / "shards"):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                http_server.add(os.path.relpath(full, tmp_path / "shards"), f.read())
    urls = [f"{http_server.url}/{os.path.basename(p)}" for p in paths]
    index_url = f"{http_server.url}/train.index.json"
    ShardIndex.load(index_url)
    one_read = len(http_server.log.gets("train.index.json"))
    assert one_read >= 1
    results = run_ranks(_rank, 2, urls, index_url, timeout=200)
    reads = len(http_server.log.gets("train.index.json")) - one_read
    assert reads == one_read, f"{reads} requests for the descriptor; one read is {one_read}"
    assert len(results[0]) == len(results[1]) == 12  # 26 samples, 4 readers: 6 each (2 left out)
    assert len(set(results[0]) | set(results[1])) == 24
