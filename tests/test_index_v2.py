"""Index format v2: per-shard sample files loaded on demand, v1 compatibility, streaming builds."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import fsspec
import pytest
from torch.utils.data.graph_settings import apply_sharding

from _graphs import indexed_graph, resumed, uninterrupted
from shardpipes.cli import main
from shardpipes.dataloader2 import MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import ShardFormatError
from shardpipes.index import ShardIndex, build_index, default_index_url, write_index
from shardpipes.index.sidecar import SidecarError, sidecar_path
from shardpipes.synthetic import write_synthetic

COUNTS = [7, 0, 12, 5, 9]


@pytest.fixture
def paths(tmp_path) -> list[str]:
    return write_synthetic(tmp_path / "d", shards=len(COUNTS), samples=COUNTS, payload_bytes=40)


@pytest.fixture
def built(paths) -> ShardIndex:
    return build_index(paths, progress=False)


def test_descriptor_holds_no_samples_and_sample_files_hold_them(built, paths):
    out = default_index_url(paths)
    built.save(out)
    with open(out) as f:
        text = f.read()
    doc = json.loads(text)
    assert doc["version"] == 2 and doc["samples"] == "train.index.samples"
    assert all(set(s) == {"url", "num_samples", "total_bytes"} for s in doc["shards"])
    assert max(len(line) for line in text.splitlines()[1:]) < 100  # bytes per shard
    for i in range(len(COUNTS)):
        assert os.path.exists(sidecar_path(out, i))
    loaded = ShardIndex.load(out)
    assert loaded == built and loaded.counts == COUNTS
    assert [s.keys for s in loaded.shards] == [s.keys for s in built.shards]


def test_v1_files_still_load_and_equal_v2(built, paths, tmp_path):
    v1, v2 = str(tmp_path / "v1.json"), str(tmp_path / "v2.json.gz")
    built.save(v1, version=1)
    built.save(v2)
    with open(v1) as f:
        assert json.load(f)["version"] == 1
    a, b = ShardIndex.load(v1), ShardIndex.load(v2)
    assert a == b == built
    assert a.urls == b.urls == paths


def test_spans_are_loaded_only_for_the_shards_asked_and_the_cache_is_bounded(built, paths):
    out = default_index_url(paths)
    built.save(out)
    index = ShardIndex.load(out, cache_bytes=200)  # 16 bytes a sample: about one shard
    assert [s.loaded_bytes for s in index.shards] == [0] * len(COUNTS)
    assert index.shards[2].byte_range(3, 5) == built.shards[2].byte_range(3, 5)
    assert [s.loaded_bytes for s in index.shards] == [0, 0, 16 * 12, 0, 0]
    index.shards[4].byte_range(0, 9)
    assert [s.loaded_bytes for s in index.shards] == [0, 0, 0, 0, 16 * 9]  # shard 2 evicted


def test_a_missing_or_stale_sample_file_names_it(built, paths, tmp_path):
    out = default_index_url(paths)
    built.save(out)
    os.remove(sidecar_path(out, 3))
    shutil.copy(sidecar_path(out, 0), sidecar_path(out, 2))  # another shard's file
    index = ShardIndex.load(out)
    with pytest.raises(SidecarError, match=r"000000003\.spx: no such sample file"):
        index.shards[3].byte_range(0, 1)
    with pytest.raises(
        SidecarError, match=r"000000002\.spx: num_samples is 7 but the index says 12"
    ):
        index.shards[2].byte_range(0, 1)


def test_lookup_pickle_and_repeated_urls(built, paths, tmp_path, monkeypatch):
    out = default_index_url(paths)
    built.save(out)
    index = ShardIndex.load(out)
    monkeypatch.chdir(os.path.dirname(paths[0]))
    assert index.lookup("train-000003.tar") == 3 and index.lookup(paths[4]) == 4
    with pytest.raises(KeyError, match=r"other\.tar: not in the index"):
        index.lookup("other.tar")
    back = pickle.loads(pickle.dumps(index))
    assert back.positions(reversed(paths)).tolist() == [4, 3, 2, 1, 0]
    with open(out) as f:
        lines = f.read().splitlines()
    lines[3] = lines[2]  # shard 2 names the URL of shard 1
    bad = tmp_path / "d" / "bad.json"
    bad.write_text("\n".join(lines))
    with pytest.raises(
        ValueError, match=r"shards\[2\]\.url 'train-000001\.tar' repeats shards\[1\]"
    ):
        ShardIndex.load(str(bad))


def test_sharding_by_index_reads_the_same_over_v1_and_v2(built, paths, tmp_path):
    v1, v2 = str(tmp_path / "v1.json"), str(tmp_path / "v2.json")
    built.save(v1, version=1)
    built.save(v2)
    for readers in (1, 3, 7):
        for reader in range(readers):
            got = []
            for index in (v1, v2):
                dp = IterableWrapper(paths).sharding_by_index(index)
                apply_sharding(dp, readers, reader)
                got.append([(r, r.start, r.stop, r.offset, r.size) for r in dp])
            assert got[0] == got[1]


def test_a_state_saved_with_a_v1_index_resumes_with_the_v2_index(paths):
    out = default_index_url(paths)
    build_index(paths, progress=False).save(out, version=1)
    rs = MultiProcessingReadingService(num_workers=0)
    batches, states = uninterrupted(indexed_graph(paths), rs, epochs=1)
    write_index(paths, out, progress=False)  # the same dataset, now indexed as v2
    with open(out) as f:
        assert json.load(f)["version"] == 2
    k = len(batches) // 2
    got = resumed(
        indexed_graph(paths),
        MultiProcessingReadingService(num_workers=0),
        states[k],
        len(batches) - k,
    )
    assert got == batches[k:]


def test_write_index_resumes_without_reading_done_shards(paths, tmp_path):
    out = default_index_url(paths)
    last = paths[-1]
    keep = str(tmp_path / "keep.tar")
    shutil.copy(last, keep)
    with open(last, "r+b") as f:
        f.truncate(3000)
    scanned: list[str] = []
    with pytest.raises(ShardFormatError, match=r"train-000004\.tar: truncated"):
        write_index(paths, out, workers=1, progress=False, on_scanned=scanned.append)
    assert scanned == paths[:-1] and not os.path.exists(out)
    shutil.copy(keep, last)
    scanned.clear()
    report = write_index(paths, out, workers=2, progress=False, on_scanned=scanned.append)
    assert scanned == [last] and (report.scanned, report.reused) == (1, 4)
    assert ShardIndex.load(out) == build_index(paths, progress=False)
    # A shard rewritten with another size is read again; --rebuild reads everything.
    write_synthetic(os.path.dirname(paths[0]), shards=1, samples=3, payload_bytes=40)
    scanned.clear()
    report = write_index(paths, out, progress=False, on_scanned=scanned.append)
    assert scanned == [paths[0]] and ShardIndex.load(out).counts == [3, *COUNTS[1:]]
    assert write_index(paths, out, rebuild=True, progress=False).scanned == len(COUNTS)


def test_cli_adds_shards_to_an_existing_index(paths, capsys):
    out = default_index_url(paths)
    assert main(["index", *paths[:3], "-o", out, "--no-progress"]) == 0
    assert "(3 scanned, 0 already indexed)" in capsys.readouterr().out
    assert main(["index", paths[4], paths[0], paths[3], "-o", out, "--add", "--no-progress"]) == 0
    assert "indexed 5 shards" in capsys.readouterr().out
    index = ShardIndex.load(out)
    assert index.urls == [*paths[:3], paths[4], paths[3]]
    assert index == build_index([*paths[:3], paths[4], paths[3]], progress=False)
    # Without --add the index is the shards given, in that order: two moved, two read again.
    assert main(["index", *paths, "-o", out, "--no-progress"]) == 0
    assert "(2 scanned, 3 already indexed)" in capsys.readouterr().out
    assert ShardIndex.load(out).urls == paths


def test_cli_progress_bar_counts_done_shards(paths, capsys):
    out = default_index_url(paths)
    assert main(["index", *paths, "-o", out]) == 0
    capsys.readouterr()
    assert main(["index", *paths, "-o", out]) == 0
    captured = capsys.readouterr()
    assert "(0 scanned, 5 already indexed)" in captured.out
    assert "indexing" in captured.err and "5/5" in captured.err


def test_write_index_on_a_remote_filesystem(paths):
    urls = []
    for p in paths:
        url = f"memory://v2data/{os.path.basename(p)}"
        with open(p, "rb") as src, fsspec.open(url, "wb") as dst:
            dst.write(src.read())
        urls.append(url)
    out = "memory://v2data/train.index.json"
    report = write_index(urls, out, workers=3, progress=False)
    assert (report.scanned, report.reused, report.samples) == (5, 0, sum(COUNTS))
    index = ShardIndex.load(out)
    assert index.urls == urls and index == build_index(urls, progress=False)
    with fsspec.open(out, "rt") as f:
        assert json.load(f)["shards"][0]["url"] == "train-000000.tar"
    assert write_index(urls, out, progress=False).reused == 5


def test_lookup_of_shards_stored_absolute_and_as_file_urls(built, paths, tmp_path):
    out = str(tmp_path / "elsewhere" / "idx.json.gz")  # shards outside its folder: absolute
    built.save(out)
    index = ShardIndex.load(out)
    assert index.positions(paths[::-1]).tolist() == [4, 3, 2, 1, 0]
    assert index.lookup(f"file://{paths[2]}") == 2
    assert index.shards[2].byte_range(0, 12) == built.shards[2].byte_range(0, 12)


def test_inspect_names_the_file_version_and_reads_keys_from_sample_files(built, paths, capsys):
    out = default_index_url(paths)
    for version in (1, 2):
        built.save(out, version=version)
        assert main(["inspect", out, "-n", "1"]) == 0
        text = capsys.readouterr().out
        assert f"shardpipes index version {version}, 5 shards, {sum(COUNTS)} samples" in text
        assert "first key '000000_000000'" in text
