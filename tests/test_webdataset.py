"""webdataset: grouping tar members into samples, and what it does with members that do not fit."""

from __future__ import annotations

import io
import os
import re

import pytest

from _tars import ABC, keys, tar_bytes, tar_pipe, write_bytes, write_tar
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import (
    SampleFormatError,
    ShardFormatError,
    ShardReadError,
    SkippedInputWarning,
)
from shardpipes.formats.samples import split_key


def wds(urls, **kwargs):
    return tar_pipe(urls).webdataset(**kwargs)


def identity(x):
    return x


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jpg", ("a", ".jpg")),
        ("train/x.seg.png", ("train/x", ".seg.png")),
        ("v1.0/sub.dir/x.cls", ("v1.0/sub.dir/x", ".cls")),
        ("noext", ("noext", "")),
        ("dir.d/noext", ("dir.d/noext", "")),
        (".hidden", ("", ".hidden")),
    ],
    ids=["simple", "multi-dot", "dots-in-dirs", "no-dot", "no-dot-in-dotted-dir", "leading-dot"],
)
def test_split_key(name, expected):
    assert split_key(name) == expected


# --- the normal case -----------------------------------------------------------------------------


def test_groups_adjacent_members_by_key(tmp_path):
    url = write_tar(tmp_path / "s.tar", ABC)
    assert list(wds([url])) == [
        {"__key__": "a", "__url__": url, ".cls": b"0", ".txt": b"alpha"},
        {"__key__": "b", "__url__": url, ".cls": b"1", ".txt": b"beta" * 200},
        {"__key__": "c", "__url__": url, ".cls": b"2", ".txt": b"gamma"},
    ]


def test_keys_keep_directories_and_extensions_keep_every_dot(tmp_path):
    members = [("v1.0/x.seg.png", b"p"), ("v1.0/x.cls", b"1"), ("v1.0/y.cls", b"2")]
    url = write_tar(tmp_path / "s.tar", members)
    got = list(wds([url]))
    assert keys(got) == ["v1.0/x", "v1.0/y"]
    assert sorted(k for k in got[0] if not k.startswith("__")) == [".cls", ".seg.png"]


def test_synthetic_shards_give_every_sample_once_with_its_url(shard_pattern):
    dp = (
        IterableWrapper([shard_pattern])
        .shard_expand()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
    )
    samples = list(dp)
    assert len(samples) == 11 + 13 + 17 + 19 + 23 + 29 + 31
    assert len(set(keys(samples))) == len(samples)
    for s in samples:
        shard = int(s["__key__"].split("_")[0])
        assert os.path.basename(s["__url__"]) == f"train-{shard:06d}.tar"
        assert set(s) == {"__key__", "__url__", ".cls", ".json", ".bin"}


def test_samples_never_straddle_shards(tmp_path):
    # The same key ends one shard and starts the next: two samples, one per shard.
    a = write_tar(tmp_path / "a.tar", [("x.cls", b"1"), ("k.cls", b"2")])
    b = write_tar(tmp_path / "b.tar", [("k.txt", b"t"), ("y.cls", b"3")])
    got = list(wds([a, b]))
    assert [(s["__key__"], s["__url__"]) for s in got] == [("x", a), ("k", a), ("k", b), ("y", b)]
    assert ".txt" not in got[1] and ".cls" not in got[2]


@pytest.mark.parametrize(
    "between",
    [None, "map", "prefetch"],
    ids=["fused", "through-map", "through-prefetch"],
)
def test_same_shard_listed_twice_gives_its_samples_twice(tmp_path, between):
    url = write_tar(tmp_path / "s.tar", ABC)
    dp = tar_pipe([url, url])
    if between == "map":
        dp = dp.map(identity)
    elif between == "prefetch":
        dp = dp.prefetch(4)
    got = list(dp.webdataset())
    assert keys(got) == ["a", "b", "c", "a", "b", "c"]
    assert got[0] == got[3]


def test_plain_path_stream_pairs_group_by_path():
    pairs = [
        ("s.tar/a.cls", io.BytesIO(b"0")),
        ("s.tar/a.txt", io.BytesIO(b"x")),
        ("s.tar/b.cls", io.BytesIO(b"1")),
    ]
    got = list(IterableWrapper(pairs, deepcopy=False).webdataset())
    assert [(s["__key__"], s.get(".cls"), s.get(".txt")) for s in got] == [
        ("s.tar/a", b"0", b"x"),
        ("s.tar/b", b"1", None),
    ]


