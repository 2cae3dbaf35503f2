"""list_files_by_fsspec, open_files_by_fsspec and save_by_fsspec on the local filesystem."""

from __future__ import annotations

import os
import re

import pytest

from _tars import ABC, keys, write_tar
from shardpipes.datapipes.iter import FSSpecFileLister, FSSpecFileOpener, IterableWrapper
from shardpipes.errors import ShardReadError


@pytest.fixture
def tree(tmp_path):
    """``b.tar a.tar c.txt sub/d.tar sub/deeper/e.tar empty/``, created in an unsorted order."""
    for rel in ("b.tar", "sub/deeper/e.tar", "c.txt", "a.tar", "sub/d.tar"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())
    (tmp_path / "empty").mkdir()
    return os.fspath(tmp_path)


def rel(root: str, paths: list[str]) -> list[str]:
    prefix = "file://" + root if paths and paths[0].startswith("file://") else root
    return [p[len(prefix) + 1 :] if p.startswith(prefix + "/") else p for p in paths]


# --- list_files_by_fsspec ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "kwargs", "expected"),
    [
        ("", {}, ["a.tar", "b.tar", "c.txt", "empty", "sub"]),
        ("/", {}, ["a.tar", "b.tar", "c.txt", "empty", "sub"]),
        ("", {"recursive": True}, ["a.tar", "b.tar", "c.txt", "sub/d.tar", "sub/deeper/e.tar"]),
        ("", {"masks": "*.tar"}, ["a.tar", "b.tar"]),
        ("", {"masks": ["*.txt", "b*"]}, ["b.tar", "c.txt"]),
        (
            "",
            {"masks": "*.tar", "recursive": True},
            ["a.tar", "b.tar", "sub/d.tar", "sub/deeper/e.tar"],
        ),
        ("/*.tar", {}, ["a.tar", "b.tar"]),
        ("/**/*.tar", {}, ["a.tar", "b.tar", "sub/d.tar", "sub/deeper/e.tar"]),
        ("/sub/*", {}, ["sub/d.tar"]),
        ("/a.tar", {}, ["a.tar"]),
        ("/empty", {}, []),
    ],
    ids=[
        "dir",
        "dir-slash",
        "recursive",
        "mask",
        "masks",
        "mask-recursive",
        "glob",
        "glob-recursive",
        "glob-skips-dirs",
        "file",
        "empty-dir",
    ],
)
@pytest.mark.parametrize("scheme", ["", "file://"], ids=["path", "file-url"])
def test_lister_lists_sorted_files(tree, scheme, suffix, kwargs, expected):
    got = list(FSSpecFileLister(scheme + tree + suffix, **kwargs))
    assert rel(tree, got) == expected
    assert all(p.startswith(scheme + "/") for p in got)
    assert got == sorted(got)


def test_lister_keeps_the_order_of_its_inputs(tree):
    dp = IterableWrapper([f"{tree}/sub", tree]).list_files_by_fsspec()
    assert rel(tree, list(dp)) == [
        "sub/d.tar",
        "sub/deeper",
        "a.tar",
        "b.tar",
        "c.txt",
        "empty",
        "sub",
    ]


def test_lister_on_an_empty_input_list():
    assert list(FSSpecFileLister([])) == []
    assert list(IterableWrapper([]).list_files_by_fsspec()) == []


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["path", "file-url"])
def test_lister_missing_path_names_it(tree, scheme):
    url = f"{scheme}{tree}/nope"
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(url)}: no such file or directory"):
        list(FSSpecFileLister(url))


def test_lister_glob_matching_nothing_names_it(tree):
    url = f"{tree}/*.zip"
    with pytest.raises(
        FileNotFoundError, match=rf"^{re.escape(url)}: the glob pattern matches no file"
    ):
        list(FSSpecFileLister(url))


def test_lister_empty_url():
    with pytest.raises(ValueError, match="list_files_by_fsspec got an empty URL"):
        list(FSSpecFileLister(""))


# --- open_files_by_fsspec ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["path", "file-url"])
def test_opener_yields_url_and_open_stream(tree, scheme):
    urls = [f"{scheme}{tree}/a.tar", f"{scheme}{tree}/sub/d.tar"]
    pairs = list(IterableWrapper(urls).open_files_by_fsspec(mode="rb"))
    try:
        assert [u for u, _ in pairs] == urls
        assert [s.read() for _, s in pairs] == [b"a.tar", b"sub/d.tar"]
    finally:
        for _, s in pairs:
            s.close()


def test_opener_text_mode(tree):
    [(url, stream)] = list(FSSpecFileOpener(IterableWrapper([f"{tree}/c.txt"]), mode="r"))
    with stream:
        assert stream.read() == "c.txt"


def test_opener_defaults_to_text_as_torchdata_09_did(tree):
    [(_, stream)] = list(FSSpecFileOpener(IterableWrapper([f"{tree}/c.txt"])))
    with stream:
        assert stream.read() == "c.txt"


