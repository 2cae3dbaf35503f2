"""decode: fields by extension, images with Pillow, custom decoders, no unpickling by default."""

from __future__ import annotations

import io
import os
import pickle
import re

import numpy as np
import pytest
import torch
from PIL import Image

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import DecodeError, SkippedInputWarning
from shardpipes.formats.stream import StreamBytes
from shardpipes.writer import ShardWriter

URL = "/data/train-000000.tar"


def sample(key: str = "k", **fields: bytes) -> dict:
    out = {"__key__": key, "__url__": URL}
    out.update({f".{name.replace('__', '.')}": value for name, value in fields.items()})
    return out


def decode_one(s: dict, **kwargs):
    return next(iter(IterableWrapper([s]).decode(**kwargs)))


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=arr.dtype == object)
    return buf.getvalue()


def image_bytes(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


RGB = (np.arange(4 * 6 * 3) * 5 % 256).astype(np.uint8).reshape(4, 6, 3)
GRAY = (np.arange(4 * 6) * 9 % 256).astype(np.uint8).reshape(4, 6)


# --- default decoders ----------------------------------------------------------------------------


def test_default_decoders_by_extension():
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3), b=np.ones((2, 2)))
    pt = io.BytesIO()
    torch.save({"w": torch.arange(4)}, pt)
    s = sample(
        cls=b"7",
        txt="h\u00e9".encode(),
        json=b'{"x": [1, 2]}',
        npy=npy_bytes(np.arange(5, dtype=np.int16)),
        npz=buf.getvalue(),
        pt=pt.getvalue(),
        bin=b"\x00\x01",
    )
    before = dict(s)
    out = decode_one(s)
    assert (out["__key__"], out["__url__"]) == ("k", URL)
    assert (out[".cls"], out[".txt"], out[".json"], out[".bin"]) == (
        7,
        "h\u00e9",
        {"x": [1, 2]},
        b"\x00\x01",
    )
    assert out[".npy"].dtype == np.int16 and out[".npy"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(out[".npz"]) == ["a", "b"] and out[".npz"]["b"].shape == (2, 2)
    assert torch.equal(out[".pt"]["w"], torch.arange(4))
    assert s == before  # the input sample is not modified


def test_decoder_uses_the_last_part_of_the_extension():
    out = decode_one(sample(gt__txt=b"caption", seg__png=image_bytes(GRAY, "PNG")), image="numpy")
    assert out[".gt.txt"] == "caption"
    assert np.array_equal(out[".seg.png"], GRAY)


def test_values_that_are_not_bytes_pass_through():
    s = {"__key__": "k", "__url__": URL, ".cls": 3, ".json": {"already": True}}
    assert decode_one(s) == s


def test_synthetic_shards_decode(shard_dir):
    dp = (
        IterableWrapper([os.path.join(shard_dir, "train-000000.tar")])
        .open_files_by_fsspec()
        .load_from_tar()
    )
    got = list(dp.webdataset().decode())
    assert [s[".json"]["index"] for s in got] == list(range(11))
    assert all(
        s[".cls"] == s[".json"]["id"] % 10 and isinstance(s[".bin"], StreamBytes) for s in got
    )


# --- images --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["png", "jpg"])
def test_image_modes(ext):
    data = image_bytes(RGB, "PNG" if ext == "png" else "JPEG")
    s = {"__key__": "k", "__url__": URL, f".{ext}": data}
    pil = decode_one(s, image="pil")[f".{ext}"]
    arr = decode_one(s, image="numpy")[f".{ext}"]
    ten = decode_one(s, image="torch")[f".{ext}"]
    raw = decode_one(s, image=None)[f".{ext}"]
    assert isinstance(pil, Image.Image) and pil.size == (6, 4)
    assert arr.dtype == np.uint8 and arr.shape == (4, 6, 3)
    assert ten.dtype == torch.uint8 and tuple(ten.shape) == (3, 4, 6)
    assert torch.equal(ten, torch.from_numpy(arr.copy()).permute(2, 0, 1))
    assert raw == data
    if ext == "png":  # lossless
        assert np.array_equal(arr, RGB)


def test_grayscale_image_keeps_one_channel():
    s = {"__key__": "k", "__url__": URL, ".png": image_bytes(GRAY, "PNG")}
    assert np.array_equal(decode_one(s, image="numpy")[".png"], GRAY)
    assert tuple(decode_one(s, image="torch")[".png"].shape) == (4, 6)


def test_unknown_image_mode():
    with pytest.raises(
        ValueError, match=r"image 'cv2' is not known; must be one of 'pil', 'numpy', 'torch', None"
    ):
        IterableWrapper([]).decode(image="cv2")


# --- custom decoders -----------------------------------------------------------------------------


def shout(data: bytes) -> str:
    return data.decode().upper()


def negative(data: bytes) -> int:
    return -int(data)


@pytest.mark.parametrize("ext", ["seg", ".seg"], ids=["bare", "dotted"])
def test_custom_decoder_for_a_new_extension(ext):
    out = decode_one(sample(seg=b"abc", txt=b"abc"), decoders={ext: shout})
    assert (out[".seg"], out[".txt"]) == ("ABC", "abc")


def test_custom_decoder_for_a_dotted_extension_leaves_the_last_part_alone():
    png = image_bytes(GRAY, "PNG")
    out = decode_one(sample(seg__png=b"mask", png=png), decoders={"seg.png": shout}, image="numpy")
    assert out[".seg.png"] == "MASK"
    assert np.array_equal(out[".png"], GRAY)  # not decoded by the ".seg.png" decoder


def test_custom_decoder_replaces_a_default():
    assert decode_one(sample(cls=b"4"), decoders={"cls": negative})[".cls"] == -4


def test_lambda_decoder_warns_that_it_cannot_pickle():
    with pytest.warns(UserWarning, match=r"decoder for 'seg' .*lambda"):
        IterableWrapper([]).decode(decoders={"seg": lambda b: b})


# --- pickles -------------------------------------------------------------------------------------


def _touch(path: str) -> str:
    with open(path, "w") as f:
        f.write("unpickled")
    return path


class Trap:
    """Unpickling this object creates the file at ``path``: proof that a pickle was executed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _trap_fields(tmp_path) -> tuple[str, dict]:
    marker = os.fspath(tmp_path / "marker")
    return marker, sample(pickle=pickle.dumps(Trap(marker)), pyd=pickle.dumps(Trap(marker)))


def test_pickles_stay_bytes_by_default(tmp_path):
    marker, s = _trap_fields(tmp_path)
    out = decode_one(s)
    assert (out[".pickle"], out[".pyd"]) == (s[".pickle"], s[".pyd"])
    assert not os.path.exists(marker)


def test_pickles_are_loaded_only_with_allow_pickle(tmp_path):
    marker, s = _trap_fields(tmp_path)
    out = decode_one(s, allow_pickle=True)
    assert out[".pickle"] == marker and os.path.exists(marker)


def test_pt_loads_weights_only_unless_allowed(tmp_path):
    marker = os.fspath(tmp_path / "marker")
    pt = io.BytesIO()
    torch.save({"obj": Trap(marker)}, pt)
    s = sample(pt=pt.getvalue())
    with pytest.raises(
        DecodeError, match=rf"^{re.escape(URL)}: cannot decode field '\.pt' of sample 'k'"
    ):
        decode_one(s)
    assert not os.path.exists(marker)
    assert decode_one(s, allow_pickle=True)[".pt"] == {"obj": marker}
    assert os.path.exists(marker)


def test_object_npy_is_not_unpickled(tmp_path):
    marker = os.fspath(tmp_path / "marker")
    arr = np.empty(1, dtype=object)
    arr[0] = Trap(marker)
    s = sample(npy=npy_bytes(arr))
    with pytest.raises(
        DecodeError, match=r"cannot decode field '\.npy' of sample 'k'.*allow_pickle"
    ):
        decode_one(s)
    assert not os.path.exists(marker)


# --- decode errors and policies ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "data", "cause"),
    [
        ("json", b"{not json", "JSONDecodeError"),
        ("cls", b"seven", "ValueError"),
        ("txt", b"\xff\xfe\xfa", "UnicodeDecodeError"),
        ("png", b"\x89PNG broken", "UnidentifiedImageError"),
        ("npy", b"not an array", "ValueError"),
    ],
    ids=["json", "cls", "txt", "png", "npy"],
)
def test_decode_error_names_url_key_and_field(field, data, cause):
    s = sample("sample7", **{field: data})
    pattern = rf"^{re.escape(URL)}: cannot decode field '\.{field}' of sample 'sample7': {cause}"
    with pytest.raises(DecodeError, match=pattern) as info:
        decode_one(s)
    assert (info.value.url, info.value.key) == (URL, "sample7")
    assert info.value.__cause__ is not None


def _three(bad_key: str = "b") -> list[dict]:
    return [sample(k, json=b"{}" if k != bad_key else b"{") for k in ("a", "b", "c")]


@pytest.mark.parametrize("handler", ["skip", "warn_and_skip"])
def test_skip_drops_the_sample_and_counts_it(handler):
    dp = IterableWrapper(_three()).decode(handler=handler)
    if handler == "warn_and_skip":
        with pytest.warns(SkippedInputWarning, match=r"cannot decode field '\.json' of sample 'b'"):
            got = [s["__key__"] for s in dp]
    else:
        got = [s["__key__"] for s in dp]
    assert got == ["a", "c"]
    assert (dp.skipped.samples, dp.skipped.shards) == (1, 0)
    assert dp.skipped.examples[0][0] == URL


def test_stop_ends_the_stream():
    dp = IterableWrapper(_three()).decode(handler="stop")
    assert [s["__key__"] for s in dp] == ["a"]
    assert (dp.skipped.samples, dp.skipped.shards) == (0, 1)


def keep_going(exc: BaseException) -> bool:
    assert isinstance(exc, DecodeError)
    return True


def test_callable_handler():
    dp = IterableWrapper(_three()).decode(handler=keep_going)
    assert [s["__key__"] for s in dp] == ["a", "c"]
    assert dp.skipped.samples == 1


def test_shard_written_by_the_writer_round_trips(tmp_path):
    with ShardWriter(os.fspath(tmp_path / "s-%03d.tar")) as w:
        for i in range(3):
            w.write(
                {
                    "__key__": f"{i:03d}",
                    ".cls": i,
                    ".json": {"i": i},
                    ".npy": np.full(2, i),
                    ".png": image_bytes(GRAY, "PNG"),
                }
            )
    dp = (
        IterableWrapper(w.urls)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode(image="numpy")
    )
    got = list(dp)
    assert [(s[".cls"], s[".json"], s[".npy"].tolist()) for s in got] == [
        (i, {"i": i}, [i, i]) for i in range(3)
    ]
    assert all(np.array_equal(s[".png"], GRAY) for s in got)


def test_writer_encodes_numpy_labels_and_fields_named_without_a_dot(tmp_path):
    with ShardWriter(os.fspath(tmp_path / "s-%03d.tar")) as w:
        w.write({"__key__": "k", "cls": np.int64(3), "json": {"a": [1]}, "npy": np.arange(3)})
    [s] = list(IterableWrapper(w.urls).open_files_by_fsspec().load_from_tar().webdataset().decode())
    assert (s[".cls"], s[".json"], s[".npy"].tolist()) == (3, {"a": [1]}, [0, 1, 2])


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": 1}',
        b'  {"a": [1, 2.5, null]}\n',
        '{"\u00e9": "\u00fc"}  '.encode(),
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 byte-order mark
        b'"x"',
        b'{"a": 1} x',  # extra data
        b'{"a": 1}\x0c',  # not JSON whitespace
        b"{",
        b"",
        b"\xff",
    ],
)
def test_json_fast_path_agrees_with_json_loads(data):
    """The decoder skips json.loads' wrapping for plain UTF-8 documents; results and errors
    must be exactly json.loads'."""
    import json

    from shardpipes.formats.decoders import decode_json as _json

    try:
        expected = ("value", json.loads(data))
    except Exception as exc:
        expected = ("error", type(exc), str(exc))
    try:
        got = ("value", _json(data))
    except Exception as exc:
        got = ("error", type(exc), str(exc))
    assert got == expected


def test_writer_puts_a_local_shard_in_place_by_renaming_it(tmp_path):
    from shardpipes.formats.tarparse import iter_tar

    pattern = os.fspath(tmp_path / "s-%03d.tar")
    final = tmp_path / "s-000.tar"
    with ShardWriter(pattern) as w:
        w.write({"__key__": "a", ".cls": 1})
        # Half a shard is never visible under its own name.
        assert (tmp_path / "s-000.tar.partial").exists() and not final.exists()
    first_inode = final.stat().st_ino
    with open(final, "rb") as reader:  # a job that opened the shard before it was rewritten
        with ShardWriter(pattern) as w:
            w.write({"__key__": "b", ".cls": 2})
        # The rewrite is a new file: the reader still sees the old one, whole (it is mapped).
        assert [(e.name, e.data) for e in iter_tar(reader, os.fspath(final))] == [("a.cls", b"1")]
    assert final.stat().st_ino != first_inode
    assert not list(tmp_path.glob("*.partial"))
    with open(final, "rb") as f:
        assert [e.data for e in iter_tar(f, os.fspath(final))] == [b"2"]
