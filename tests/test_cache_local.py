"""on_disk_cache with local sources: pass-through, download once, eviction, safe entry names."""

from __future__ import annotations

import os
import re
import time

import pytest

from _tars import ABC, keys, write_tar
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.cache import cache_entry_name
from shardpipes.errors import ShardReadError


def cached(urls, cache_dir, **kwargs) -> list[str]:
    return list(IterableWrapper(list(urls)).on_disk_cache(os.fspath(cache_dir), **kwargs))


def entries(cache_dir) -> list[str]:
    """Cache entries (not lock files), by name."""
    return sorted(n for n in os.listdir(cache_dir) if not n.endswith(".lock"))


@pytest.fixture
def sources(tmp_path):
    """Three 100-byte files ``a.bin b.bin c.bin`` under ``src/``; returns their file:// URLs."""
    src = tmp_path / "src"
    src.mkdir()
    urls = []
    for name in ("a", "b", "c"):
        (src / f"{name}.bin").write_bytes(name.encode() * 100)
        urls.append("file://" + os.fspath(src / f"{name}.bin"))
    return urls


def test_local_paths_pass_through(tmp_path):
    path = write_tar(tmp_path / "s.tar", ABC)
    cache = tmp_path / "cache"
    assert cached([path], cache) == [path]
    assert entries(cache) == []


def test_file_url_is_copied_into_the_cache(tmp_path, sources):
    cache = tmp_path / "cache"
    [path] = cached(sources[:1], cache)
    assert os.path.dirname(path) == os.fspath(cache)
    assert path.endswith("-a.bin")
    with open(path, "rb") as f:
        assert f.read() == b"a" * 100
    assert entries(cache) == [os.path.basename(path)]


def test_second_pass_does_not_download_again(tmp_path, sources):
    cache = tmp_path / "cache"
    [first] = cached(sources[:1], cache)
    inode = os.stat(first).st_ino
    with open(sources[0][len("file://") :], "wb") as f:
        f.write(b"changed")  # a new download would see this
    [again] = cached(sources[:1], cache)
    assert again == first
    assert os.stat(again).st_ino == inode
    with open(again, "rb") as f:
        assert f.read() == b"a" * 100
    assert len(entries(cache)) == 1


def test_the_cached_shard_feeds_the_pipeline(tmp_path):
    url = "file://" + write_tar(tmp_path / "s.tar", ABC)
    dp = IterableWrapper([url]).on_disk_cache(os.fspath(tmp_path / "cache")).open_files_by_fsspec()
    got = list(dp.load_from_tar().webdataset())
    assert keys(got) == ["a", "b", "c"]
    assert all(s["__url__"].startswith(os.fspath(tmp_path / "cache")) for s in got)


def test_max_bytes_evicts_the_least_recently_used(tmp_path, sources):
    cache = tmp_path / "cache"
    a, b = cached(sources[:2], cache, max_bytes=250)
    now = time.time()
    os.utime(a, (now - 100, now - 100))  # a is older than b ...
    os.utime(b, (now - 50, now - 50))
    assert cached(sources[:1], cache, max_bytes=250) == [a]  # ... until it is used again
    [c] = cached(sources[2:], cache, max_bytes=250)  # 300 bytes > 250: one must go
    assert entries(cache) == sorted(os.path.basename(p) for p in (a, c))
    assert not os.path.exists(b)


def test_max_bytes_keeps_the_entry_just_downloaded(tmp_path, sources):
    cache = tmp_path / "cache"
    paths = cached(sources, cache, max_bytes=50)  # each entry alone is over the limit
    assert os.path.exists(paths[-1])
    assert entries(cache) == [os.path.basename(paths[-1])]


def test_bad_max_bytes(tmp_path):
    with pytest.raises(ValueError, match=r"max_bytes should be a positive integer or None, got 0"):
        IterableWrapper([]).on_disk_cache(os.fspath(tmp_path), max_bytes=0)


def test_missing_file_url_names_it_and_leaves_no_entry(tmp_path):
    url = "file://" + os.fspath(tmp_path / "missing.tar")
    cache = tmp_path / "cache"
    with pytest.raises(ShardReadError, match=rf"{re.escape(url)}: no such file"):
        cached([url], cache)
    assert entries(cache) == []


def test_dot_dot_in_the_url_stays_inside_the_cache(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "x").write_bytes(b"outside")
    url = f"file://{tmp_path}/a/b/../../x"
    cache = tmp_path / "cache"
    [path] = cached([url], cache)
    assert os.path.dirname(os.path.realpath(path)) == os.path.realpath(cache)
    with open(path, "rb") as f:
        assert f.read() == b"outside"


@pytest.mark.parametrize(
    "url",
    [
        "http://host/data/../../x",
        "http://host/data/..",
        "http://host/data/.",
        "s3://bucket/",
        "http://host/a%2f..%2f..%2fetc",
        "http://host/a/.hidden",
        "http://host/" + "n" * 500 + ".tar",
        "http://host/we ird/na:me?.tar",
    ],
    ids=[
        "dotdot-then-name",
        "ends-dotdot",
        "ends-dot",
        "trailing-slash",
        "encoded-slashes",
        "dotfile",
        "long",
        "odd-chars",
    ],
)
def test_cache_entry_names_cannot_escape_or_hide(tmp_path, url):
    name = cache_entry_name(url)
    assert "/" not in name and "\\" not in name
    assert name not in ("", ".", "..") and not name.startswith(".")
    assert len(name) <= 24 + 1 + 80
    assert os.path.dirname(os.path.join(os.fspath(tmp_path), name)) == os.fspath(tmp_path)


def test_cache_entry_names_differ_for_different_urls():
    urls = ["s3://a/x.tar", "s3://b/x.tar", "gs://a/x.tar", "s3://a/x.tar?v=2"]
    assert len({cache_entry_name(u) for u in urls}) == len(urls)
