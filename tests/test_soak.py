"""Soak: 50 epochs with 2 ranks x 2 workers; no leaked processes, descriptors or memory growth."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from _dist import run_ranks
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic

EPOCHS = 50


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children_left(seconds: float = 60.0) -> list:
    """The child processes still running once they have had ``seconds`` to end.

    A polled wait, not a measurement: shutdown joins each worker for 5 s and then only sends it
    SIGTERM, so on a loaded machine a worker may still be ending just after shutdown returns.
    """
    deadline = time.monotonic() + seconds
    while (left := multiprocessing.active_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def soak(rank, world, pattern):
    dp = (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .shuffle(buffer_size=64)
        .batch(8)
    )
    rs = SequentialReadingService(
        DistributedReadingService(timeout=60),
        MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork"),
    )
    sizes, rss, fds = [], {}, {}
    with DataLoader2(dp, reading_service=rs) as dl:
        for epoch in range(EPOCHS):
            sizes.append(sum(1 for _ in dl))
            if epoch in (4, EPOCHS - 1):
                rss[epoch], fds[epoch] = rss_kib(), open_fds()
        children_during = len(multiprocessing.active_children())
    children_after = len(_children_left())
    return {
        "sizes": sizes,
        "rss": rss,
        "fds": fds,
        "during": children_during,
        "after": children_after,
    }


@pytest.mark.distributed
def test_fifty_epochs_leak_nothing(tmp_path, capsys):
    # Equal shards: with 4 readers x 2 shards each, every epoch has the same size. (With uneven
    # shards and no index, the "stop" policy's epoch length depends on the epoch's shard order.)
    write_synthetic(tmp_path, shards=8, samples=50, payload_bytes=128)
    pattern = f"{tmp_path}/train-{{000000..000007}}.tar"
    results = run_ranks(soak, 2, pattern, timeout=600)
    for rank, r in enumerate(results):
        with capsys.disabled():
            print(
                f"\n[soak rank {rank}] batches/epoch {sorted(set(r['sizes']))}; RSS KiB epoch 4 -> {EPOCHS - 1}: "
                f"{r['rss'][4]} -> {r['rss'][EPOCHS - 1]}; fds {r['fds'][4]} -> {r['fds'][EPOCHS - 1]}"
            )
        per_worker = 400 // 2 // 2  # samples each of the 2 x 2 readers gets
        assert r["sizes"] == [2 * -(-per_worker // 8)] * EPOCHS, (
            "every epoch must have the same size"
        )
        assert r["sizes"] == results[0]["sizes"], "ranks disagree on the epoch length"
        assert r["rss"][EPOCHS - 1] <= r["rss"][4] * 1.05 + 2048, "memory grew across epochs"
        assert r["fds"][EPOCHS - 1] <= r["fds"][4], "file descriptors leaked"
        assert r["during"] == 2 and r["after"] == 0, "worker processes left after shutdown"
