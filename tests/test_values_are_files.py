"""Values that torchdata 0.9 gave as file objects are file objects to any library that reads files.

0.9 code hands a member's stream to the library that reads its format: ``PIL.Image.open(v)``,
``torch.load(v)``, ``tarfile.open(fileobj=v)``, ``np.load(v)``, ``json.load(v)``,
``pickle.load(v)``, ``io.TextIOWrapper(v)``. Each is tried here on the values of every stage
that yielded streams in 0.9, from local files and from S3 (moto), and the bytes questions the
docs promised (``bytes(v)``, ``len``, slicing, ``decode()``) on the same values.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import pickle
import tarfile
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data._utils.collate import default_convert

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats.stream import StreamBytes


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (5, 3), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def _pt() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4)}, buf)
    return buf.getvalue()


def _inner_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as tar:  # bz2: tarfile tries BZ2File(fileobj)
        info = tarfile.TarInfo("inner.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"inner"))
    return buf.getvalue()


def _npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int16).reshape(2, 3))
    return buf.getvalue()


def _tar_names(v: Any) -> list[str]:
    with tarfile.open(fileobj=v) as tar:
        return tar.getnames()


# field -> (member data, what a library makes of it, the expected result)
CASES: dict[str, tuple[bytes, Callable[[Any], Any], Any]] = {
    "png": (_png(), lambda v: Image.open(v).convert("RGB").getpixel((4, 2)), (10, 20, 30)),
    "pt": (_pt(), lambda v: torch.load(v, weights_only=True)["w"].tolist(), [0, 1, 2, 3]),
    "tar": (_inner_tar(), lambda v: _tar_names(v), ["inner.txt"]),
    "npy": (_npy(), lambda v: np.load(v).tolist(), [[0, 1, 2], [3, 4, 5]]),
    "json": (b'{"a": [1, 2]}', lambda v: json.load(v), {"a": [1, 2]}),
    "pickle": (pickle.dumps({"x": 1}), lambda v: pickle.load(v), {"x": 1}),
    "txt": (
        b"one\ntwo\n",
        lambda v: io.TextIOWrapper(v, encoding="utf-8").readlines(),
        ["one\n", "two\n"],
    ),
}


def _write_tar(path: str, compress: str = "") -> str:
    with tarfile.open(path, f"w:{compress}") as tar:
        for ext, (data, _, _) in CASES.items():
            info = tarfile.TarInfo(f"s0.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _write_files(folder: str) -> list[str]:
    paths = []
    for ext, (data, _, _) in CASES.items():
        path = os.path.join(folder, f"s0.{ext}")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


def _by_ext(pairs: Any) -> dict[str, Any]:
    return {str(path).rsplit(".", 1)[1]: stream for path, stream in pairs}


def _values(source: str, tmp_path: Any, s3: Any = None) -> dict[str, Any]:
    """``{ext: value}`` as the stage ``source`` yields them."""
    folder = os.fspath(tmp_path)
    opts: dict[str, Any] = {}
    if s3 is not None:
        tar = _write_tar(os.path.join(folder, "a.tar"))
        files = _write_files(folder)
        with open(tar, "rb") as f:
            s3.put("data", {"a.tar": f.read()})
        s3.put("data", {os.path.basename(p): open(p, "rb").read() for p in files})  # noqa: SIM115
        opts = {"storage_options": s3.options()}
        tar_url, file_urls = "s3://data/a.tar", [f"s3://data/{os.path.basename(p)}" for p in files]
    else:
        tar_url, file_urls = _write_tar(os.path.join(folder, "a.tar")), _write_files(folder)
    opened = IterableWrapper([tar_url]).open_files_by_fsspec(mode="rb", **opts)
    if source == "load_from_tar":
        return _by_ext(opened.load_from_tar())
    if source == "webdataset":
        [sample] = list(opened.load_from_tar().webdataset())
        return {k[1:]: v for k, v in sample.items() if not k.startswith("__")}
    if source == "load_from_tar(.tar.gz)":
        gz = _write_tar(os.path.join(folder, "b.tar.gz"), "gz")
        return _by_ext(IterableWrapper([gz]).open_files_by_fsspec(mode="rb").load_from_tar())
    if source == "open_files_by_fsspec":
        return _by_ext(IterableWrapper(file_urls).open_files_by_fsspec(mode="rb", **opts))
    if source == "open_files":
        return _by_ext(IterableWrapper(file_urls).open_files(mode="b"))
    if source == "load_from_zip":
        path = os.path.join(folder, "a.zip")
        with zipfile.ZipFile(path, "w") as z:
            for ext, (data, _, _) in CASES.items():
                z.writestr(f"s0.{ext}", data)
        return _by_ext(IterableWrapper([path]).open_files(mode="b").load_from_zip())
    if source in ("load_from_bz2", "decompress"):
        paths = []
        for ext, (data, _, _) in CASES.items():
            # "<ext>-s0.gz": a name that says only gz (a "s0.tar.gz" would be opened as a tar)
            path = os.path.join(
                folder, f"{ext}-s0.bz2" if source == "load_from_bz2" else f"{ext}-s0.gz"
            )
            with open(path, "wb") as f:
                f.write(bz2.compress(data) if source == "load_from_bz2" else gzip.compress(data))
            paths.append(path)
        dp = IterableWrapper(paths).open_files(mode="b")
        dp = dp.load_from_bz2() if source == "load_from_bz2" else dp.decompress()
        return {os.path.basename(p).split("-")[0]: s for p, s in dp}
    raise AssertionError(source)


LOCAL_SOURCES = [
    "load_from_tar",
    "webdataset",
    "load_from_tar(.tar.gz)",
    "open_files_by_fsspec",
    "open_files",
    "load_from_zip",
    "load_from_bz2",
    "decompress",
]


@pytest.mark.parametrize("source", LOCAL_SOURCES)
def test_every_library_reads_the_values_as_files(tmp_path, source):
    values = _values(source, tmp_path)
    assert sorted(values) == sorted(CASES)
    got = {ext: CASES[ext][1](values[ext]) for ext in CASES}
    assert got == {ext: expected for ext, (_, _, expected) in CASES.items()}


@pytest.mark.s3
@pytest.mark.parametrize("source", ["load_from_tar", "webdataset", "open_files_by_fsspec"])
def test_every_library_reads_the_values_as_files_from_s3(tmp_path, s3, source):
    values = _values(source, tmp_path, s3)
    got = {ext: CASES[ext][1](values[ext]) for ext in CASES}
    assert got == {ext: expected for ext, (_, _, expected) in CASES.items()}


@pytest.mark.parametrize("source", ["load_from_tar", "webdataset"])
def test_the_values_still_answer_as_bytes(tmp_path, source):
    values = _values(source, tmp_path)
    v = values["txt"]
    assert (
        isinstance(v, StreamBytes) and isinstance(v, io.BufferedIOBase) and not isinstance(v, bytes)
    )
    assert bytes(v) == b"one\ntwo\n" and bytes(v) is v.getvalue()  # the data, not a copy
    assert len(v) == 8 and v[:3] == b"one" and v[0] == ord("o") and v.decode() == "one\ntwo\n"
    assert b"one\ntwo\n" == v  # noqa: SIM300 (the reflected comparison is the point)
    assert v == b"one\ntwo\n" and v != b"one" and hash(v) == hash(b"one\ntwo\n")
    assert b"two" in v and v.split(b"\n") == [b"one", b"two", b""] and v.count(b"o") == 2
    assert v + b"!" == b"one\ntwo\n!" and b"<" + v == b"<one\ntwo\n"
    assert v.read(3) == b"one" and v.read() == b"\ntwo\n" and v.read() == b""
    v.close()  # 0.9 code closes each stream after reading it: the data stays
    assert bytes(v) == b"one\ntwo\n" and not v.closed
    with pytest.raises(io.UnsupportedOperation, match="read-only"):
        v.write(b"x")
    assert pickle.loads(pickle.dumps(v)) == v


def test_reading_a_value_as_a_file_leaves_it_for_the_decoders(tmp_path):
    [sample] = list(
        IterableWrapper([_write_tar(os.path.join(tmp_path, "a.tar"))])
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .map(_peek_json)
        .decode(allow_pickle=True)
    )
    assert sample[".json"] == {"a": [1, 2]} and sample[".txt"] == "one\ntwo\n"
    assert sample[".pickle"] == {"x": 1} and sample[".npy"].shape == (2, 3)
    assert sample[".png"].size == (5, 3) and sample[".pt"]["w"].tolist() == [0, 1, 2, 3]


def _peek_json(sample: dict[str, Any]) -> dict[str, Any]:
    assert json.load(sample[".json"]) == {"a": [1, 2]}  # reads to the end of the value
    return sample


def test_torch_default_convert_passes_values_through_unchanged(tmp_path):
    # A Sequence would be taken apart element by element by DataLoader(batch_size=None): a
    # StreamBytes is a file, and torch leaves files alone, as it left 0.9's streams.
    values = _values("webdataset", tmp_path)
    converted = default_convert({"txt": values["txt"]})
    assert converted["txt"] is values["txt"]
