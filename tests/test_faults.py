"""Faults with real processes: a rank killed mid-epoch; hostile tar member names."""

from __future__ import annotations

import io
import os
import pathlib
import signal
import tarfile

import pytest
import torch.distributed as dist

from _dist import run_ranks
from shardpipes.dataloader2 import DataLoader2, DistributedReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import WorkerError


def die_on_rank_1(x):
    if dist.get_rank() == 1 and x >= 40:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def rank_with_a_dying_peer(rank, world):
    dp = IterableWrapper(range(3000)).sharding_filter().map(die_on_rank_1).batch(2)
    try:
        with DataLoader2(dp, reading_service=DistributedReadingService(timeout=30)) as dl:
            for _ in dl:
                pass
    except WorkerError as exc:
        return ("worker-error", str(exc))
    return ("finished", "")


@pytest.mark.distributed
def test_killed_rank_makes_the_others_fail_clearly_within_the_timeout():
    # A rank that waits past run_ranks' timeout (4x the reading service's) fails as hung.
    results = run_ranks(rank_with_a_dying_peer, 3, timeout=120, expect_killed=frozenset({1}))
    assert results[1][0] == "killed" and results[1][1] == signal.SIGKILL
    for r in (0, 2):
        kind, message = results[r]
        assert kind == "worker-error", results[r]
        assert (
            "could not agree on the epoch length" in message
            and "another rank probably died" in message
        )


def test_member_names_with_dotdot_or_absolute_paths_are_only_keys(tmp_path):
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as t:
        for name in ("../../etc/passwd.txt", "/abs/olute.txt", "ok.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(b"x"))
    before = set(os.listdir(tmp_path))
    samples = list(IterableWrapper([str(path)]).open_files_by_fsspec().load_from_tar().webdataset())
    assert [s["__key__"] for s in samples] == ["../../etc/passwd", "/abs/olute", "ok"]
    assert set(os.listdir(tmp_path)) == before  # nothing was written anywhere


def test_gzip_compressed_shard_is_read(tmp_path):
    import gzip

    from shardpipes.synthetic import write_synthetic

    [path] = write_synthetic(tmp_path, shards=1, samples=3)
    gz = tmp_path / "train-000000.tar.gz"
    gz.write_bytes(gzip.compress(pathlib.Path(path).read_bytes()))
    dp = IterableWrapper([str(gz)]).open_files_by_fsspec().load_from_tar().webdataset()
    plain = IterableWrapper([str(path)]).open_files_by_fsspec().load_from_tar().webdataset()
    assert [dict(s, __url__=None) for s in dp] == [dict(s, __url__=None) for s in plain]
