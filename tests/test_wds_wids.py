"""wids compatibility: ShardListDataset over the shardpipes index, and the chunked samplers."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader

from _dist import run_ranks
from _wds_data import write_image_shards
from shardpipes.index import build_index, default_index_url
from shardpipes.webdataset.wids import ChunkedSampler, DistributedChunkedSampler, ShardListDataset


@pytest.fixture
def shards(tmp_path):
    return write_image_shards(tmp_path, shards=3, per_shard=5, gray_every=4)


def descriptor(tmp_path, urls, counts):
    path = os.fspath(tmp_path / "train.json")
    doc = {
        "name": "t",
        "shardlist": [
            {"url": os.path.basename(u), "nsamples": n} for u, n in zip(urls, counts, strict=True)
        ],
    }
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def test_descriptor_len_getitem_and_transform(tmp_path, shards):
    ds = ShardListDataset(descriptor(tmp_path, shards, [5, 5, 5]))
    assert len(ds) == 15
    sample = ds[7]
    assert (
        sample["__key__"] == "s00007" and sample["__index__"] == 7 and sample["__shardindex__"] == 2
    )
    assert sample[".cls"] == 7 % 5 and sample[".txt"] == "caption 7"
    assert sample[".jpg"].size == (8, 8)  # opened with PIL, as wids' default "PIL" decoding
    ds.add_transform(lambda s: s[".json"]["id"])
    assert [ds[i] for i in (0, 14, -1)] == [0, 14, 14]
    with pytest.raises(IndexError, match="outside"):
        ds[15]


def test_list_of_shards_and_the_shardpipes_index(tmp_path, shards):
    index = build_index(shards, progress=False)
    index.save(default_index_url(shards))
    ds = ShardListDataset([{"url": u, "nsamples": 5} for u in shards], transformations=[])
    assert ds[11]["__key__"] == "s00011"
    assert ds.get_stats() == (1, 1)  # the sidecar index gave the offsets: no scan
    by_index = ShardListDataset(default_index_url(shards), transformations=[])
    assert len(by_index) == 15 and by_index[3][".cls"].read() == b"3"


def test_wrong_nsamples_is_named(tmp_path, shards):
    ds = ShardListDataset([{"url": shards[0], "nsamples": 6}], transformations=[])
    with pytest.raises(ValueError, match="has 5 samples, the shard list says 6"):
        ds[0]


def test_chunked_sampler_covers_every_index_and_reshuffles():
    s = ChunkedSampler(range(23), chunksize=5, seed=1)
    first, second = list(s), list(s)
    assert sorted(first) == sorted(second) == list(range(23))
    assert first != second


def _notebook(rank, world, path):
    ds = ShardListDataset(path)
    ds.add_transform(lambda s: s[".json"]["id"])
    loader = DataLoader(
        ds, batch_size=2, sampler=DistributedChunkedSampler(ds, chunksize=4), num_workers=0
    )
    ids = [int(i) for batch in loader for i in batch]
    gathered = [None] * world
    dist.all_gather_object(gathered, ids)
    return len(loader), gathered


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_notebook_dataloader_with_distributed_chunked_sampler(tmp_path):
    urls = write_image_shards(tmp_path, shards=3, per_shard=5)
    path = descriptor(tmp_path, urls, [5, 5, 5])
    (n0, ids), (n1, _) = run_ranks(_notebook, 2, path)
    assert n0 == n1 == 4  # 15 samples: 8 per rank (one repeated), 4 batches each
    assert len(ids[0]) == len(ids[1]) == 8
    assert set(ids[0]) | set(ids[1]) == set(range(15))


@pytest.mark.http
def test_remote_sample_is_one_range_request(http_server, tmp_path):
    [path] = write_image_shards(tmp_path, shards=1, per_shard=6)
    with open(path, "rb") as f:
        url = http_server.add("img-000000.tar", f.read())
    ds = ShardListDataset([{"url": url, "nsamples": 6}], transformations=[])
    info = build_index([path], progress=False).shards[0]
    ds[0]  # the first access scans the shard once (no index next to it)
    before = len(http_server.log.gets("img-000000"))
    sample = ds[4]
    assert sample["__key__"] == "s00004" and sample[".txt"].read() == b"caption 4"
    ranges = [g.range for g in http_server.log.gets("img-000000")[before:]]
    offset, size = info.byte_range(4, 5)
    assert ranges == [f"bytes={offset}-{offset + size - 1}"]


@pytest.mark.s3
@pytest.mark.parametrize("kind", ["wids descriptor", "shardpipes index"])
def test_remote_descriptor_and_index_are_read_with_the_storage_options(
    s3, tmp_path, shards, monkeypatch, kind
):
    """The descriptor (or index file) and the sidecar index are read with ``storage_options``.

    The environment points S3 at a closed port and holds no credentials: only the options
    passed to ShardListDataset reach the server, so a read without them fails.
    """
    names = [os.path.basename(u) for u in shards]
    files = {n: pathlib.Path(u).read_bytes() for n, u in zip(names, shards, strict=True)}
    files["train.json"] = json.dumps(
        {"shardlist": [{"url": n, "nsamples": 5} for n in names]}
    ).encode()
    urls = s3.put("data", files)
    if kind == "shardpipes index":
        remote = build_index(urls[:3], storage_options=s3.options(), progress=False)
        remote.save("s3://data/train.index.json", storage_options=s3.options())
        source = "s3://data/train.index.json"
    else:
        source = "s3://data/train.json"
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
    ds = ShardListDataset(source, storage_options=s3.options(), transformations=[])
    assert len(ds) == 15
    sample = ds[7]
    assert sample["__key__"] == "s00007" and sample[".cls"].read() == b"2"
    assert sample["__shard__"] == urls[1]
