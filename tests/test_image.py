"""Decoding images with less work: exact mode is bit-identical to a full decode + resize, fast
mode stays close, the random crop stage is deterministic, and bad images raise."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from shardpipes.datapipes.iter import IterableWrapper, RandomResizedCropDecoder
from shardpipes.errors import DecodeError
from shardpipes.formats import image as fi


def _photo(width: int, height: int, seed: int, mode: str = "RGB", quality: int = 90) -> bytes:
    """A JPEG with photo-like content: gradients, a fractal and noise (no flat areas)."""
    rng = np.random.default_rng(seed)
    fractal = Image.effect_mandelbrot((width, height), (-2 + seed * 0.1, -1.2, 1, 1.2), 60)
    radial = Image.radial_gradient("L").resize((width, height))
    noise = Image.fromarray(rng.integers(0, 255, (height, width), dtype=np.uint8))
    img = Image.merge("RGB", (fractal, radial, Image.blend(noise, fractal, 0.7)))
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


PHOTOS = [
    _photo(500, 375, 1),
    _photo(375, 500, 2),
    _photo(333, 251, 3),  # not a multiple of the 16-pixel MCU
    _photo(640, 480, 4, quality=75),
    _photo(300, 220, 5, mode="L"),  # greyscale
]


def _reference(data: bytes, box, size) -> np.ndarray:
    full = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(full.resize(size, Image.Resampling.BILINEAR, box=box))


@pytest.mark.parametrize("index", range(len(PHOTOS)))
def test_exact_crop_is_bit_identical_to_a_full_decode_and_resize(index):
    data = PHOTOS[index]
    rng = random.Random(index)
    width, height = Image.open(io.BytesIO(data)).size
    boxes = [fi.random_resized_crop_box(rng, width, height) for _ in range(40)]
    boxes += [(0, 0, width, height), (0, 0, 10, 10), (width - 7, height - 5, width, height)]
    for box in boxes:
        for size in ((224, 224), (64, 48)):
            got = np.asarray(fi.decode_crop(data, size, box, exact=True))
            np.testing.assert_array_equal(got, _reference(data, box, size), err_msg=str(box))


def test_exact_tensor_equals_the_exact_pixels_normalised():
    data = PHOTOS[0]
    box = (40, 30, 300, 290)
    ref = _reference(data, box, (224, 224)).astype(np.float64) / 255
    mean, std = np.array(fi.IMAGENET_MEAN), np.array(fi.IMAGENET_STD)
    want = ((ref - mean) / std).transpose(2, 0, 1)
    got = fi.decode_crop_tensor(data, (224, 224), box, exact=True, mean=mean, std=std)
    assert got.dtype == torch.float32 and got.shape == (3, 224, 224) and got.is_contiguous()
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    flipped = fi.decode_crop_tensor(data, (224, 224), box, exact=True, flip=True)
    mirrored = _reference(data, box, (224, 224)).transpose(2, 0, 1)[:, :, ::-1]
    assert flipped.dtype == torch.uint8
    np.testing.assert_array_equal(flipped.numpy(), mirrored)


@pytest.mark.parametrize("index", range(len(PHOTOS)))
def test_fast_crop_stays_close_to_the_exact_pixels(index):
    data = PHOTOS[index]
    rng = random.Random(100 + index)
    width, height = Image.open(io.BytesIO(data)).size
    for _ in range(20):
        box = fi.random_resized_crop_box(rng, width, height)
        ref = _reference(data, box, (224, 224)).astype(np.float64)
        got = fi.decode_crop_tensor(data, (224, 224), box).permute(1, 2, 0).numpy()
        mse = ((got - ref) ** 2).mean()
        assert got.dtype == np.uint8 and got.shape == (224, 224, 3)
        assert mse == 0 or 10 * np.log10(255**2 / mse) > 35, (box, mse)


def test_fast_mode_uses_dct_scaling_for_a_large_crop_and_stays_close():
    data = _photo(1200, 900, 7)
    box = (0, 0, 1200, 900)
    ref = _reference(data, box, (224, 168)).astype(np.float64)
    got = np.asarray(fi.decode_crop(data, (224, 168), box, exact=False)).astype(np.float64)
    mse = ((got - ref) ** 2).mean()
    assert mse > 0 and 10 * np.log10(255**2 / mse) > 30  # not the same path, but close
    img = Image.open(io.BytesIO(data))
    assert img.draft("RGB", (300, 225)) is not None  # the decoder can scale this file


def test_a_truncated_jpeg_raises_even_when_the_crop_is_above_the_cut():
    data = PHOTOS[0][: len(PHOTOS[0]) * 3 // 4]
    with pytest.raises(OSError, match="truncated"):
        fi.decode_crop(data, (32, 32), (0, 0, 50, 50))
    with pytest.raises(OSError, match="truncated"):
        fi.decode_crop_tensor(data, (32, 32), (0, 0, 50, 50))


def test_other_formats_take_the_full_decode():
    img = Image.open(io.BytesIO(PHOTOS[2])).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    box = (10, 10, 200, 150)
    got = np.asarray(fi.decode_crop(buf.getvalue(), (50, 40), box))
    np.testing.assert_array_equal(
        got, np.asarray(img.resize((50, 40), Image.Resampling.BILINEAR, box=box))
    )


def test_random_resized_crop_box_stays_inside_and_follows_scale_and_ratio():
    rng = random.Random(0)
    for _ in range(500):
        w, h = rng.randint(1, 900), rng.randint(1, 900)
        left, top, right, bottom = fi.random_resized_crop_box(rng, w, h)
        assert 0 <= left < right <= w and 0 <= top < bottom <= h


def _samples(n: int = 12) -> list[dict]:
    return [
        {"__key__": f"k{i}", "__url__": "mem://s.tar", ".jpg": PHOTOS[i % 4], ".cls": i}
        for i in range(n)
    ]


def test_stage_is_deterministic_per_seed_and_the_same_with_threads():
    def run(seed: int, threads: int) -> list[torch.Tensor]:
        dp = IterableWrapper(_samples()).decode_random_resized_crop(64, threads=threads)
        dp.set_seed(seed)
        return [s[".jpg"] for s in dp]

    a, b, c, d = run(1, 0), run(1, 0), run(1, 2), run(2, 0)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, d, strict=True))
    assert all(x.shape == (3, 64, 64) and x.dtype == torch.float32 for x in a)


def test_stage_keeps_other_fields_and_order_and_has_a_length():
    samples = _samples(5)
    dp = RandomResizedCropDecoder(IterableWrapper(samples), (32, 48), mean=None, std=None)
    out = list(dp)
    assert [s["__key__"] for s in out] == [s["__key__"] for s in samples]
    assert [s[".cls"] for s in out] == list(range(5))
    assert out[0][".jpg"].shape == (3, 32, 48) and out[0][".jpg"].dtype == torch.uint8
    assert len(dp) == 5
    assert samples[0][".jpg"] is PHOTOS[0]  # the input is not modified


def test_stage_exact_mode_matches_the_reference_for_its_own_box():
    (s,) = _samples(1)
    dp = IterableWrapper([s]).decode_random_resized_crop(
        40, exact=True, flip=False, mean=None, std=None
    )
    got = next(iter(dp))[".jpg"]
    # the same box the stage drew: a fresh Random with the same per-sample seed
    seed = random.Random(0).getrandbits(64)
    rng = random.Random(seed)
    box = fi.random_resized_crop_box(rng, 500, 375)
    np.testing.assert_array_equal(
        got.permute(1, 2, 0).numpy(), _reference(PHOTOS[0], box, (40, 40))
    )


def test_stage_raises_decode_error_naming_url_key_and_field():
    bad = {"__key__": "k9", "__url__": "mem://bad.tar", ".jpg": b"\xff\xd8\xff not a jpeg"}
    dp = IterableWrapper([bad]).decode_random_resized_crop(32)
    with pytest.raises(DecodeError, match=r"mem://bad.tar.*'\.jpg'.*'k9'"):
        list(dp)


@pytest.mark.parametrize(
    "kwargs",
    [{"size": 0}, {"scale": (0.5, 0.1)}, {"ratio": (0, 1)}, {"mean": (0.5,)}, {"threads": -1}],
)
def test_stage_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        IterableWrapper([]).decode_random_resized_crop(**kwargs)


def test_decode_takes_an_image_decoder_by_one_argument():
    samples = _samples(2)
    out = list(IterableWrapper(samples).decode(image=fi.ImageDecoder(100)))
    assert out[0][".jpg"].shape == (3, 100, 133)  # shorter side 100 of 500x375
    assert out[0][".jpg"].dtype == torch.uint8 and out[0][".cls"] == 0
    handler = fi.ImageDecoder((20, 10), output="numpy")
    assert handler("x.jpg", PHOTOS[1]).shape == (10, 20, 3)  # as a webdataset handler
    assert handler("x.txt", b"hello") is None


def test_the_header_walk_takes_plain_colour_jpegs_only():
    assert fi._jpeg_size(PHOTOS[0]) == (500, 375)
    assert fi._jpeg_size(PHOTOS[2]) == (333, 251)
    assert fi._jpeg_size(PHOTOS[4]) is None  # greyscale: Pillow opens it
    assert fi._jpeg_size(PHOTOS[0][:-100]) is None  # no EOI: the full decode raises
    cmyk = io.BytesIO()
    Image.open(io.BytesIO(PHOTOS[2])).convert("CMYK").save(cmyk, "JPEG")
    assert fi._jpeg_size(cmyk.getvalue()) is None
    box = (5, 5, 200, 180)
    got = fi.decode_crop_tensor(cmyk.getvalue(), (64, 64), box)  # through Pillow, still decoded
    ref = Image.open(io.BytesIO(cmyk.getvalue())).convert("RGB")
    want = np.asarray(ref.resize((64, 64), Image.Resampling.BILINEAR, box=box)).astype(float)
    assert ((got.permute(1, 2, 0).numpy() - want) ** 2).mean() < 30


def test_fast_tensor_of_a_large_crop_is_dct_scaled_and_close():
    data = _photo(1200, 900, 8)
    box = (100, 50, 1100, 850)  # 1000x800 to 224x224: decoded at 1/2 scale (s=2 keeps >= 224)
    ref = _reference(data, box, (224, 224)).astype(np.float64)
    got = fi.decode_crop_tensor(data, (224, 224), box).permute(1, 2, 0).numpy()
    mse = ((got - ref) ** 2).mean()
    assert mse > 0 and 10 * np.log10(255**2 / mse) > 30


def test_the_webdataset_front_end_decodes_with_an_image_decoder_by_one_argument(tmp_path):
    import tarfile

    import shardpipes.webdataset as wds

    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(PHOTOS[:3]):
            for name, value in ((f"k{i}.jpg", data), (f"k{i}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    ds = (
        wds.WebDataset(str(path), shardshuffle=False)
        .decode(fi.ImageDecoder(64))
        .to_tuple("jpg", "cls")
    )
    got = list(ds)
    assert [c for _, c in got] == [0, 1, 2]
    assert [tuple(x.shape) for x, _ in got] == [(3, 64, 85), (3, 85, 64), (3, 64, 84)]
    ref = (
        Image.open(io.BytesIO(PHOTOS[0])).convert("RGB").resize((85, 64), Image.Resampling.BILINEAR)
    )
    np.testing.assert_array_equal(got[0][0].permute(1, 2, 0).numpy(), np.asarray(ref))


def test_stage_refuses_images_decoded_before_it():
    (s,) = _samples(1)
    dp = IterableWrapper([s]).decode().decode_random_resized_crop(32)  # .decode() makes PIL images
    with pytest.raises(TypeError, match=r"'\.jpg' of sample 'k0' is a JpegImageFile.*image=None"):
        list(dp)


def test_the_stage_reads_members_straight_from_load_from_tar(tmp_path):
    # The values webdataset() yields are files (StreamBytes), not bytes: the stage takes them.
    import tarfile

    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(PHOTOS[:3]):
            info = tarfile.TarInfo(f"k{i}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dp = (
        IterableWrapper([str(path)])
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode_random_resized_crop(32, exact=True)
    )
    got = list(dp)
    assert [s["__key__"] for s in got] == ["k0", "k1", "k2"]
    assert all(tuple(s[".jpg"].shape) == (3, 32, 32) for s in got)


# A fresh process: torch (2 intra-op threads) and the stage, then the threads it has. torch's
# intra-op pool starts its threads at the first parallel region, so a stage that woke it
# (a copy, a flip, a normalisation done by torch) leaves one more thread; then a parallel op
# of torch's own shows that the count would have moved.
_POOL_CHECK = """
import os, sys
import torch
torch.set_num_threads(2)
sys.path.insert(0, {tests!r})
from test_image import PHOTOS
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats import image as fi