def test_opener_opens_lazily(tree):
    # The second URL is missing: the first one is still delivered before the error.
    missing = f"{tree}/nope.tar"
    it = iter(IterableWrapper([f"{tree}/a.tar", missing]).open_files_by_fsspec())
    url, stream = next(it)
    stream.close()
    assert url == f"{tree}/a.tar"
    with pytest.raises(ShardReadError, match=rf"^{re.escape(missing)}: no such file") as info:
        next(it)
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.url == missing


def test_opener_directory_is_not_a_file(tree):
    url = f"{tree}/sub"
    with pytest.raises(ShardReadError, match=rf"^{re.escape(url)}: is a directory") as info:
        list(IterableWrapper([url]).open_files_by_fsspec())
    assert isinstance(info.value, IsADirectoryError)


def test_opener_bad_mode():
    with pytest.raises(ValueError, match=r"mode 'wb' is not supported; must be one of 'rb', 'r'"):
        IterableWrapper([]).open_files_by_fsspec(mode="wb")


def test_opener_empty_url_list():
    assert list(IterableWrapper([]).open_files_by_fsspec()) == []


def test_unreadable_url_can_be_skipped_and_counted(tmp_path):
    good = write_tar(tmp_path / "good.tar", ABC)
    missing = os.fspath(tmp_path / "missing.tar")
    opener = IterableWrapper([missing, good]).open_files_by_fsspec(handler="skip")
    got = list(opener.load_from_tar().webdataset())
    assert keys(got) == ["a", "b", "c"]
    assert opener.skipped.shards + opener.skipped.samples == 1


def test_missing_url_raises_by_default_naming_it(tmp_path):
    good = write_tar(tmp_path / "good.tar", ABC)
    missing = os.fspath(tmp_path / "missing.tar")
    dp = IterableWrapper([missing, good]).open_files_by_fsspec().load_from_tar(handler="skip")
    with pytest.raises(ShardReadError, match=re.escape(missing)):
        list(dp)


# --- save_by_fsspec ------------------------------------------------------------------------------


def test_saver_writes_and_yields_each_url(tmp_path):
    items = [
        (os.fspath(tmp_path / "out/x/a.bin"), b"abc"),
        ("file://" + os.fspath(tmp_path / "out/b.bin"), b""),
    ]
    got = list(IterableWrapper(items).save_by_fsspec(mode="wb"))
    assert got == [u for u, _ in items]
    assert (tmp_path / "out/x/a.bin").read_bytes() == b"abc"
    assert (tmp_path / "out/b.bin").read_bytes() == b""


def to_txt(url: str) -> str:
    return url + ".txt"


def test_saver_text_mode_and_filepath_fn(tmp_path):
    src = os.fspath(tmp_path / "note")
    got = list(IterableWrapper([(src, "h\u00e9llo")]).save_by_fsspec(mode="w", filepath_fn=to_txt))
    assert got == [src + ".txt"]
    assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "h\u00e9llo"
    assert not (tmp_path / "note").exists()


def test_saver_overwrites(tmp_path):
    path = os.fspath(tmp_path / "a.bin")
    list(IterableWrapper([(path, b"first")]).save_by_fsspec(mode="wb"))
    list(IterableWrapper([(path, b"2")]).save_by_fsspec(mode="wb"))
    assert (tmp_path / "a.bin").read_bytes() == b"2"


def test_saver_bad_mode():
    with pytest.raises(ValueError, match=r"mode 'rb' is not a write mode"):
        IterableWrapper([]).save_by_fsspec(mode="rb")


def test_saver_defaults_to_text_as_torchdata_09_did(tmp_path):
    path = os.fspath(tmp_path / "a.txt")
    saver = IterableWrapper([(path, "caf\u00e9")]).save_by_fsspec(
        kwargs_for_open={"encoding": "latin-1"}
    )
    assert len(saver) == 1 and list(saver) == [path]
    assert (tmp_path / "a.txt").read_bytes() == b"caf\xe9"


def test_saver_bytes_in_text_mode_names_the_url_and_the_mode(tmp_path):
    path = os.fspath(tmp_path / "a.bin")
    with pytest.raises(TypeError, match=rf"{re.escape(path)}: .*mode='w'.* use mode='wb'"):
        list(IterableWrapper([(path, b"x")]).save_by_fsspec())


def test_lister_yields_subdirectories_as_torchdata_09_did(tree):
    # 0.9 listed a directory's entries, files and folders: class folders listed again give files.
    dp = FSSpecFileLister(tree, masks="sub").list_files_by_fsspec()
    assert rel(tree, list(dp)) == ["sub/d.tar", "sub/deeper"]


def test_lister_yields_a_file_url_as_given(tree):
    url = "file://" + tree + "//a.tar"
    assert list(FSSpecFileLister(url)) == [url]


def test_list_open_tar_round_trip(tmp_path):
    for i in range(3):
        write_tar(tmp_path / f"shard-{i}.tar", [(f"k{i}.cls", str(i).encode())])
    dp = (
        FSSpecFileLister(os.fspath(tmp_path), masks="shard-*.tar")
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
    )
    assert keys(dp) == ["k0", "k1", "k2"]
