"""Skips under a non-raising handler are counted across workers and reported per epoch."""

from __future__ import annotations

import logging
import pathlib

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic


@pytest.fixture
def damaged(tmp_path):
    paths = write_synthetic(tmp_path, shards=4, samples=20, payload_bytes=64)
    raw = pathlib.Path(paths[1]).read_bytes()
    with open(paths[1], "wb") as f:
        f.write(raw[: len(raw) // 2])  # cut on a member boundary: no end-of-archive marker
    return paths


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_skipped_shard_is_counted_and_logged(damaged, workers, caplog):
    dp = (
        IterableWrapper(damaged)
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar(handler="skip")
        .webdataset()
        .batch(5)
    )
    with caplog.at_level(logging.INFO, logger="shardpipes"):
        with DataLoader2(
            dp, reading_service=MultiProcessingReadingService(num_workers=workers)
        ) as dl:
            n = sum(len(b) for b in dl)
            stats = dl.stats()
    assert 60 <= n < 80
    assert stats["skipped_shards"] == 1 and stats["skipped_samples"] == 0
    url, reason = stats["skipped_examples"][0]
    assert url == damaged[1] and "truncated tar archive at byte offset" in reason
    epoch_lines = [r for r in caplog.records if "epoch 0:" in r.getMessage()]
    assert epoch_lines and epoch_lines[0].levelno == logging.WARNING
    assert "1 shards" in epoch_lines[0].getMessage() and damaged[1] in epoch_lines[0].getMessage()


def test_clean_epoch_logs_at_info_with_no_skips(tmp_path, caplog):
    paths = write_synthetic(tmp_path, shards=2, samples=5)
    dp = IterableWrapper(paths).open_files_by_fsspec().load_from_tar().webdataset()
    with caplog.at_level(logging.INFO, logger="shardpipes"):
        with DataLoader2(dp) as dl:
            assert len(list(dl)) == 10
            assert dl.stats()["skipped_shards"] == dl.stats()["skipped_samples"] == 0
    assert any(
        r.levelno == logging.INFO and "epoch 0: 10 items" in r.getMessage() for r in caplog.records
    )