def threads():
    return len(os.listdir("/proc/self/task"))

samples = [{{"__key__": f"k{{i}}", "__url__": "m", ".jpg": PHOTOS[i % 5]}} for i in range(10)]
before = threads()
for kw in ({{}}, {{"mean": None, "std": None}}, {{"exact": True}}):
    assert len(list(IterableWrapper(samples).decode_random_resized_crop(64, **kw))) == 10
fi.ImageDecoder(48)(PHOTOS[0])
after = threads()
torch.ones(1 << 20).add_(1)
print(before, after, threads())
"""


@pytest.mark.parametrize("capability", ["native", "default"])
def test_the_stage_never_wakes_torchs_intra_op_threads(capability):
    import os
    import pathlib
    import subprocess
    import sys

    env = dict(os.environ)
    if capability == "default":  # torch's generic kernels: the resize goes to Pillow
        env["ATEN_CPU_CAPABILITY"] = "default"
    code = _POOL_CHECK.format(tests=str(pathlib.Path(__file__).parent))
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert run.returncode == 0, run.stderr
    before, after, control = map(int, run.stdout.split())
    assert after == before  # the stage ran in the calling thread alone
    assert control > after  # a parallel torch op does start the pool


def test_the_resize_without_torchs_kernel_is_within_one_of_it():
    rng = np.random.default_rng(3)
    for data in PHOTOS[:4]:
        rgbx = np.asarray(Image.open(io.BytesIO(data)).convert("RGBX"))
        h, w = rgbx.shape[:2]
        for _ in range(10):
            top, left = int(rng.integers(0, h - 20)), int(rng.integers(0, w - 20))
            crop = rgbx[
                top : int(rng.integers(top + 10, h)), left : int(rng.integers(left + 10, w))
            ]
            for size in ((224, 224), (40, 30)):
                a = fi._resize_rgbx(crop, size, use_torch=True)[..., :3].astype(int)
                b = fi._resize_rgbx(crop, size, use_torch=False)[..., :3].astype(int)
                assert a.shape == b.shape == (size[1], size[0], 3)
                assert np.abs(a - b).max() <= 1
