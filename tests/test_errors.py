"""Every package exception pickles (it must cross from worker processes) and keeps its fields."""

from __future__ import annotations

import pickle

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import (
    DecodeError,
    SampleFormatError,
    ShardFormatError,
    ShardReadError,
    WorkerError,
)
from shardpipes.index import IndexFormatError
from shardpipes.storage.retry import MissingShardError, RetriesExhaustedError

CASES = [
    ShardReadError("s3://b/x.tar: boom at byte offset 5", url="s3://b/x.tar", offset=5),
    ShardFormatError("f.tar: corrupt", url="f.tar", offset=512, member="a.cls"),
    SampleFormatError("f.tar: no ext", url="f.tar", key="a"),
    DecodeError("f.tar: bad json", url="f.tar", key="a"),
    WorkerError("rank 1: worker died"),
    IndexFormatError("i.json: bad", url="i.json", field="shards[0].offsets"),
    MissingShardError("s3://b/y.tar: no such file", url="s3://b/y.tar"),
    RetriesExhaustedError(
        "http://h/z.tar: gave up at byte offset 9", url="http://h/z.tar", offset=9
    ),
]


@pytest.mark.parametrize("exc", CASES, ids=lambda e: type(e).__name__)
def test_errors_round_trip_through_pickle(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    for field in ("url", "offset", "member", "key", "field"):
        assert getattr(back, field, None) == getattr(exc, field, None)


def test_decode_error_from_a_worker_keeps_its_type(tmp_path):
    sample = {"__key__": "k", "__url__": "mem://s.tar", ".json": b"{not json"}
    dp = IterableWrapper([sample, sample]).sharding_filter().decode()
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        with pytest.raises(DecodeError, match=r"cannot decode field '\.json' of sample 'k'"):
            list(dl)
