"""sharding_by_index: sample-level partitions from the shard index, in-process and on real ranks."""

from __future__ import annotations

import collections
import pickle

import pytest
from torch.utils.data.graph_settings import apply_sharding

from _dist import run_ranks
from _graphs import indexed_graph, sample_id
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.dataloader2.reading_service import exact_length_plan
from shardpipes.datapipes.iter import IterableWrapper, ShardRange
from shardpipes.index import build_index
from shardpipes.synthetic import write_synthetic


@pytest.fixture
def indexed(tmp_path):
    paths = write_synthetic(tmp_path, shards=3, samples=[5, 7, 2], payload_bytes=32)
    build_index(paths, progress=False).save(str(tmp_path / "train.index.json"))
    return paths


def ids_of(paths, readers, reader, policy="drop"):
    dp = (
        IterableWrapper(paths)
        .sharding_by_index(policy=policy)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
    )
    apply_sharding(dp, readers, reader)
    return list(dp)


@pytest.mark.parametrize("readers", [1, 2, 4, 5, 14, 20])
def test_drop_gives_equal_disjoint_contiguous_pieces(indexed, readers):
    parts = [ids_of(indexed, readers, r) for r in range(readers)]
    per = 14 // readers
    assert all(len(p) == per for p in parts)
    flat = [x for p in parts for x in p]
    assert flat == list(range(per * readers))  # unshuffled: contiguous pieces in order
    assert 14 - len(flat) < readers


def test_pad_covers_everything_and_repeats_fewer_than_readers(indexed):
    parts = [ids_of(indexed, 4, r, policy="pad") for r in range(4)]
    assert {len(p) for p in parts} == {4}
    counts = collections.Counter(x for p in parts for x in p)
    assert set(counts) == set(range(14))
    assert sum(counts.values()) - 14 == 2


def test_ranges_are_byte_spans_with_absolute_offsets(indexed):
    index = build_index(indexed, progress=False)
    dp = IterableWrapper(indexed).sharding_by_index(index)
    apply_sharding(dp, 3, 1)
    ranges = list(dp)
    assert all(isinstance(r, ShardRange) for r in ranges)
    assert pickle.loads(pickle.dumps(ranges[0])).offset == ranges[0].offset
    tar = IterableWrapper(ranges).open_files_by_fsspec().load_from_tar()
    first = next(iter(tar.members()))
    shard = index.shards[index.lookup(first[0])]
    assert first[1].offset == shard.offsets[ranges[0].start]


def test_missing_index_says_how_to_build_one(tmp_path):
    paths = write_synthetic(tmp_path, shards=2, samples=3)
    with pytest.raises(
        FileNotFoundError, match=r"train\.index\.json: build it with `shardpipes index"
    ):
        list(IterableWrapper(paths).sharding_by_index())


def full_graph(paths, batch_size=3):
    return indexed_graph(paths, batch_size=batch_size, buffer_size=8)


def test_exact_length_plan_recognises_the_index_graph(indexed):
    assert exact_length_plan(full_graph(indexed, 3)) == (3, False)
    assert exact_length_plan(full_graph(indexed).filter(bool)) is None
    assert exact_length_plan(IterableWrapper(indexed).shuffle().sharding_filter()) is None


def test_workers_of_one_rank_cover_the_epoch(indexed):
    with DataLoader2(
        full_graph(indexed), reading_service=MultiProcessingReadingService(num_workers=2)
    ) as dl:
        ids = [x for b in dl for x in b]
    assert len(ids) == 14 and sorted(ids) == list(range(14))


def rank_epochs(rank, world, paths, workers):
    rs = SequentialReadingService(
        DistributedReadingService(timeout=60),
        MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork"),
    )
    with DataLoader2(full_graph(paths, batch_size=2), reading_service=rs) as dl:
        epochs = [[list(b) for b in dl] for _ in range(2)]
        top = type(rs.reading_services[0]._datapipe).__name__
    return {"epochs": epochs, "top": top}


@pytest.mark.distributed
def test_three_ranks_with_fewer_shards_than_readers(tmp_path):
    # 2 shards, 3 ranks x 2 workers = 6 readers: shard-level sharding would idle 4 of them.
    paths = write_synthetic(tmp_path, shards=2, samples=[17, 20], payload_bytes=16)
    build_index(paths, progress=False).save(str(tmp_path / "train.index.json"))
    results = run_ranks(rank_epochs, 3, paths, 2)
    for r in results:
        assert r["top"] == "ExactLengthIterDataPipe"  # no fullsync: one collective per epoch
    for e in range(2):
        per_rank = [r["epochs"][e] for r in results]
        assert len({len(b) for b in per_rank}) == 1
        seen = collections.Counter(x for batches in per_rank for b in batches for x in b)
        assert all(c == 1 for c in seen.values())
        assert len(seen) == 36 and set(seen) <= set(
            range(37)
        )  # 37 samples, 6 readers x 6, 1 dropped
    assert results[0]["epochs"][0] != results[0]["epochs"][1]


def test_fixed_length_without_a_length_takes_it_from_the_index(indexed):
    dp = (
        IterableWrapper(indexed)
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .batch(2)
        .fixed_length()
    )
    apply_sharding(dp, 3, 1)  # 14 samples over 3 readers: 4 each, in batches of 2
    assert [len(b) for b in dp] == [2, 2]
    with pytest.raises(TypeError, match="comes from the index"):
        len(dp)


def test_fixed_length_without_a_length_needs_the_index():
    with pytest.raises(ValueError, match="needs sharding_by_index upstream"):
        list(IterableWrapper(range(3)).fixed_length())
