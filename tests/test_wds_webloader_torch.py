"""``WebLoader`` converts and takes its arguments as torch's ``DataLoader``, which it replaces.

webdataset's ``WebLoader`` *is* a torch ``DataLoader``: with ``batch_size=None`` torch passes
each item through ``default_convert`` (numpy arrays become tensors), with a ``batch_size``
through ``default_collate``. Code relies on it (webdataset's Lightning ImageNet example feeds the
labels straight to ``cross_entropy``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardpipes.webdataset as wds
from shardpipes.writer import ShardWriter


@pytest.fixture
def shards(tmp_path):
    pattern = os.path.join(tmp_path, "s-%02d.tar")
    with ShardWriter(pattern, maxcount=5) as sink:
        for i in range(13):
            sink.write({"__key__": f"{i:03d}", "cls": str(i % 3).encode(), "x.npy": _npy(i)})
    return os.path.join(tmp_path, "s-{00..02}.tar")


def _npy(i: int) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.full((2,), i, dtype=np.float32))
    return buf.getvalue()


def _as_pair(sample: dict) -> tuple[np.ndarray, np.ndarray]:
    return sample["x.npy"], np.array(sample["cls"])


def _dataset(urls: str) -> wds.WebDataset:
    return wds.WebDataset(urls, shardshuffle=False).decode().map(_as_pair)


def _pid(item: object) -> tuple[object, int]:
    return item, os.getpid()


def test_batch_size_none_converts_as_torch_does(shards):
    ours = list(wds.WebLoader(_dataset(shards), batch_size=None))
    torchs = list(DataLoader(_dataset(shards), batch_size=None))
    assert len(ours) == len(torchs) == 13
    for (x, y), (tx, ty) in zip(ours, torchs, strict=True):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert torch.equal(x, tx) and torch.equal(y, ty)
    # ... so the loss takes the labels, as in webdataset's Lightning ImageNet example
    logits = torch.zeros(1, 3)
    assert torch.nn.functional.cross_entropy(logits, ours[4][1].reshape(1)).item() > 0


def test_a_batch_size_collates_as_torch_does(shards):
    ours = list(wds.WebLoader(_dataset(shards), batch_size=4))
    torchs = list(DataLoader(_dataset(shards), batch_size=4))
    assert [len(b[0]) for b in ours] == [4, 4, 4, 1]
    for (x, y), (tx, ty) in zip(ours, torchs, strict=True):
        assert torch.equal(x, tx) and torch.equal(y, ty)


def _first(item: tuple[np.ndarray, np.ndarray]) -> str:
    return f"item {item[1]}"


def test_collate_fn_applies_to_each_item_without_a_batch_size(shards):
    got = list(wds.WebLoader(_dataset(shards), batch_size=None, collate_fn=_first))
    assert got[:3] == ["item 0", "item 1", "item 2"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefetch_factor": 2},
        {"persistent_workers": True},
        {"batch_size": None, "drop_last": True},
        {"num_workers": 2, "prefetch_factor": -1},
        {"timeout": -1},
    ],
    ids=[
        "prefetch-without-workers",
        "persistent-without-workers",
        "drop-last-no-batch",
        "negative-prefetch",
        "timeout",
    ],
)
def test_arguments_are_refused_as_torch_refuses_them(shards, kwargs):
    with pytest.raises(ValueError) as torch_error:
        DataLoader(_dataset(shards), **kwargs)
    with pytest.raises(ValueError, match="^" + torch_error.value.args[0][:40].replace("(", r"\(")):
        wds.WebLoader(_dataset(shards), **kwargs)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "new-workers"])
def test_persistent_workers_as_torch(shards, persistent):
    ds = wds.WebDataset(shards, shardshuffle=False).shuffle(20).map(_pid)
    loader = wds.WebLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=persistent, seed=3, collate_fn=_keep
    )
    epochs = [list(loader) for _ in range(3)]
    keys = [[s["__key__"] for s, _ in e] for e in epochs]
    pids = [{pid for _, pid in e} for e in epochs]
    assert all(sorted(k) == [f"{i:03d}" for i in range(13)] for k in keys)
    assert keys[0] != keys[1]  # a new order each epoch either way
    if persistent:
        assert pids[0] == pids[1] == pids[2]
    else:
        assert not pids[0] & pids[1] and not pids[1] & pids[2]  # new worker processes
    loader.shutdown()
    again = wds.WebLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=not persistent,
        seed=3,
        collate_fn=_keep,
    )
    assert [[s["__key__"] for s, _ in list(again)] for _ in range(3)] == keys  # the same epochs
    again.shutdown()


def _keep(item: object) -> object:
    return item


def test_pin_memory_passes_the_data_through(shards):
    plain = list(wds.WebLoader(_dataset(shards), batch_size=4))
    with pytest.warns(UserWarning, match="pin_memory"):
        pinned = list(wds.WebLoader(_dataset(shards), batch_size=4, pin_memory=True))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, pinned, strict=True))
