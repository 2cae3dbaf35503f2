"""load_from_tar and the tar parser under it: good archives, every way of being bad, policies."""

from __future__ import annotations

import io
import re
import string
import tarfile

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from _hyp import budget
from _tars import (
    ABC,
    FailingReader,
    TrickleReader,
    header_offsets,
    read_pair,
    tar_bytes,
    tar_pipe,
    tarfile_members,
    with_bad_checksum,
    write_bytes,
    write_tar,
)
from shardpipes.datapipes.iter import IterableWrapper, TarArchiveLoader
from shardpipes.datapipes.iter.fsspec import open_url
from shardpipes.errors import ShardFormatError, ShardReadError, SkippedInputWarning
from shardpipes.formats.stream import StreamBytes
from shardpipes.formats.tarparse import iter_tar

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
LONG_DIR = "d" * 60 + "/" + "e" * 60  # 121 chars: needs the ustar prefix field
LONG_NAME = "n" * 150 + ".txt"  # a basename too long for ustar: GNU 'L' or pax 'path'


def _members(url: str, **kwargs) -> list[tuple[str, bytes]]:
    return [read_pair(p) for p in tar_pipe([url], **kwargs)]


# --- the normal case -----------------------------------------------------------------------------


def test_yields_path_stream_pairs_in_archive_order(tmp_path):
    url = write_tar(tmp_path / "s.tar", ABC)
    pairs = list(tar_pipe([url]))
    assert [p for p, _ in pairs] == [f"{url}/{name}" for name, _ in ABC]
    stream = pairs[1][1]
    assert (stream.url, stream.name) == (url, "a.txt")
    assert [s.read() for _, s in pairs] == [data for _, data in ABC]


@pytest.mark.parametrize("chunk_size", [512, 1000, 1536, 1 << 20], ids=lambda c: f"chunk{c}")
def test_chunk_size_does_not_change_the_members(tmp_path, chunk_size):
    url = write_tar(tmp_path / "s.tar", ABC)
    assert _members(url, chunk_size=chunk_size) == [(f"{url}/{n}", d) for n, d in ABC]


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_offsets_match_tarfile(tmp_path, fmt):
    members = [("x.cls", b"1"), (f"{LONG_DIR}/y.txt", b"y" * 700), ("z.bin", b"")]
    if fmt != tarfile.USTAR_FORMAT:
        members.append((LONG_NAME, b"long"))
    data = tar_bytes(members, fmt)
    url = write_bytes(tmp_path / "s.tar", data)
    ref = tarfile_members(data)
    got = [stream for _, stream in tar_pipe([url])]
    assert [(s.name, s.offset, s.data_offset) for s in got] == [
        (m.name, m.offset, m.offset_data) for m in ref
    ]


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        (tarfile.USTAR_FORMAT, f"{LONG_DIR}/sample.jpg"),
        (tarfile.GNU_FORMAT, f"{LONG_DIR}/{LONG_NAME}"),
        (tarfile.PAX_FORMAT, f"{LONG_DIR}/{LONG_NAME}"),
        (tarfile.PAX_FORMAT, "dir/\u00e9t\u00e9-\u65e5\u672c.txt"),
        (tarfile.GNU_FORMAT, "dir/\u00e9t\u00e9-\u65e5\u672c.txt"),
    ],
    ids=["ustar-prefix", "gnu-longname", "pax-path", "pax-unicode", "gnu-unicode"],
)
def test_long_and_unicode_names_read_back(tmp_path, fmt, name):
    url = write_tar(tmp_path / "s.tar", [(name, b"payload"), ("next.cls", b"7")], fmt)
    assert _members(url) == [(f"{url}/{name}", b"payload"), (f"{url}/next.cls", b"7")]


