"""shardpipes.webdataset: webdataset 1.x's API, sample format, decoding table and stages."""

from __future__ import annotations

import io
import os
import pickle
import warnings

import numpy as np
import PIL.Image
import pytest
import torch
from torch.utils.data import IterDataPipe

import shardpipes.webdataset as wds
from _wds_data import encode, image, write_image_shards
from shardpipes.errors import SkippedInputWarning
from shardpipes.synthetic import write_synthetic
from shardpipes.webdataset import autodecode


@pytest.fixture
def img_shards(tmp_path):
    return write_image_shards(tmp_path, shards=3, per_shard=4, gray_every=3, exts=("jpg", "png"))


def test_samples_have_webdataset_format(img_shards):
    [sample] = list(wds.WebDataset(img_shards[0], shardshuffle=False).slice(1))
    assert sorted(sample) == ["__key__", "__url__", "cls", "jpg", "json", "txt"]
    assert sample["__key__"] == "s00000"
    assert sample["__url__"] == img_shards[0]
    assert isinstance(sample["jpg"], bytes)


def test_webdataset_is_a_datapipe_with_one_sharding_filter(img_shards):
    ds = wds.WebDataset(img_shards, shardshuffle=100).decode("pil").to_tuple("jpg;png", "cls")
    assert isinstance(ds, IterDataPipe)
    from torch.utils.data.graph import traverse_dps
    from torch.utils.data.graph_settings import get_all_graph_pipes

    from shardpipes.datapipes.iter import ShardingFilter, TarArchiveLoader

    pipes = get_all_graph_pipes(traverse_dps(ds))
    assert sum(isinstance(p, ShardingFilter) for p in pipes) == 1
    assert sum(isinstance(p, TarArchiveLoader) for p in pipes) == 1
    assert len(pickle.loads(pickle.dumps(ds)).pipeline) == len(ds.pipeline)


def test_readme_example_fluid(img_shards):
    # webdataset README: WebDataset(url).shuffle(1000).decode("torchrgb").to_tuple("jpg;png", "json")
    dataset = (
        wds.WebDataset(img_shards, shardshuffle=100)
        .shuffle(1000)
        .decode("torchrgb")
        .to_tuple("jpg;png", "json")
    )
    images = list(dataset)
    assert len(images) == 12
    x, meta = images[0]
    assert x.dtype == torch.float32 and x.shape == (3, 8, 8)
    assert sorted(m["id"] for _, m in images) == list(range(12))


def test_readme_example_datapipeline(img_shards):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(img_shards),
        wds.shuffle(100),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.shuffle(1000),
        wds.decode("torchrgb"),
        wds.to_tuple("jpg;png", "json"),
        wds.batched(4),
    )
    batches = list(dataset)
    assert [b[0].shape for b in batches] == [(4, 3, 8, 8)] * 3
    assert sorted(m["id"] for b in batches for m in b[1]) == list(range(12))