@pytest.mark.parametrize("required", [[".cls", ".txt"], ["cls", "txt"]], ids=["dotted", "bare"])
def test_required_fields_present(tmp_path, required):
    url = write_tar(tmp_path / "s.tar", ABC)
    assert keys(wds([url], required=required)) == ["a", "b", "c"]


def test_empty_url_list_and_empty_archive(tmp_path):
    empty = write_tar(tmp_path / "empty.tar", [])
    good = write_tar(tmp_path / "good.tar", ABC)
    assert list(wds([])) == []
    assert keys(wds([empty, good, empty])) == ["a", "b", "c"]


# --- bad input -----------------------------------------------------------------------------------

NOT_ADJACENT = [
    ("a.cls", b"0"),
    ("b.cls", b"1"),
    ("a.txt", b"x"),
    ("a.json", b"{}"),
    ("c.cls", b"2"),
]
NO_DOT = [("a.cls", b"0"), ("README", b"?"), ("b.cls", b"1")]
TWICE = [("a.cls", b"0"), ("a.cls", b"9"), ("b.cls", b"1")]
MISSING = [("a.cls", b"0"), ("a.txt", b"x"), ("b.cls", b"1"), ("c.cls", b"2"), ("c.txt", b"z")]


def test_member_without_extension_names_url_and_member(tmp_path):
    url = write_tar(tmp_path / "s.tar", NO_DOT)
    with pytest.raises(
        SampleFormatError, match=rf"^{re.escape(url)}: member 'README' has no extension"
    ) as info:
        list(wds([url]))
    assert (info.value.url, info.value.key) == (url, "README")


def test_key_whose_members_are_not_adjacent(tmp_path):
    url = write_tar(tmp_path / "s.tar", NOT_ADJACENT)
    pattern = rf"^{re.escape(url)}: key 'a' appears again at member 'a\.txt' after other keys"
    with pytest.raises(SampleFormatError, match=pattern) as info:
        list(wds([url]))
    assert info.value.key == "a"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("decoded", [True, False])
def test_the_sample_a_bad_member_ends_comes_out_before_its_error(tmp_path, fused, decoded):
    """Under "raise", the whole sample that a reappearing key ends is yielded, then the error:
    alike whether the run before it was grouped member by member or in bulk, decoded or not."""
    members = [(f"{k}{i:04d}.{e}", b"%d" % i) for i, k in enumerate("abc") for e in ("cls", "txt")]
    url = write_tar(tmp_path / "s.tar", [*members, ("a0000.cls", b"9")])
    tars = tar_pipe([url])
    dp = (tars if fused else tars.map(identity)).webdataset()
    if decoded:
        dp = dp.decode()
    got = []
    with pytest.raises(SampleFormatError, match="key 'a0000' appears again"):
        for sample in dp:
            got.append(sample["__key__"])
    assert got == ["a0000", "b0001", "c0002"]


def test_repeated_extension(tmp_path):
    url = write_tar(tmp_path / "s.tar", TWICE)
    with pytest.raises(
        SampleFormatError, match=rf"^{re.escape(url)}: sample 'a' has two '\.cls' members"
    ):
        list(wds([url]))


def test_missing_required_field_names_url_and_key(tmp_path):
    url = write_tar(tmp_path / "s.tar", MISSING)
    with pytest.raises(
        SampleFormatError, match=rf"^{re.escape(url)}: sample 'b' has no \.txt \(it has \.cls\)"
    ):
        list(wds([url], required=[".cls", ".txt"]))


def test_missing_required_field_in_the_last_sample(tmp_path):
    url = write_tar(tmp_path / "s.tar", MISSING[:3])
    with pytest.raises(SampleFormatError, match=rf"{re.escape(url)}: sample 'b' has no \.txt"):
        list(wds([url], required=["txt"]))


def test_truncated_shard_names_url(tmp_path):
    data = tar_bytes(ABC)
    url = write_bytes(tmp_path / "cut.tar", data[:1700])
    with pytest.raises(
        ShardFormatError, match=rf"^{re.escape(url)}: truncated tar archive at byte offset \d+"
    ):
        list(wds([url]))


