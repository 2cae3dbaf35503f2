"""The shard index: build, byte ranges, save/load, validation, sidecar names (shardpipes.index)."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import tarfile

import fsspec
import pytest

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import SampleFormatError, ShardFormatError, ShardReadError
from shardpipes.formats.tarparse import iter_tar
from shardpipes.index import (
    FORMAT,
    VERSION,
    IndexFormatError,
    ShardIndex,
    ShardInfo,
    build_index,
    default_index_url,
    find_index,
    index_shard,
    open_range,
    scan_samples,
)
from shardpipes.synthetic import write_synthetic

COUNTS = [11, 13, 17, 19, 23, 29, 31]


def _shards(shard_dir: str) -> list[str]:
    return [os.path.join(shard_dir, f"train-{i:06d}.tar") for i in range(len(COUNTS))]


def _members(path: str) -> dict[str, list[tuple[str, bytes]]]:
    """Ground truth from Python's tarfile: key -> [(member name, data), ...]."""
    out: dict[str, list[tuple[str, bytes]]] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isfile():
                out.setdefault(m.name.split(".", 1)[0], []).append(
                    (m.name, tar.extractfile(m).read())
                )
    return out


def _write_tar(path: str, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> str:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            if name.endswith("/"):
                info = tarfile.TarInfo(name.rstrip("/"))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def index(shard_dir) -> ShardIndex:
    return build_index(_shards(shard_dir), workers=3, progress=False)


def test_build_index_counts_keys_and_sizes(index, shard_dir):
    assert index.counts == COUNTS
    assert index.num_samples == sum(COUNTS)
    assert index.urls == _shards(shard_dir)
    for shard in index.shards:
        assert shard.total_bytes == os.path.getsize(shard.url)
        keys = [
            s["__key__"]
            for s in IterableWrapper([shard.url])
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
        ]
        assert shard.keys == keys
    assert index.total_bytes == sum(os.path.getsize(u) for u in _shards(shard_dir))


def test_every_sample_range_parses_to_exactly_its_members(index):
    for shard in index.shards:
        truth = _members(shard.url)
        for j, key in enumerate(shard.keys):
            offset, size = shard.byte_range(j, j + 1)
            assert (offset, size) == (shard.offsets[j], shard.sizes[j])
            with open_range(shard.url, offset, size) as f:
                got = [(e.name, e.data) for e in iter_tar(f, shard.url, require_end=False)]
                assert f.read() == b""  # the range ends exactly after the sample
            assert got == truth[key]


def test_a_run_of_samples_is_one_range(index):
    shard = index.shards[3]
    offset, size = shard.byte_range(4, 9)
    with open_range(shard.url, offset, size) as f:
        keys = [e.name.split(".", 1)[0] for e in iter_tar(f, shard.url, require_end=False)]
    assert sorted(set(keys)) == shard.keys[4:9]
    with pytest.raises(ValueError, match=r"sample range \[5, 5\) is empty or outside \[0, 19\)"):
        shard.byte_range(5, 5)


def test_offsets_include_pax_and_long_name_headers_and_skip_directories(tmp_path):
    long_key = "d/" + "k" * 150
    members = [
        ("a.txt", b"1"),
        ("a.cls", b"2" * 700),
        ("dir/", b""),
        (f"{long_key}.txt", b"3"),
        ("c.txt", b""),
    ]
    for fmt, name in ((tarfile.PAX_FORMAT, "pax.tar"), (tarfile.GNU_FORMAT, "gnu.tar")):
        path = _write_tar(str(tmp_path / name), members, fmt)
        shard = index_shard(path)
        assert shard.keys == ["a", long_key, "c"]
        for j, key in enumerate(shard.keys):
            with open_range(path, shard.offsets[j], shard.sizes[j]) as f:
                names = [e.name for e in iter_tar(f, path, require_end=False)]
            assert names == [n for n, _ in members if n.split(".", 1)[0] == key]
        assert shard.offsets[1] > shard.offsets[0] + shard.sizes[0]  # the directory entry between


def test_save_and_load_round_trip_with_relative_urls(index, shard_dir, tmp_path):
    out = os.path.join(shard_dir, "train.index.json")
    index.save(out)
    with open(out) as f:
        text = f.read()
    doc = json.loads(text)
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    assert doc["num_samples"] == sum(COUNTS) and doc["num_shards"] == 7
    assert [s["url"] for s in doc["shards"]] == [f"train-{i:06d}.tar" for i in range(7)]
    assert text.count("\n") == 9  # header line, one line per shard, closing line
    loaded = ShardIndex.load(out)
    assert loaded == index and loaded.source == out
    # The folder moves with its index: relative URLs follow it.
    moved = str(tmp_path / "moved")
    shutil.copytree(shard_dir, moved)
    again = ShardIndex.load(os.path.join(moved, "train.index.json"))
    assert again.urls == [os.path.join(moved, f"train-{i:06d}.tar") for i in range(7)]
    assert again.counts == COUNTS


def test_urls_outside_the_index_folder_stay_absolute(index, tmp_path):
    out = str(tmp_path / "elsewhere" / "idx.json.gz")
    index.save(out)
    with fsspec.open(out, "rt", compression="gzip") as f:
        urls = [s["url"] for s in json.load(f)["shards"]]
    assert urls == index.urls and all(os.path.isabs(u) for u in urls)
    assert ShardIndex.load(out) == index


def test_index_on_a_remote_filesystem(tmp_path):
    paths = write_synthetic(tmp_path, shards=2, samples=[3, 5], payload_bytes=100)
    urls = []
    for p in paths:
        url = f"memory://data/{os.path.basename(p)}"
        with open(p, "rb") as src, fsspec.open(url, "wb") as dst:
            dst.write(src.read())
        urls.append(url)
    index = build_index(urls, progress=False)
    assert index.counts == [3, 5] and index.urls == urls
    index.save("memory://data/train.index.json")
    with fsspec.open("memory://data/train.index.json", "rt") as f:
        assert [s["url"] for s in json.load(f)["shards"]] == [
            "train-000000.tar",
            "train-000001.tar",
        ]
    loaded = ShardIndex.load("memory://data/train.index.json")
    assert loaded.urls == urls
    assert find_index(urls) == "memory://data/train.index.json"
    shard = loaded.shards[1]
    truth = _members(paths[1])
    for max_fetch in (1 << 20, 0):  # one ranged fetch, then a streamed open + seek
        offset, size = shard.byte_range(2, 3)
        with open_range(shard.url, offset, size, max_fetch=max_fetch, block_size=512) as f:
            got = [(e.name, e.data) for e in iter_tar(f, shard.url, require_end=False)]
        assert got == truth[shard.keys[2]]


def test_open_range_of_a_stale_index_names_url_and_offset(tmp_path):
    [path] = write_synthetic(tmp_path, shards=1, samples=2)
    size = os.path.getsize(path)
    f = open_range(path, size - 1024, 4096)
    with pytest.raises(
        ShardFormatError,
        match=rf"{path}: the shard ends at byte offset {size}, inside the indexed range",
    ):
        f.read()
    f.close()
    with pytest.raises(ShardReadError, match=r"nope\.tar: no such file"):
        open_range(str(tmp_path / "nope.tar"), 0, 512)
    with pytest.raises(ValueError, match=r"offset should be an int >= 0, got -1"):
        open_range(path, -1, 512)


def test_truncated_shard_error_names_url_and_offset(tmp_path):
    [path] = write_synthetic(tmp_path, shards=1, samples=4, payload_bytes=2000)
    with open(path, "r+b") as f:
        f.truncate(5000)
    with pytest.raises(
        ShardFormatError, match=rf"{path}: truncated tar archive at byte offset \d+"
    ):
        build_index([path], progress=False)


def test_missing_shard_error_names_url(tmp_path):
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(ShardReadError, match=r"missing\.tar"):
        build_index([missing], progress=False)


def test_member_without_extension_and_split_key_are_errors(tmp_path):
    bad = _write_tar(str(tmp_path / "noext.tar"), [("a.txt", b"1"), ("README", b"2")])
    with pytest.raises(
        SampleFormatError, match=r"noext\.tar: member 'README' at byte offset 1024 has no extension"
    ):
        index_shard(bad)
    split = _write_tar(
        str(tmp_path / "split.tar"), [("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3")]
    )
    with pytest.raises(
        SampleFormatError, match=r"split\.tar: key 'a' appears again at byte offset 2048"
    ):
        index_shard(split)


def test_scan_samples_reports_fields_and_sizes(tmp_path):
    path = _write_tar(
        str(tmp_path / "s.tar"), [("x.jpg", b"j" * 600), ("x.cls", b"7"), ("y.cls", b"8")]
    )
    with open(path, "rb") as f:
        spans = list(scan_samples(f, path))
    assert [(s.key, s.offset, s.size, s.fields) for s in spans] == [
        ("x", 0, 512 + 1024 + 512 + 512, ((".jpg", 600), (".cls", 1))),
        ("y", 2560, 1024, ((".cls", 1),)),
    ]


def test_build_index_arguments(shard_dir):
    with pytest.raises(ValueError, match="got no shard URLs"):
        build_index([], progress=False)
    with pytest.raises(ValueError, match=r"workers should be an int >= 1, got 0"):
        build_index(_shards(shard_dir), workers=0, progress=False)
    with pytest.raises(ValueError, match=r"train-000000\.tar' is given more than once"):
        build_index(_shards(shard_dir)[:1] * 2, progress=False)


def test_progress_bar_can_be_turned_off(shard_dir, capsys):
    build_index(_shards(shard_dir)[:2], progress=False)
    assert capsys.readouterr().err == ""
    build_index(_shards(shard_dir)[:2], progress=True)
    assert "indexing" in capsys.readouterr().err


def test_lookup_and_select_accept_relative_paths(index, shard_dir, monkeypatch):
    monkeypatch.chdir(shard_dir)
    assert index.lookup("train-000004.tar") == 4
    assert index.select(["train-000002.tar", "train-000000.tar"]).counts == [17, 11]
    with pytest.raises(KeyError, match=r"other\.tar: not in the index"):
        index.lookup("other.tar")


def _doc(index: ShardIndex, tmp_path) -> dict:
    return index.to_dict(str(tmp_path / "x.json"))


def _set(doc: dict, path: str, value) -> None:
    target = doc
    *parents, last = path.split("/")
    for p in parents:
        target = target[int(p)] if p.isdigit() else target[p]
    if value is _DELETE:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("format", "webdataset", r"format should be 'shardpipes-index', got 'webdataset'"),
        ("version", 3, r"version is 3; this shardpipes reads versions 1 to 2: upgrade shardpipes"),
        ("version", "1", r"version should be a positive int, got '1'"),
        ("shards", {}, r"shards should be a list, got dict"),
        ("shards/1/url", "", r"shards\[1\]\.url should be a non-empty string"),
        (
            "shards/1/url",
            "train-000000.tar",
            r"shards\[1\]\.url 'train-000000.tar' repeats shards\[0\]",
        ),
        ("shards/2/num_samples", -1, r"shards\[2\]\.num_samples should be an int >= 0, got -1"),
        (
            "shards/2/total_bytes",
            _DELETE,
            r"shards\[2\]\.total_bytes should be an int >= 0, got None",
        ),
        (
            "shards/2/keys",
            ["a"],
            r"shards\[2\]\.keys should be a list of 17 strings \(num_samples\), got a list of 1",
        ),
        (
            "shards/2/keys/3",
            "000002_000001",
            r"shards\[2\]\.keys\[3\] '000002_000001' repeats an earlier key",
        ),
        ("shards/2/offsets/3", 100, r"shards\[2\]\.offsets\[3\] = 100 should be a multiple of 512"),
        ("shards/2/offsets/3", 1.5, r"shards\[2\]\.offsets\[3\] should be an int >= 0, got 1.5"),
        ("shards/2/offsets/3", 0, r"shards\[2\]\.offsets\[3\] = 0 overlaps the previous sample"),
        (
            "shards/2/sizes/0",
            0,
            r"shards\[2\]\.sizes\[0\] = 0 should be a positive multiple of 512",
        ),
        (
            "shards/2/sizes/16",
            10**7 * 512,
            r"shards\[2\]\.sizes\[16\] = 5120000000 runs past total_bytes",
        ),
        (
            "shards/2/sizes",
            None,
            r"shards\[2\]\.sizes should be a list of 17 ints \(num_samples\), got 'NoneType'",
        ),
        ("num_samples", 3, r"num_samples is 3 but the shards hold 143"),
    ],
    ids=[
        "format",
        "newer-version",
        "version-str",
        "shards-dict",
        "url-empty",
        "url-repeated",
        "num-samples-neg",
        "total-bytes-missing",
        "keys-length",
        "key-repeated",
        "offset-unaligned",
        "offset-float",
        "offset-overlap",
        "size-zero",
        "size-past-end",
        "sizes-missing",
        "num-samples-total",
    ],
)
def test_validation_names_the_file_and_the_field(index, tmp_path, path, value, match):
    doc = _doc(index, tmp_path)
    _set(doc, path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(IndexFormatError, match=rf"^{tmp_path}/bad\.json: {match}") as info:
        ShardIndex.load(str(bad))
    assert info.value.field.startswith(path.replace("/", ".").split(".")[0])


def test_not_json_and_missing_index_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": ')
    with pytest.raises(IndexFormatError, match=r"bad\.json: not a JSON index file"):
        ShardIndex.load(str(bad))
    with pytest.raises(FileNotFoundError, match=r"none\.json: no such index file"):
        ShardIndex.load(str(tmp_path / "none.json"))


def test_index_format_error_pickles():
    err = IndexFormatError("f.json: shards[0].url bad", url="f.json", field="shards[0].url")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.url, back.field) == (
        "f.json: shards[0].url bad",
        "f.json",
        "shards[0].url",
    )
    assert isinstance(back, ValueError)


