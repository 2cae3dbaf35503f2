"""The two webdataset pipelines of a Lightning user who hit the nodesplitter error, on 2 gloo ranks.

Only the import changed: no nodesplitter, no epoch guess needed. Every rank yields the same
number of batches; without resampling no sample is read twice in an epoch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import shardpipes.webdataset as wds
from _dist import run_ranks
from _wds_data import write_image_shards

pytestmark = pytest.mark.distributed


def preprocess(sample):
    """Two crops per image: the sample becomes a small batch (hence unbatched() on the loader)."""
    img, meta = sample
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
    return torch.stack([x[:, :4, :4], x[:, 4:, 4:]]), torch.tensor([meta["id"], meta["id"]])


def pipeline_resampled(rank, world, urls, bs, epochs):
    dataset = (
        wds.WebDataset(urls, resampled=True)
        .shuffle(1000)
        .decode("rgb")
        .to_tuple("png", "json")
        .map(preprocess)
        .with_epoch(6)
    )
    loader = (
        wds.WebLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
        .unbatched()
        .shuffle(1000)
        .batched(bs)
    )
    counts = []
    try:
        for _ in range(epochs):
            n = 0
            for x, y in loader:
                assert x.shape[1:] == (3, 4, 4) and len(y) == len(x)
                n += 1
            counts.append(n)
    finally:
        loader.shutdown()
    return counts


def to_tensor(img):
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def meta_id(meta):
    return meta["id"]


def pipeline_equalized(rank, world, urls, bs, dataset_size, equalize):
    dataset = (
        wds.WebDataset(urls)
        .decode("pil")
        .to_tuple("png", "json")
        .map_tuple(to_tensor, meta_id)
        .shuffle(5000)
        .batched(bs, partial=False)
    )
    loader = wds.WebLoader(dataset, num_workers=2, multiprocessing_context="fork")
    if equalize:
        loader = loader.ddp_equalize(dataset_size // bs)
    ids, counts = [], []
    try:
        for _ in range(2):
            n = 0
            for x, y in loader:
                assert x.shape == (1, bs, 3, 8, 8)  # WebLoader's default batch_size=1, as torch's
                ids.extend(int(i) for i in y[0])
                n += 1
            counts.append(n)
    finally:
        loader.shutdown()
    gathered = [None] * world
    dist.all_gather_object(gathered, ids)
    return counts, gathered, (len(loader) if equalize else None)


@pytest.mark.timeout(300)
def test_resampled_with_epoch_and_loader_rebatching_equal_on_ranks(tmp_path):
    urls = write_image_shards(tmp_path, shards=3, per_shard=5, exts=("png",))
    results = run_ranks(pipeline_resampled, 2, urls, 5, 2)
    # 2 workers x 6 samples x 2 crops = 24 rows per rank per epoch -> 5 batches (4 of 5, 1 of 4).
    assert results == [[5, 5], [5, 5]]


@pytest.mark.timeout(300)
def test_ddp_equalize_gives_the_requested_count_and_no_duplicates(tmp_path):
    urls = write_image_shards(tmp_path, shards=8, per_shard=6, exts=("png",))
    results = run_ranks(pipeline_equalized, 2, urls, 4, 48, True)
    for counts, _, length in results:
        assert counts == [6, 6] and length == 6  # 48 // 4 batches split over 2 ranks
    gathered = results[0][1]
    epoch_ids = [ids[: 6 * 4] for ids in gathered]  # each rank's first epoch
    flat = [i for ids in epoch_ids for i in ids]
    assert len(flat) == len(set(flat)) == 48  # every sample once across ranks


@pytest.mark.timeout(300)
def test_uneven_shards_without_equalize_still_equal_batches(tmp_path):
    # 7 shards for 2 ranks x 2 workers: webdataset would give ranks different counts (a hang).
    urls = write_image_shards(tmp_path, shards=7, per_shard=4, exts=("png",))
    results = run_ranks(pipeline_equalized, 2, urls, 2, 28, False)
    (c0, ids0, _), (c1, _, _) = results
    assert c0 == c1 and c0[0] > 0
    first = [i for ids in ids0 for i in ids[: c0[0] * 2]]
    assert len(first) == len(set(first))  # nothing read twice within the epoch


def epoch_ids(rank, world, urls, index):
    dataset = wds.WebDataset(urls, shardshuffle=100, index=index).decode().to_tuple("json")
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    epochs = []
    try:
        for _ in range(2):
            ids = [meta["id"] for (meta,) in loader]
            gathered = [None] * world
            dist.all_gather_object(gathered, ids)
            epochs.append(gathered)
    finally:
        loader.shutdown()
    return epochs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("with_index", [True, False], ids=["index", "shards"])
def test_index_covers_every_sample_once_per_epoch(tmp_path, with_index):
    from shardpipes.index import build_index, default_index_url
    from shardpipes.synthetic import write_synthetic

    urls = write_synthetic(tmp_path, shards=7, samples=4)  # 7 shards for 2 ranks x 2 workers
    index = None
    if with_index:
        build_index(urls, progress=False).save(default_index_url(urls))
    else:
        index = False
    epochs = run_ranks(epoch_ids, 2, urls, index)[0]
    for per_rank in epochs:
        assert len(per_rank[0]) == len(per_rank[1])  # equal on both ranks, always
        seen = per_rank[0] + per_rank[1]
        assert len(seen) == len(set(seen))  # never a sample twice
        if with_index:
            assert sorted(seen) == list(range(28))  # and with the index, every sample