def test_directories_and_links_are_not_members(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo("dir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        link = tarfile.TarInfo("dir/link.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
        info = tarfile.TarInfo("dir/a.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    url = write_bytes(tmp_path / "s.tar", buf.getvalue())
    assert _members(url) == [(f"{url}/dir/a.txt", b"ok")]


def test_valid_empty_archive_yields_nothing(tmp_path):
    url = write_tar(tmp_path / "empty.tar", [])
    assert list(tar_pipe([url])) == []


def test_empty_url_list_yields_nothing():
    assert list(tar_pipe([])) == []


def test_several_shards_in_order(tmp_path):
    a = write_tar(tmp_path / "a.tar", ABC[:2])
    b = write_tar(tmp_path / "b.tar", ABC[2:])
    assert [p for p, _ in _members(a) + _members(b)] == [p for p, _ in tar_pipe([a, b])]


def test_iter_tar_reads_a_member_range_without_end_blocks():
    # The shard index reads sample ranges (whole members, no end-of-archive blocks).
    data = tar_bytes(ABC)
    cut = tarfile_members(data)[2].offset  # the header of b.cls
    got = [(e.name, e.data) for e in iter_tar(io.BytesIO(data[:cut]), "u", require_end=False)]
    assert got == ABC[:2]


def test_iter_tar_survives_short_reads():
    # Sockets and HTTP bodies may return fewer bytes than asked before the end.
    data = tar_bytes(ABC)
    for step in (1, 100, 511, 513):
        got = [(e.name, e.data) for e in iter_tar(TrickleReader(data, step), "u", chunk_size=512)]
        assert got == ABC, step


# --- resources -----------------------------------------------------------------------------------


def test_streams_are_closed_after_each_shard_and_on_early_exit(tmp_path):
    a = write_tar(tmp_path / "a.tar", ABC)
    b = write_tar(tmp_path / "b.tar", ABC)
    files = [open(a, "rb"), open(b, "rb")]  # noqa: SIM115 - the stage closes them
    try:
        dp = IterableWrapper([(a, files[0]), (b, files[1])], deepcopy=False).load_from_tar()
        it = iter(dp)
        for _ in range(len(ABC) + 1):  # all of a, first member of b
            next(it)
        assert files[0].closed and not files[1].closed
        it.close()
        assert files[1].closed
    finally:
        for f in files:
            f.close()


def test_stream_is_closed_when_the_shard_is_bad(tmp_path):
    url = write_bytes(tmp_path / "bad.tar", tar_bytes(ABC)[:700])
    f = open(url, "rb")  # noqa: SIM115 - the stage closes it
    dp = IterableWrapper([(url, f)], deepcopy=False).load_from_tar()
    with pytest.raises(ShardFormatError):
        list(dp)
    assert f.closed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "w"}, r"mode 'w' is not supported"),
        ({"chunk_size": 100}, r"chunk_size \(100\) should be at least 512"),
        (
            {"handler": "ignore"},
            r"handler 'ignore' is not a known policy; must be one of raise, warn_and_skip",
        ),
    ],
    ids=["mode", "chunk_size", "handler"],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TarArchiveLoader(IterableWrapper([]), **kwargs)


# --- bad input -----------------------------------------------------------------------------------


def _cut_points(data: bytes) -> dict[str, tuple[int, int, str]]:
    """Named cut points: (cut, expected offset in the error, expected text in the error)."""
    ref = tarfile_members(data)
    b_txt = ref[3]  # 800 bytes of data, so 224 bytes of padding after it
    end = ref[-1].offset_data + 512  # the end-of-archive blocks (c.txt has 5 bytes)
    return {
        "in-first-header": (100, 0, "inside a header"),
        "in-later-header": (ref[2].offset + 300, ref[2].offset, "inside a header"),
        "in-member-data": (b_txt.offset_data + 400, b_txt.offset, "inside member 'b.txt'"),
        "in-padding": (b_txt.offset_data + 810, b_txt.offset_data + 810, "in the padding"),
        "in-end-blocks": (end + 200, end, "inside a header"),
        "on-member-boundary": (ref[2].offset, ref[2].offset, "no end-of-archive marker"),
    }


CUTS = list(_cut_points(tar_bytes(ABC)))


