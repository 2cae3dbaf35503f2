"""open_clip's webdataset pipeline, copied as it is with one import changed, on 2 gloo ranks.

``tests/openclip_data.py`` is open_clip's ``get_wds_dataset`` and the stages it builds on
webdataset's internals (``ResampledShards2``, ``detshuffle2`` on ``filters._shuffle``,
``tarfile_to_samples_nothrow`` on ``tariterators.url_opener``/``tar_file_expander``/
``base_plus_ext``/``valid_sample``). It runs here, resampled and not, on two real gloo ranks
with two loader workers each, and every rank runs the same number of batches per epoch.
"""

from __future__ import annotations

import argparse
import io
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from _dist import run_ranks
from shardpipes.errors import ShardingWarning
from shardpipes.writer import ShardWriter

pytestmark = pytest.mark.distributed

SHARDS, PER_SHARD = 8, 7  # 56 samples


def _write(folder: str) -> str:
    pattern = os.path.join(folder, "laion-%05d.tar")
    with ShardWriter(pattern, maxcount=PER_SHARD) as sink:
        for i in range(SHARDS * PER_SHARD):
            buf = io.BytesIO()
            Image.fromarray(np.full((6, 6, 3), i, dtype=np.uint8)).save(buf, "JPEG")
            sink.write(
                {"__key__": f"{i:06d}", "jpg": buf.getvalue(), "txt": f"caption {i}".encode()}
            )
    return os.path.join(folder, f"laion-{{00000..{SHARDS - 1:05d}}}.tar")


def preprocess(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1)


def tokenizer(texts: str | list[str]) -> torch.Tensor:
    texts = [texts] if isinstance(texts, str) else texts
    return torch.tensor([[int(t.split()[-1])] for t in texts])


def _rank(rank: int, world: int, urls: str, resampled: bool) -> dict:
    import openclip_data

    if resampled:
        # ResampledShards2 (open_clip's own IterableDataset) draws shards in each reader by
        # design; the loader says once that the graph has no split, which is expected here.
        warnings.filterwarnings("ignore", category=ShardingWarning)

    args = argparse.Namespace(
        train_data=urls,
        val_data=None,
        dataset_resampled=resampled,
        train_num_samples=SHARDS * PER_SHARD,
        train_data_upsampling_factors=None,
        seed=0,
        workers=2,
        world_size=world,
        batch_size=4,
    )
    data = openclip_data.get_wds_dataset(
        args, preprocess, is_train=True, epoch=0, tokenizer=tokenizer
    )
    out = {"num_batches": data.dataloader.num_batches, "epochs": []}
    for epoch in range(2):
        data.set_epoch(epoch)
        ids, shapes = [], set()
        for images, texts in data.dataloader:
            shapes.add(tuple(images.shape))
            ids.append(texts[:, 0].tolist())
        out["epochs"].append({"ids": ids, "shapes": sorted(shapes)})
    data.dataloader.shutdown()
    return out


@pytest.mark.parametrize("resampled", [False, True], ids=["shard-list", "resampled"])
def test_get_wds_dataset_runs_on_two_ranks_with_equal_batch_counts(tmp_path, resampled):
    urls = _write(str(tmp_path))
    # fork: each rank is a plain process, as under torchrun, whose loader workers fork (open_clip's
    # pipeline holds a lambda, which only fork can hand to workers).
    results = run_ranks(_rank, 2, urls, resampled, timeout=600, start_method="fork")
    for epoch in range(2):
        counts = [len(r["epochs"][epoch]["ids"]) for r in results]
        assert counts[0] == counts[1] > 0  # equal batch counts on both ranks: no DDP hang
        for r in results:
            assert r["epochs"][epoch]["shapes"] == [(4, 3, 6, 6)]  # full batches of the images
            ids = [i for batch in r["epochs"][epoch]["ids"] for i in batch]
            assert set(ids) <= set(range(SHARDS * PER_SHARD))
    # open_clip's own arithmetic: 56 samples, global batch 8, 2 workers -> 4 batches per worker,
    # 8 per rank; with_epoch() rolls a worker over its data to fill them, as in webdataset.
    assert [r["num_batches"] for r in results] == [8, 8]
    assert [len(r["epochs"][e]["ids"]) for r in results for e in range(2)] == [8, 8, 8, 8]
    if not resampled:
        for epoch in range(2):
            seen = {i for r in results for b in r["epochs"][epoch]["ids"] for i in b}
            assert len(seen) >= 48  # each worker's 2 shards: 14 samples, 12 in full batches
        first = [b for r in results for b in r["epochs"][0]["ids"]]
        second = [b for r in results for b in r["epochs"][1]["ids"]]
        assert first != second  # detshuffle2 with the shared epoch: a new order