def test_readme_example_webloader(img_shards):
    dataset = (
        wds.WebDataset(img_shards, shardshuffle=100)
        .shuffle(100)
        .decode("torchrgb")
        .to_tuple("jpg;png", "cls")
        .batched(2)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    loader = loader.unbatched().shuffle(100).batched(3)
    try:
        batches = list(loader)
    finally:
        loader.shutdown()
    assert [len(b[1]) for b in batches] == [3, 3, 3, 3]
    assert batches[0][0].shape == (3, 3, 8, 8)


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        ("pil", lambda v: isinstance(v, PIL.Image.Image) and v.mode == "RGB"),
        ("pilrgb", lambda v: isinstance(v, PIL.Image.Image) and v.mode == "RGB"),
        ("pill", lambda v: isinstance(v, PIL.Image.Image) and v.mode == "L"),
        ("pilrgba", lambda v: isinstance(v, PIL.Image.Image) and v.mode == "RGBA"),
        ("rgb8", lambda v: v.dtype == np.uint8 and v.shape == (8, 8, 3)),
        ("rgba8", lambda v: v.dtype == np.uint8 and v.shape == (8, 8, 4)),
        ("l8", lambda v: v.dtype == np.uint8 and v.shape == (8, 8)),
        ("rgb", lambda v: v.dtype == np.float32 and v.shape == (8, 8, 3) and v.max() <= 1.0),
        ("l", lambda v: v.dtype == np.float32 and v.shape == (8, 8)),
        ("torchrgb8", lambda v: v.dtype == torch.uint8 and v.shape == (3, 8, 8)),
        ("torchrgb", lambda v: v.dtype == torch.float32 and v.shape == (3, 8, 8)),
        ("torch", lambda v: v.dtype == torch.float32 and v.shape == (3, 8, 8)),
        ("torchl", lambda v: v.dtype == torch.float32 and v.shape == (8, 8)),
        ("torchl8", lambda v: v.dtype == torch.uint8 and v.shape == (8, 8)),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
@pytest.mark.parametrize("gray", [False, True], ids=["rgb-file", "gray-file"])
def test_image_specs_convert_like_webdataset(spec, check, gray):
    data = encode(image(3, gray=gray), "PNG")
    value = autodecode.Decoder([autodecode.imagehandler(spec)]).decode(
        {"__key__": "k", "png": data}
    )["png"]
    assert check(value)


def test_decode_values_match_pil_conversion():
    data = encode(image(1, gray=True), "PNG")
    out = wds.Decoder([wds.imagehandler("rgb8")]).decode({"png": data})["png"]
    expected = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    assert (out == expected).all()
    f = wds.Decoder([wds.imagehandler("rgb")]).decode({"png": data})["png"]
    assert np.allclose(f, expected.astype(np.float32) / 255.0)


def test_basic_decoders_and_unknown_fields_stay_bytes():
    sample = {"__key__": b"k", "cls": b"7", "txt": b"hi", "json": b'{"a": 1}', "seg.bin": b"\x00"}
    out = wds.Decoder([]).decode(sample)
    assert out == {"__key__": "k", "cls": 7, "txt": "hi", "json": {"a": 1}, "seg.bin": b"\x00"}


def test_pickle_is_refused_by_default():
    with pytest.raises(wds.DecodingError) as info:
        wds.Decoder([]).decode({"__key__": "k", "pyd": pickle.dumps(1)})
    assert "enforce_security" in str(info.value.__cause__)


def test_handler_functions_and_handle_extension():
    dec = wds.Decoder(
        [wds.handle_extension("seg.png", lambda d: "seg"), wds.handle_extension("png", len)]
    )
    out = dec.decode({"x.seg.png": b"abc", "png": b"abcd"})
    assert out == {"x.seg.png": "seg", "png": 4}


def test_to_tuple_alternatives_and_rename(img_shards):
    ds = (
        wds.WebDataset(img_shards, shardshuffle=False)
        .rename(image="jpg;png", label="cls")
        .to_tuple("image label")
    )
    pairs = list(ds)
    assert len(pairs) == 12 and all(isinstance(img, bytes) for img, _ in pairs)
    assert [int(lbl) for _, lbl in pairs] == [i % 5 for i in range(12)]


def test_to_tuple_missing_field_names_it():
    with pytest.raises(ValueError, match=r"didn't find \['foo'\]"):
        list(wds.to_tuple("foo")(iter([{"bar": 1}])))


def test_map_dict_map_tuple_select_slice(img_shards):
    ds = (
        wds.WebDataset(img_shards, shardshuffle=False)
        .decode()
        .map_dict(cls=lambda c: c * 10)
        .select(lambda s: s["cls"] > 0)
        .to_tuple("cls", "txt")
        .map_tuple(None, str.upper)
        .slice(3)
    )
    assert list(ds) == [(10, "CAPTION 1"), (20, "CAPTION 2"), (30, "CAPTION 3")]


def test_batched_partial_and_unbatched():
    src = [(i, np.ones(2) * i) for i in range(5)]
    full = list(wds.batched(2, partial=False)(iter(src)))
    assert [len(b[0]) for b in full] == [2, 2]
    assert full[0][1].shape == (2, 2)
    back = list(wds.unbatched()(iter(list(wds.batched(2)(iter(src))))))
    assert [int(x) for x, _ in back] == list(range(5))


@pytest.mark.parametrize(
    ("handler", "expected", "warns"),
    [
        (wds.ignore_and_continue, ["a", "c"], False),
        (wds.warn_and_continue, ["a", "c"], True),
        (wds.ignore_and_stop, ["a"], False),
        (wds.warn_and_stop, ["a"], True),
    ],
    ids=["ignore_and_continue", "warn_and_continue", "ignore_and_stop", "warn_and_stop"],
)
def test_handlers(handler, expected, warns):
    def fail_on_b(x):
        if x == "b":
            raise ValueError("bad b")
        return x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = list(wds.map(fail_on_b, handler=handler)(iter("abc")))
    assert out == expected
    assert any(issubclass(w.category, SkippedInputWarning) for w in caught) == warns


def test_reraise_exception():
    with pytest.raises(ValueError, match="bad"):
        list(wds.map(lambda x: (_ for _ in ()).throw(ValueError("bad")))(iter([1])))


def test_corrupt_shard_with_handler_is_skipped(tmp_path):
    good = write_synthetic(tmp_path / "g", shards=1, samples=5)[0]
    bad = os.fspath(tmp_path / "bad.tar")
    with open(good, "rb") as f, open(bad, "wb") as g:
        g.write(f.read()[:1500])  # cut inside the second member
    ds = wds.WebDataset([good, bad], shardshuffle=False, handler=wds.ignore_and_continue)
    assert len(list(ds)) >= 5
    with pytest.raises(Exception, match="bad.tar"):
        list(wds.WebDataset([good, bad], shardshuffle=False))


def test_with_epoch_and_repeat(img_shards):
    ds = wds.WebDataset(img_shards, shardshuffle=False).with_epoch(30)
    assert len(list(ds)) == 30
    assert len(list(wds.WebDataset(img_shards, shardshuffle=False).repeat(2))) == 24


def test_with_length_sets_len(img_shards):
    with pytest.warns(UserWarning, match="does not change"):
        ds = wds.WebDataset(img_shards, shardshuffle=False).with_length(99)
    assert len(ds) == 99


def test_resampled_pass_holds_every_shard_once(img_shards):
    urls = [s["url"] for s in wds.ResampledShards(img_shards, nshards=9)]
    assert [sorted(urls[i : i + 3]) for i in (0, 3, 6)] == [sorted(img_shards)] * 3


def test_empty_dataset_raises_for_one_reader(tmp_path):
    [path] = write_synthetic(tmp_path, shards=1, samples=0)
    with pytest.raises(ValueError, match="No samples found"):
        list(wds.WebDataset(path, shardshuffle=False))
    assert list(wds.WebDataset(path, shardshuffle=False, empty_check=False)) == []


def test_custom_nodesplitter_is_ignored_with_a_warning(img_shards):
    with pytest.warns(UserWarning, match="nodesplitter=my_split.*is ignored"):

        def my_split(src):
            yield from src

        wds.WebDataset(img_shards, nodesplitter=my_split)


def test_tarwriter_and_shardwriter_round_trip(tmp_path):
    pattern = os.fspath(tmp_path / "out-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=3, verbose=0) as sink:
        for i in range(7):
            sink.write(
                {"__key__": f"k{i}", "cls": i, "png": image(i), "json": {"i": i}, "txt": "t"}
            )
    names = sorted(os.listdir(tmp_path))
    assert names == ["out-000.tar", "out-001.tar", "out-002.tar"]
    got = list(
        wds.WebDataset(os.fspath(tmp_path / "out-{000..002}.tar"), shardshuffle=False).decode(
            "rgb8"
        )
    )
    assert [s["cls"] for s in got] == list(range(7))
    assert (got[2]["png"] == image(2)).all()
    assert got[3]["json"] == {"i": 3}
    with wds.TarWriter(os.fspath(tmp_path / "one.tgz")) as sink:
        sink.write({"__key__": "a", "txt": "hello"})
    assert [
        s["txt"]
        for s in wds.WebDataset(os.fspath(tmp_path / "one.tgz"), shardshuffle=False).decode()
    ] == ["hello"]


def test_cache_dir_is_accepted_and_checked(tmp_path, img_shards):
    cache = tmp_path / "cache"
    cache.mkdir()
    ds = wds.WebDataset(img_shards, shardshuffle=False, cache_dir=os.fspath(cache)).to_tuple("cls")
    assert len(list(ds)) == 12  # local shards pass through the cache unchanged
    with pytest.raises(ValueError, match="does not exist"):
        wds.WebDataset(img_shards, cache_dir=os.fspath(tmp_path / "missing"))


def test_loader_with_epoch_and_ddp_equalize_single_process(img_shards):
    dataset = wds.WebDataset(img_shards, shardshuffle=10).to_tuple("cls").batched(5)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    try:
        assert sum(len(b[0]) for b in loader) == 12  # a plain epoch: one pass
        equal = loader.ddp_equalize(5)  # a new loader sharing the workers
        assert len(equal) == 5 and len(list(equal)) == 5
        loader.with_epoch(7)  # in place, as webdataset's
        assert [len(list(loader)) for _ in range(2)] == [7, 7]  # repeats the data
    finally:
        loader.shutdown()


def test_webloader_default_batch_size_collates_like_torch(img_shards):
    loader = wds.WebLoader(
        wds.WebDataset(img_shards, shardshuffle=False).decode().to_tuple("cls"), batch_size=4
    )
    try:
        batches = list(loader)
    finally:
        loader.shutdown()
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 0, 1, 2], [3, 4, 0, 1]]