@pytest.mark.parametrize("chunk_size", [512, 1 << 20], ids=["chunk512", "chunk1M"])
@pytest.mark.parametrize("where", CUTS)
def test_truncated_archive_names_url_and_offset(tmp_path, where, chunk_size):
    data = tar_bytes(ABC)
    cut, offset, what = _cut_points(data)[where]
    url = write_bytes(tmp_path / "cut.tar", data[:cut])
    dp = tar_pipe([url], chunk_size=chunk_size)
    it = iter(dp)
    before = [
        read_pair(next(it))
        for _ in range(sum(m.offset_data + m.size <= cut for m in tarfile_members(data)))
    ]
    assert [name.rsplit("/", 1)[1] for name, _ in before] == [n for n, _ in ABC[: len(before)]]
    pattern = (
        rf"^{re.escape(url)}: truncated tar archive at byte offset {offset} \({re.escape(what)}"
    )
    with pytest.raises(ShardFormatError, match=pattern) as info:
        next(it)
    assert (info.value.url, info.value.offset) == (url, offset)


@pytest.mark.parametrize("chunk_size", [512, 1 << 20], ids=["chunk512", "chunk1M"])
@pytest.mark.parametrize("member", [0, 2, 5], ids=["first", "middle", "last"])
def test_corrupt_header_checksum_names_url_and_offset(tmp_path, member, chunk_size):
    data = tar_bytes(ABC)
    offset = header_offsets(data)[member]
    url = write_bytes(tmp_path / "bad.tar", with_bad_checksum(data, offset))
    pattern = (
        rf"^{re.escape(url)}: corrupt tar header at byte offset {offset} \(checksum mismatch\)"
    )
    with pytest.raises(ShardFormatError, match=pattern):
        list(tar_pipe([url], chunk_size=chunk_size))


def test_corrupt_checksum_field_itself(tmp_path):
    data = bytearray(tar_bytes(ABC))
    data[148:156] = b"zzzzzzz\0"
    url = write_bytes(tmp_path / "bad.tar", bytes(data))
    with pytest.raises(
        ShardFormatError, match=rf"{re.escape(url)}: corrupt tar header at byte offset 0"
    ):
        list(tar_pipe([url]))


def test_zero_byte_file(tmp_path):
    url = write_bytes(tmp_path / "zero.tar", b"")
    with pytest.raises(ShardFormatError, match=rf"^{re.escape(url)}: empty file \(0 bytes\)"):
        list(tar_pipe([url]))


def test_missing_file_names_the_url(tmp_path):
    url = str(tmp_path / "nope.tar")
    with pytest.raises(ShardReadError, match=rf"^{re.escape(url)}: no such file") as info:
        list(tar_pipe([url]))
    assert isinstance(info.value, FileNotFoundError)


def _with_size_field(data: bytes, header: int, field: bytes) -> bytes:
    out = bytearray(data)
    out[header + 124 : header + 136] = field
    return bytes(out)


@pytest.mark.parametrize(
    "field",
    [b"-0000001130\0", b"\xff" * 12, b"\x80" + b"\xff" * 11, b"0000000z000\0"],
    ids=["negative-octal", "negative-base256", "huge-base256", "not-octal"],
)
@pytest.mark.timeout(30)  # a negative size once made the parser spin forever
def test_corrupt_size_field_is_a_format_error(field):
    # A negative size used to spin forever; a huge one raised OverflowError from read().
    good = tar_bytes(ABC)
    offset = header_offsets(good)[1]
    data = _with_size_field(good, offset, field)
    with pytest.raises(ShardFormatError, match=rf"^u: corrupt tar header at byte offset {offset}"):
        list(iter_tar(io.BytesIO(data), "u"))


def test_corrupt_size_is_reported_before_reading_it():
    # A flipped bit that claims 8 GiB: the bad checksum is found without reading 8 GiB first.
    data = tar_bytes(ABC)
    offset = header_offsets(data)[1]
    bad = _with_size_field(data, offset, b"77777777777\0")
    reads: list[int] = []

    class Recording(io.BytesIO):
        def read(self, n=-1):
            reads.append(n)
            return super().read(n)

    with pytest.raises(ShardFormatError, match=rf"byte offset {offset} \(checksum mismatch\)"):
        list(iter_tar(Recording(bad), "u", chunk_size=512))
    assert max(reads) < 1 << 20