def test_zero_byte_shard_names_url(tmp_path):
    url = write_bytes(tmp_path / "zero.tar", b"")
    with pytest.raises(ShardFormatError, match=rf"^{re.escape(url)}: empty file"):
        list(wds([url]))


def test_missing_shard_names_url(tmp_path):
    url = os.fspath(tmp_path / "missing.tar")
    with pytest.raises(ShardReadError, match=rf"^{re.escape(url)}: no such file"):
        list(wds([url]))


# --- handler policies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "kwargs", "expected"),
    [
        (NOT_ADJACENT, {}, ["a", "b", "c"]),
        (NO_DOT, {}, ["a", "b"]),
        (TWICE, {}, ["b"]),
        (MISSING, {"required": ["txt"]}, ["a", "c"]),
    ],
    ids=["not-adjacent", "no-dot", "repeated-ext", "missing-required"],
)
@pytest.mark.parametrize("handler", ["skip", "warn_and_skip"])
def test_skip_policies_drop_one_sample_and_count_it(tmp_path, members, kwargs, expected, handler):
    url = write_tar(tmp_path / "s.tar", members)
    dp = wds([url], handler=handler, **kwargs)
    if handler == "warn_and_skip":
        with pytest.warns(SkippedInputWarning, match=re.escape(url)) as record:
            got = list(dp)
        assert len(record) == 1
    else:
        got = list(dp)
    assert keys(got) == expected
    assert (dp.skipped.samples, dp.skipped.shards) == (1, 0)
    assert dp.skipped.examples[0][0] == url


def test_skip_of_a_key_that_comes_back_keeps_its_first_run(tmp_path):
    url = write_tar(tmp_path / "s.tar", NOT_ADJACENT)
    got = list(wds([url], handler="skip"))
    assert got[0] == {"__key__": "a", "__url__": url, ".cls": b"0"}


@pytest.mark.parametrize(
    ("members", "kwargs", "expected"),
    [
        (NOT_ADJACENT, {}, ["a", "b"]),
        (NO_DOT, {}, []),
        (MISSING, {"required": ["txt"]}, ["a"]),
    ],
    ids=["not-adjacent", "no-dot", "missing-required"],
)
def test_stop_ends_the_stream_and_counts_it(tmp_path, members, kwargs, expected):
    url = write_tar(tmp_path / "s.tar", members)
    later = write_tar(tmp_path / "later.tar", ABC)
    dp = wds([url, later], handler="stop", **kwargs)
    assert keys(dp) == expected
    assert (dp.skipped.samples, dp.skipped.shards) == (0, 1)


class Decide:
    """Handler answering in turn from ``answers``; records the exceptions (module level: pickles)."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.seen: list[BaseException] = []

    def __call__(self, exc: BaseException) -> bool:
        self.seen.append(exc)
        return self.answers.pop(0)


def test_callable_handler_skips_then_stops(tmp_path):
    members = [("a.cls", b"0"), ("b.cls", b"1"), ("c.cls", b"2"), ("d.cls", b"3"), ("e.txt", b"")]
    url = write_tar(tmp_path / "s.tar", members)
    handler = Decide(True, False)
    dp = wds([url], required=["cls"], handler=handler)
    got = list(dp)
    assert keys(got) == ["a", "b", "c", "d"]
    assert [e.key for e in handler.seen] == ["e"]
    url2 = write_tar(
        tmp_path / "t.tar", [("a.cls", b"0"), ("b.txt", b""), ("c.txt", b""), ("d.cls", b"3")]
    )
    handler = Decide(True, False)
    dp = wds([url2], required=["cls"], handler=handler)
    assert keys(dp) == ["a"]
    assert [e.key for e in handler.seen] == ["b", "c"]
    assert (dp.skipped.samples, dp.skipped.shards) == (1, 1)


def test_tar_errors_follow_the_tar_stage_policy(tmp_path):
    data = tar_bytes(ABC)
    bad = write_bytes(tmp_path / "cut.tar", data[:1700])
    good = write_tar(tmp_path / "good.tar", ABC)
    tar = tar_pipe([bad, good], handler="skip")
    dp = tar.webdataset()
    got = list(dp)
    assert [(s["__key__"], s["__url__"]) for s in got][-3:] == [
        ("a", good),
        ("b", good),
        ("c", good),
    ]
    assert all(s["__url__"] == bad for s in got[:-3])
    assert tar.skipped.shards == 1 and not dp.skipped