@pytest.mark.parametrize(
    ("urls", "expected"),
    [
        (
            ["/d/train-000000.tar", "/d/train-000009.tar", "/d/train-000010.tar"],
            "/d/train.index.json",
        ),
        (["/d/train-000003.tar"], "/d/train-000003.index.json"),
        (["/d/a.tar", "/d/b.tar"], "/d/index.json"),
        (["/d/x/val_0.tar", "/d/y/val_1.tar"], "/d/val.index.json"),
        (
            ["s3://bucket/ds/img-00.tar", "s3://bucket/ds/img-01.tar"],
            "s3://bucket/ds/img.index.json",
        ),
        (["file:///d/t-0.tar", "/d/t-1.tar"], "/d/t.index.json"),
    ],
    ids=["numbered", "one-shard", "no-prefix", "two-folders", "s3", "file-url"],
)
def test_default_index_url(urls, expected):
    assert default_index_url(urls) == expected


def test_default_index_url_needs_one_filesystem():
    with pytest.raises(ValueError, match=r"shards on different filesystems \(, s3\)"):
        default_index_url(["/d/a.tar", "s3://b/a.tar"])


def test_find_index(index, shard_dir):
    assert find_index(index.urls) is None
    index.save(default_index_url(index.urls))
    assert find_index(index.urls) == os.path.join(shard_dir, "train.index.json")