def test_corrupt_pax_size_record(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size, info.pax_headers = 3, {"size": "3"}
        tar.addfile(info, io.BytesIO(b"abc"))
    data = buf.getvalue().replace(b"size=3\n", b"size=z\n")  # pax data is not checksummed
    url = write_bytes(tmp_path / "pax.tar", data)
    with pytest.raises(
        ShardFormatError, match=rf"^{re.escape(url)}: corrupt pax header at byte offset 0"
    ):
        list(tar_pipe([url]))


# --- handler policies ----------------------------------------------------------------------------


@pytest.fixture
def bad_then_good(tmp_path):
    """A shard truncated inside its 4th member, then a good one."""
    data = tar_bytes(ABC)
    cut = tarfile_members(data)[3].offset_data + 10
    bad = write_bytes(tmp_path / "bad.tar", data[:cut])
    good = write_tar(tmp_path / "good.tar", ABC)
    return bad, good


def _names(pairs):
    return [p for p, _ in pairs]


@pytest.mark.parametrize("handler", ["skip", "warn_and_skip"])
def test_skip_drops_the_rest_of_the_shard_and_counts_it(bad_then_good, handler):
    bad, good = bad_then_good
    dp = tar_pipe([bad, good], handler=handler)
    if handler == "warn_and_skip":
        with pytest.warns(SkippedInputWarning, match=rf"{re.escape(bad)}: truncated tar archive"):
            got = _names(dp)
    else:
        got = _names(dp)  # any warning would fail: ShardpipesWarning is an error here
    assert got == [f"{bad}/{n}" for n, _ in ABC[:3]] + [f"{good}/{n}" for n, _ in ABC]
    assert (dp.skipped.shards, dp.skipped.samples) == (1, 0)
    assert dp.skipped.examples[0][0] == bad
    assert "ShardFormatError" in dp.skipped.examples[0][1]


def test_stop_ends_the_stream_at_the_bad_shard(bad_then_good):
    bad, good = bad_then_good
    dp = tar_pipe([bad, good], handler="stop")
    assert _names(dp) == [f"{bad}/{n}" for n, _ in ABC[:3]]
    assert (dp.skipped.shards, dp.skipped.samples) == (1, 0)


def test_raise_is_the_default(bad_then_good):
    bad, good = bad_then_good
    dp = tar_pipe([bad, good])
    with pytest.raises(ShardFormatError, match=re.escape(bad)):
        list(dp)
    assert not dp.skipped


class Recorder:
    """A handler that records what it saw and answers ``skip`` (module level: it pickles)."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.seen: list[BaseException] = []

    def __call__(self, exc: BaseException) -> bool:
        self.seen.append(exc)
        return self.skip


@pytest.mark.parametrize("skip", [True, False], ids=["returns-True", "returns-False"])
def test_callable_handler_decides(bad_then_good, skip):
    bad, good = bad_then_good
    rec = Recorder(skip)
    dp = tar_pipe([bad, good], handler=rec)
    got = _names(dp)
    assert len(got) == (3 + len(ABC) if skip else 3)
    assert [type(e) for e in rec.seen] == [ShardFormatError]
    assert rec.seen[0].url == bad
    assert dp.skipped.shards == 1


def refuse(exc: BaseException) -> bool:
    raise RuntimeError("handler says no") from exc


def test_callable_handler_may_raise(bad_then_good):
    bad, good = bad_then_good
    with pytest.raises(RuntimeError, match="handler says no"):
        list(tar_pipe([bad, good], handler=refuse))


def test_skip_counts_each_bad_shard(tmp_path):
    good = write_tar(tmp_path / "good.tar", ABC)
    zero = write_bytes(tmp_path / "zero.tar", b"")
    corrupt = write_bytes(tmp_path / "corrupt.tar", with_bad_checksum(tar_bytes(ABC), 0))
    dp = tar_pipe([zero, good, corrupt], handler="skip")
    assert len(_names(dp)) == len(ABC)
    assert dp.skipped.shards == 2
    assert [url for url, _ in dp.skipped.examples] == [zero, corrupt]


# --- property tests of the parser ----------------------------------------------------------------

_SEGMENT = st.text(
    alphabet=string.ascii_letters + string.digits + "._-\u00e9\u65e5", min_size=1, max_size=40
)


def _names_for(fmt: int):
    segments = 3 if fmt == tarfile.USTAR_FORMAT else 6
    return st.lists(_SEGMENT, min_size=1, max_size=segments).map("/".join)


@st.composite
def archives(draw):
    fmt = draw(st.sampled_from(list(FORMATS.values())))
    entries = draw(st.lists(st.tuples(_names_for(fmt), st.integers(0, 2000)), max_size=6))
    members = [
        (name, bytes((i * 7 + k) % 251 for k in range(size)))
        for i, (name, size) in enumerate(entries)
    ]
    try:
        data = tar_bytes(members, fmt)
    except ValueError:  # a ustar name that no prefix split can hold
        reject()
    return members, data


@settings(max_examples=budget(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    archive=archives(),
    chunk_size=st.sampled_from([512, 1024, 1536, 4096, 1 << 20]),
    step=st.sampled_from([None, 1000, 513]),
)
def test_iter_tar_reads_back_what_tarfile_wrote(archive, chunk_size, step):
    members, data = archive
    stream = io.BytesIO(data) if step is None else TrickleReader(data, step)
    got = list(iter_tar(stream, "u", chunk_size=chunk_size))
    assert [(e.name, e.data) for e in got] == members
    ref = tarfile_members(data)
    assert [(e.offset, e.data_offset) for e in got] == [(m.offset, m.offset_data) for m in ref]


_BASE = tar_bytes(
    [("a.cls", b"1"), (f"{LONG_DIR}/{LONG_NAME}", b"x" * 700), ("b.txt", b"")], tarfile.PAX_FORMAT
)
_BASE_GNU = tar_bytes(
    [("a.cls", b"1"), (LONG_NAME, b"x" * 700), ("b.txt", b"yz")], tarfile.GNU_FORMAT
)
_HEADERS = sorted({m.offset for m in tarfile_members(_BASE)} | set(header_offsets(_BASE)))


@st.composite
def damaged(draw):
    data = bytearray(draw(st.sampled_from([_BASE, _BASE_GNU])))
    # Aim most changes at header blocks, where the parser makes its decisions, and at the
    # first byte of a size field (a '-' or 0xff there once made the parser spin or overflow).
    where = st.one_of(
        st.integers(0, len(data) - 1),
        st.sampled_from(_HEADERS).flatmap(lambda h: st.integers(h, h + 511)),
        st.sampled_from(_HEADERS).map(lambda h: h + 124),
    )
    value = st.one_of(st.integers(0, 255), st.sampled_from(list(b"-0123457 \0\x80\xff")))
    for pos, byte in draw(st.lists(st.tuples(where, value), max_size=4)):
        if pos < len(data):
            data[pos] = byte
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data if cut is None else data[:cut])


@pytest.mark.timeout(120)
@settings(max_examples=budget(60), deadline=None)
@given(data=damaged(), chunk_size=st.sampled_from([512, 1024, 1 << 20]))
def test_damaged_archives_parse_or_raise_shard_format_error(data, chunk_size):
    try:
        for entry in iter_tar(io.BytesIO(data), "u", chunk_size=chunk_size):
            assert entry.data_offset + len(entry.data) <= len(data)
    except ShardFormatError as exc:
        assert str(exc).startswith("u: ")
        assert exc.offset is not None and 0 <= exc.offset <= len(data)


# --- read errors mid-shard -----------------------------------------------------------------------


def test_read_error_mid_shard_propagates_by_default(tmp_path):
    data = tar_bytes(ABC)
    url = "s3://bucket/flaky.tar"
    dp = IterableWrapper([(url, FailingReader(data, url, 1536))], deepcopy=False).load_from_tar(
        chunk_size=512
    )
    with pytest.raises(
        ShardReadError, match=rf"^{re.escape(url)}: connection reset at byte offset 1536"
    ):
        list(dp)


@pytest.mark.parametrize("handler", ["skip", "warn_and_skip"])
def test_read_error_mid_shard_is_skipped_under_a_handler(tmp_path, handler):
    data = tar_bytes(ABC)
    flaky = "s3://bucket/flaky.tar"
    good = write_tar(tmp_path / "good.tar", ABC)
    source = [(flaky, FailingReader(data, flaky, 2048)), (good, open(good, "rb"))]  # noqa: SIM115
    dp = IterableWrapper(source, deepcopy=False).load_from_tar(chunk_size=512, handler=handler)
    if handler == "warn_and_skip":
        with pytest.warns(SkippedInputWarning, match="connection reset"):
            got = _names(dp)
    else:
        got = _names(dp)
    assert got == [f"{flaky}/a.cls", f"{flaky}/a.txt"] + [f"{good}/{n}" for n, _ in ABC]
    assert (dp.skipped.shards, dp.skipped.samples) == (1, 0)
    assert dp.skipped.examples[0][0] == flaky
    assert all(stream.closed for _, stream in source)


# --- the two read paths: a mapped local file, and a stream ---------------------------------------


def _open_as(path: str, kind: str) -> io.IOBase:
    """Open ``path`` to be read mapped (a plain file at offset 0) or as a stream (in memory)."""
    if kind == "mapped":
        return open(path, "rb")
    with open(path, "rb") as f:
        return io.BytesIO(f.read())


@pytest.mark.parametrize("path_kind", ["mapped", "stream"])
def test_large_members_read_back_on_both_paths(tmp_path, path_kind):
    # Members around 64 KiB, and one that is not a multiple of 512 (padding after it).
    members = [
        ("a.bin", bytes(range(256)) * 256),  # exactly 64 KiB
        ("a.cls", b"1"),
        ("b.bin", b"\x07" * (100_000 + 3)),
        ("c.bin", b"x" * (64 * 1024 - 1)),
    ]
    path = write_tar(tmp_path / "big.tar", members)
    with _open_as(path, path_kind) as f:
        got = list(iter_tar(f, path, chunk_size=4096))
    assert [(e.name, e.data) for e in got] == members
    assert all(
        isinstance(e.data, StreamBytes) and e.data.read() == d
        for e, (_, d) in zip(got, members, strict=True)
    )
    ref = tarfile_members(tar_bytes(members))
    assert [(e.offset, e.data_offset) for e in got] == [(m.offset, m.offset_data) for m in ref]


@pytest.mark.parametrize("path_kind", ["mapped", "stream"])
@pytest.mark.parametrize("where", CUTS)
def test_truncation_reads_the_same_on_both_paths(tmp_path, where, path_kind):
    data = tar_bytes(ABC)
    cut, offset, what = _cut_points(data)[where]
    path = write_bytes(tmp_path / "cut.tar", data[:cut])
    with _open_as(path, path_kind) as f:
        with pytest.raises(ShardFormatError, match=re.escape(what)) as info:
            list(iter_tar(f, path))
    assert info.value.offset == offset


@pytest.mark.parametrize(
    "compress",
    [
        pytest.param("gzip", id="gzip"),
        pytest.param("bz2", id="bzip2"),
        pytest.param("lzma", id="xz"),
    ],
)
@pytest.mark.parametrize("path_kind", ["mapped", "stream"])
def test_compressed_shards_stream(tmp_path, compress, path_kind):
    import importlib

    module = importlib.import_module(compress)
    path = write_bytes(tmp_path / "s.tar.z", module.compress(tar_bytes(ABC)))
    with _open_as(path, path_kind) as f:
        got = [(e.name, e.data) for e in iter_tar(f, path, chunk_size=512)]
    assert got == ABC


def test_corrupt_compression_is_named(tmp_path):
    import gzip

    data = gzip.compress(tar_bytes(ABC))
    path = write_bytes(tmp_path / "s.tar.gz", data[: len(data) // 2])
    with open(path, "rb") as f, pytest.raises(ShardFormatError, match=r"s\.tar\.gz: its gzip"):
        list(iter_tar(f, path))


def test_a_file_not_at_its_start_is_read_as_a_stream(tmp_path):
    # Mapping starts at byte 0: a file object already moved on must be read from where it is.
    data = tar_bytes(ABC)
    path = write_bytes(tmp_path / "s.tar", data)
    cut = tarfile_members(data)[2].offset
    with open(path, "rb") as f:
        f.seek(cut)
        got = [(e.name, e.data, e.offset) for e in iter_tar(f, path, start_offset=cut)]
    assert [(n, d) for n, d, _ in got] == ABC[2:]
    assert got[0][2] == cut


def test_compressed_fsspec_file_is_not_mapped(tmp_path):
    # fsspec's compression wrapper has a fileno() too, of the compressed file: reading must go
    # through the wrapper (and see the tar), never map the gzip bytes.
    import gzip

    path = write_bytes(tmp_path / "s.tar.gz", gzip.compress(tar_bytes(ABC)))
    dp = IterableWrapper([path]).open_files_by_fsspec(open_kwargs={"compression": "gzip"})
    assert [read_pair(p)[1] for p in dp.load_from_tar()] == [d for _, d in ABC]


@settings(max_examples=budget(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archive=archives(), chunk_size=st.sampled_from([512, 1536, 1 << 20]))
def test_mapped_path_reads_back_what_tarfile_wrote(tmp_path_factory, archive, chunk_size):
    members, data = archive
    path = write_bytes(tmp_path_factory.mktemp("m") / "s.tar", data)
    with open(path, "rb") as f:
        got = list(iter_tar(f, "u", chunk_size=chunk_size))
    assert [(e.name, e.data) for e in got] == members
    ref = tarfile_members(data)
    assert [(e.offset, e.data_offset) for e in got] == [(m.offset, m.offset_data) for m in ref]


@pytest.mark.timeout(120)
@settings(max_examples=budget(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=damaged())
def test_damaged_archives_fail_alike_mapped_and_streamed(tmp_path_factory, data):
    def outcome(stream):
        try:
            return [(e.name, e.data, e.offset) for e in iter_tar(stream, "u")]
        except ShardFormatError as exc:
            return (str(exc), exc.offset)

    path = write_bytes(tmp_path_factory.mktemp("d") / "s.tar", data)
    with open(path, "rb") as f:
        mapped = outcome(f)
    assert mapped == outcome(io.BytesIO(data))


# A remote stream hands its blocks over whole (RemoteStream.take_block) and the parser reads
# them in place; members straddling a block end are completed with a read of what they need.
_SPREAD = [
    (f"s{i:03d}.{'long' * 40 if i % 7 == 0 else 'bin'}", bytes([i]) * (i * 97 % 3000))
    for i in range(40)
]  # names of 160+ characters (pax records), sizes 0-2,999 bytes (padding of every length)


def _full(entries):
    return [(e.name, bytes(e.data), e.offset, e.data_offset) for e in entries]


@pytest.mark.http
@pytest.mark.parametrize("block_size", [700, 4096, 10_000, 1 << 20])
def test_remote_blocks_parsed_in_place_give_the_same_members(http_server, block_size):
    data = tar_bytes(_SPREAD)
    url = http_server.add("spread.tar", data)
    want = _full(iter_tar(io.BytesIO(data), url))
    with open_url(url, block_size=block_size) as f:
        assert f.take_block is not None  # the in-place path is the one parsed here
        assert _full(iter_tar(f, url)) == want
    requested = sorted(g.range for g in http_server.log.gets("spread.tar"))
    assert len(requested) == -(-len(data) // block_size)  # every block once, to the end


@pytest.mark.http
@pytest.mark.parametrize("block_size", [700, 4096])
@pytest.mark.parametrize("where", CUTS)
def test_remote_blocks_truncated_name_the_same_offset(http_server, where, block_size):
    data = tar_bytes(ABC)
    cut, offset, what = _cut_points(data)[where]
    url = http_server.add("cut.tar", data[:cut])
    with open_url(url, block_size=block_size) as f:
        got = []
        with pytest.raises(ShardFormatError, match=re.escape(what)) as info:
            got.extend((e.name, e.data) for e in iter_tar(f, url))
    assert got == ABC[: len(got)]
    assert (info.value.url, info.value.offset) == (url, offset)
