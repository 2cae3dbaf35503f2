"""Real webdataset loaders with one import changed: a CLIP-style loader and an ImageNet DataModule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardpipes.webdataset as wds
from _wds_data import write_image_shards


def to_chw(img):
    return torch.from_numpy(np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0)


def clip_preprocess(sample):
    return to_chw(sample["image"]), sample["text"]


def clip_loader(urls, seed, epoch_batches):
    """The CLIP/open_clip shape: seeded shard shuffle, pilrgb, rename with alternatives, with_epoch."""
    dataset = (
        wds.WebDataset(urls, shardshuffle=100, seed=seed, detshuffle=True)
        .shuffle(50)
        .decode("pilrgb")
        .rename(image="jpg;png;jpeg;webp", text="txt")
        .map(clip_preprocess)
        .batched(4, partial=False)
        .with_epoch(epoch_batches)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=2, seed=seed)


@pytest.fixture
def clip_shards(tmp_path):
    return write_image_shards(
        tmp_path, shards=4, per_shard=8, gray_every=5, exts=("jpg", "png", "jpeg", "webp")
    )


def _epochs(loader, n):
    try:
        return [[caption for _, texts in loader for caption in texts] for _ in range(n)]
    finally:
        loader.shutdown()


def test_clip_loader_epochs_are_fixed_seeded_and_differ(clip_shards):
    first = _epochs(clip_loader(clip_shards, seed=3, epoch_batches=5), 2)
    again = _epochs(clip_loader(clip_shards, seed=3, epoch_batches=5), 2)
    other = _epochs(clip_loader(clip_shards, seed=4, epoch_batches=5), 1)
    assert [len(e) for e in first] == [2 * 5 * 4, 2 * 5 * 4]  # 2 workers x 5 batches x 4
    assert first == again  # the same seed: the same batches, epoch after epoch
    assert first[0] != first[1]  # a new order each epoch
    assert first[0] != other[0]
    # 32 samples and 40 per epoch: every caption appears, drawn from all shards.
    assert {c for c in first[0]} == {f"caption {i}" for i in range(32)}


def test_clip_images_are_rgb_whatever_the_file(clip_shards):
    ds = (
        wds.WebDataset(clip_shards, shardshuffle=False)
        .decode("pilrgb")
        .rename(image="jpg;png;jpeg;webp", text="txt")
    )
    samples = list(ds)
    assert len(samples) == 32
    assert {s["image"].mode for s in samples} == {"RGB"}
    assert {s["image"].size for s in samples} == {(8, 8)}


# --- ImageNet DataModule: shards with some grayscale JPEGs --------------------------------------


def imagenet_transform(img):
    return to_chw(img.resize((6, 6)))


class ImageNetData:
    """The shape of an ImageNet LightningDataModule ported by changing the import."""

    def __init__(self, urls, batch_size, workers):
        self.urls, self.batch_size, self.workers = urls, batch_size, workers

    def train_dataloader(self):
        dataset = (
            wds.WebDataset(self.urls, shardshuffle=100, seed=0)
            .shuffle(100)
            .decode("pil")
            .to_tuple("jpg", "cls", "json")
            .map_tuple(imagenet_transform, None, None)
            .batched(self.batch_size, partial=False)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=self.workers)


def test_imagenet_datamodule_with_grayscale_jpegs(tmp_path):
    urls = write_image_shards(tmp_path, shards=4, per_shard=10, gray_every=3)
    loader = ImageNetData(urls, batch_size=5, workers=2).train_dataloader()
    try:
        batches = list(loader)
    finally:
        loader.shutdown()
    assert all(x.shape == (5, 3, 6, 6) for x, _, _ in batches)  # grayscale files come out RGB
    ids = sorted(m["id"] for _, _, metas in batches for m in metas)
    assert ids == list(range(40))
    assert any(m["gray"] for _, _, metas in batches for m in metas)


def test_pil_decode_is_rgb_for_grayscale_jpeg(tmp_path):
    urls = write_image_shards(tmp_path, shards=1, per_shard=3, gray_every=1)
    [img] = [s["jpg"] for s in wds.WebDataset(urls, shardshuffle=False).decode("pil").slice(1)]
    assert img.mode == "RGB"
    [arr] = [s["jpg"] for s in wds.WebDataset(urls, shardshuffle=False).decode("l8").slice(1)]
    assert arr.shape == (8, 8)


def _main_shuffled(urls, seed, passes):
    dataset = wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__").batched(4)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=0, seed=seed)
    loader = loader.unbatched().shuffle(16).batched(4)
    return [[key for batch in loader for key in batch[0]] for _ in range(passes)]


def test_a_shuffle_on_the_loader_is_seeded_by_the_loader(clip_shards):
    first = _main_shuffled(clip_shards, seed=3, passes=2)
    again = _main_shuffled(clip_shards, seed=3, passes=2)
    other = _main_shuffled(clip_shards, seed=4, passes=1)
    plain = [k[0] for k in wds.WebDataset(clip_shards, shardshuffle=False).to_tuple("__key__")]
    assert sorted(first[0]) == sorted(first[1]) == sorted(plain)  # every sample, once
    assert first[0] != plain  # shuffled
    assert first == again  # the same seed: the same order, run after run
    assert first[0] != first[1]  # a new order each pass
    assert first[0] != other[0]