def test_shard_info_byte_range_spans_samples():
    s = ShardInfo("/d/a.tar", 10240, ["x", "y", "z"], [0, 2048, 5120], [2048, 2048, 1024])
    assert s.byte_range(1, 3) == (2048, 4096)


def test_a_local_range_is_mapped_and_parses_as_its_bytes_read_as_a_stream(index):
    # RangeFile.map_local: the tar reader copies members straight out of the page cache. The
    # members, their data and their offsets in the shard equal those of the same bytes read as
    # a stream; after the map the range has nothing left to read.
    shard = index.shards[2]
    offset, size = shard.byte_range(1, len(shard.keys) - 1)
    with open(shard.url, "rb") as raw:
        raw.seek(offset)
        data = raw.read(size)
    streamed = list(iter_tar(io.BytesIO(data), shard.url, require_end=False, start_offset=offset))
    with open_range(shard.url, offset, size) as f:
        found = f.map_local()
        assert found is not None and found[2] == offset
        found[0].close()
    with open_range(shard.url, offset, size) as f:
        mapped = list(iter_tar(f, shard.url, require_end=False, start_offset=offset))
        assert f.read() == b""
    assert [(e.name, bytes(e.data), e.offset, e.data_offset) for e in mapped] == [
        (e.name, bytes(e.data), e.offset, e.data_offset) for e in streamed
    ]


def test_a_local_range_past_the_end_of_its_shard_names_the_stale_index(index, tmp_path):
    shard = index.shards[0]
    offset, size = shard.byte_range(0, len(shard.keys))
    cut = tmp_path / "cut.tar"
    with open(shard.url, "rb") as src:
        cut.write_bytes(src.read(offset + size // 2))
    with open_range(str(cut), offset, size) as f:
        assert f.map_local() is None  # shorter than the range: read, and the read says why
        with pytest.raises(ShardFormatError, match="is the index out of date"):
            list(iter_tar(f, str(cut), require_end=False, start_offset=offset))
