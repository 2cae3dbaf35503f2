"""webdataset's internal modules under shardpipes.webdataset: tariterators, gopen, cache."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

import shardpipes.webdataset as wds
from shardpipes.webdataset import cache, tariterators
from shardpipes.webdataset.filters import _shuffle
from shardpipes.webdataset.gopen import (  # wds.gopen is the function, as in webdataset
    gopen,
    gopen_schemes,
)


def _tar(path: str, names: list[str]) -> str:
    with tarfile.open(path, "w") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tariterators_build_the_samples_webdataset_does(tmp_path):
    a = _tar(str(tmp_path / "a.tar"), ["x/1.jpg", "x/1.CLS", "__meta__", "x/2.jpg"])
    b = _tar(str(tmp_path / "b.tar"), ["x/2.jpg"])  # the same key in the next shard
    opened = tariterators.url_opener([{"url": a}, {"url": b}])
    files = list(tariterators.tar_file_expander(opened))
    assert [(f["fname"], f["data"], f["__url__"]) for f in files] == [
        ("x/1.jpg", b"x/1.jpg", a),
        ("x/1.CLS", b"x/1.CLS", a),
        ("x/2.jpg", b"x/2.jpg", a),
        ("x/2.jpg", b"x/2.jpg", b),
    ]
    samples = list(tariterators.group_by_keys(iter(files)))
    assert [(s["__key__"], s["__url__"], sorted(s)) for s in samples] == [
        ("x/1", a, ["__key__", "__url__", "cls", "jpg"]),
        ("x/2", a, ["__key__", "__url__", "jpg"]),
        ("x/2", b, ["__key__", "__url__", "jpg"]),  # a shard boundary ends a sample
    ]
    with_eof = tariterators.tar_file_expander(tariterators.url_opener([{"url": a}]), eof_value={})
    assert list(with_eof)[-1] == {}
    assert tariterators.base_plus_ext("d/k.seg.png") == ("d/k", "seg.png")
    assert not tariterators.valid_sample({"__bad__": True}) and tariterators.valid_sample({"a": 1})


def test_a_duplicate_member_goes_to_the_handler(tmp_path):
    a = _tar(str(tmp_path / "a.tar"), ["k.jpg", "k.jpg"])
    with pytest.raises(ValueError, match="duplicate file name"):
        list(tariterators.tarfile_samples([{"url": a}]))
    assert list(tariterators.tarfile_samples([{"url": a}], handler=wds.ignore_and_continue)) == [
        {"__key__": "k", "__url__": a, "jpg": b"k.jpg"}
    ]


def test_shuffle_helper_is_seeded_by_the_rng_given():
    import random

    one = list(_shuffle(iter(range(50)), 10, 5, random.Random(3)))
    assert sorted(one) == list(range(50)) and one != list(range(50))
    assert one == list(_shuffle(iter(range(50)), 10, 5, random.Random(3)))


def _upper_opener(url: str, mode: str = "rb", bufsize: int = 8192) -> io.BytesIO:
    return io.BytesIO(url.upper().encode())


def test_gopen_looks_the_scheme_up_at_each_call(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    with gopen(str(path), "wb") as f:
        f.write(b"abc")
    assert gopen(f"file://{path}").read() == b"abc"
    monkeypatch.setitem(gopen_schemes, "demo", _upper_opener)
    assert gopen("demo://x").read() == b"DEMO://X"
    with gopen(f"pipe:cat {path}") as f:  # parsed: read without a subprocess
        assert f.read() == b"abc"
    with pytest.raises(ValueError, match="mode"):
        gopen(str(path), "r")


@pytest.mark.s3
def test_file_cache_downloads_once_and_checks_the_archive(s3, tmp_path, monkeypatch):
    shard = _tar(str(tmp_path / "s.tar"), ["k.txt"])
    with open(shard, "rb") as f:
        s3.put("data", {"s.tar": f.read(), "bad.tar": b"not a tar"})
    fs = s3.fs()
    monkeypatch.setitem(gopen_schemes, "s3", _s3_opener(s3.options()))
    fc = cache.FileCache(cache_dir=str(tmp_path / "cache"))
    [item] = list(fc([{"url": "s3://data/s.tar"}]))
    assert item["local_path"] == str(tmp_path / "cache" / "s.tar")
    with tarfile.open(fileobj=item["stream"]) as tar:
        assert tar.getnames() == ["k.txt"]
    item["stream"].close()
    fs.rm("data/s.tar")  # cached: no second download
    assert next(fc(["s3://data/s.tar"]))["local_path"] == item["local_path"]
    with pytest.raises(ValueError, match="is not a tar archive"):
        fc.get_file("s3://data/bad.tar")
    assert not os.path.exists(tmp_path / "cache" / "bad.tar")
    assert cache.url_to_cache_name("s3://b/p/q/r.tar", ndir=1) == "q/r.tar"


def _s3_opener(options: dict):
    from shardpipes.storage.open import open_url

    def opener(url: str, mode: str = "rb", bufsize: int = 8192):
        return open_url(url, mode, options)

    return opener
