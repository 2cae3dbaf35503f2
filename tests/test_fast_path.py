"""The fast path for small samples gives exactly what the general path gives.

Three fast parts, each against the code it stands in for, on random archives (good ones, and
ones with every anomaly the general path reports):

- the bulk tar scanner (``formats/tarblocks.py``) against the member-by-member one
  (``formats/tarheaders.py``): the same members, positions, carry and errors;
- ``webdataset()`` fused to ``load_from_tar()`` (runs of whole samples grouped in bulk)
  against the same stage over a source it cannot fuse with (member by member): the same
  samples in the same order, the same skips, the same errors;
- ``decode()`` straight over ``webdataset()`` (runs of samples decoded from the shard's
  bytes) against ``decode()`` of the samples: the same samples, values, skips and errors;
- the lean shuffle holding deferred samples against the same shuffle over the samples
  themselves: the same order;
- the shuffle's slots made a block of draws at a time against one draw per item, and the lean
  shuffle and batch reading ``decode()``'s runs (and the shuffle's own iterator) against the
  same stages over a source they cannot fuse with: the same batches and errors.
"""

from __future__ import annotations

import contextlib
import io
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _hyp import budget
from _tars import tar_bytes, write_bytes
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._lean import LeanBatcherIterDataPipe, LeanShufflerIterDataPipe
from shardpipes.errors import ShardpipesError
from shardpipes.formats import tarblocks, tarheaders, tarparse
from shardpipes.plan.seeds import buffered_shuffle, shuffle_draws

pytestmark = pytest.mark.filterwarnings("ignore::shardpipes.errors.SkippedInputWarning")

FORMATS = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
KEYS = st.sampled_from(["a", "b", "c", "d/e", "a.b/f", "g/h", "x" * 120, "ü", "k"])
EXTS = st.sampled_from([".cls", ".json", ".txt", ".seg.png", "", ".cls"])
PAYLOADS = st.one_of(st.binary(max_size=700), st.sampled_from([b"", b"1", b"x" * 513]))


def _same(item):  # module level: the graph pickles
    return item


def _outcome(fn):
    try:
        return ("ok", fn())
    except ShardpipesError as exc:
        return ("error", type(exc).__name__, str(exc).split("\n")[0])  # torch may add a note


def _mutate(raw: bytearray, data) -> bytes:
    action = data.draw(st.sampled_from(["none", "none", "flip", "truncate", "name", "size"]))
    if raw and action == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "truncate":
        del raw[data.draw(st.integers(0, len(raw))) :]
    elif len(raw) >= 512 and action in ("name", "size"):
        block = data.draw(st.integers(0, len(raw) // 512 - 1)) * 512
        if action == "name":  # a NUL inside a name, bytes after it
            raw[block + 3 : block + 6] = b"\0zz"
        else:
            raw[block + 124 : block + 136] = data.draw(
                st.sampled_from([b"0000000001 \0", b" 0000000001\0", b"\x80" + b"\0" * 11])
            )
    return bytes(raw)


def _scan_all(scan, buf: bytes, stop_step: int, base: int):
    """Scan ``buf`` as the stream reader does (windows of ``stop_step``): every result."""
    out = []
    pos = 0
    carry = [None, tarheaders.NO_PAX, None]
    while pos < len(buf):
        entries, pos, end, need = scan(buf, pos, pos + stop_step, base, "mem://x.tar", carry)
        out.append((entries, pos, end, need, list(carry)))
        if end or not entries and need > len(buf) - pos:
            break
    return out


@contextlib.contextmanager
def _bulk_everywhere(on: bool):
    """With ``on``, every window of the scanner is parsed in bulk, however few its headers
    (the archives here are small: by default most of their windows go to the general scanner,
    and the grouping would rarely meet a ``Run``)."""
    saved = tarblocks._MIN_BLOCKS, tarblocks._MIN_HEADERS
    if on:
        tarblocks._MIN_BLOCKS = tarblocks._MIN_HEADERS = 0
    try:
        yield
    finally:
        tarblocks._MIN_BLOCKS, tarblocks._MIN_HEADERS = saved


def _bulk(buf, pos, stop, base, url, carry, sparse_blocks=tarblocks._SPARSE_BLOCKS):
    return tarblocks.scan(
        buf, pos, stop, base, url, carry, min_blocks=0, min_headers=0, sparse_blocks=sparse_blocks
    )


@settings(max_examples=budget(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.tuples(KEYS, EXTS), PAYLOADS), min_size=0, max_size=30),
    FORMATS,
    st.sampled_from([512, 1024, 4096, 1 << 20]),
    st.integers(0, 3),
    # 0: every window walked header to header; 16: the default (walked when its members are
    # large); 2**30: found by testing every block (but a window of fewer than 8 headers).
    st.sampled_from([0, tarblocks._SPARSE_BLOCKS, 1 << 30]),
    st.data(),
)
def test_bulk_scanner_matches_the_general_one(members, fmt, stop_step, base_blocks, sparse, data):
    named = [(key + ext, payload) for (key, ext), payload in members]
    raw = _mutate(bytearray(_build(named, fmt)), data)
    base = base_blocks * 512
    general = _outcome(lambda: _scan_all(tarheaders.scan, raw, stop_step, base))
    bulk = _outcome(
        lambda: _scan_all(lambda *a: _bulk(*a, sparse_blocks=sparse), raw, stop_step, base)
    )
    assert bulk == general


@settings(max_examples=budget(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.tuples(KEYS, EXTS), PAYLOADS), min_size=0, max_size=30),
    FORMATS,
    st.sampled_from([512, 4096, 1 << 20]),
    st.integers(0, 3),
    st.sampled_from([0, tarblocks._SPARSE_BLOCKS, 1 << 30]),
    st.data(),
)
def test_runs_are_the_spans_the_scanner_returns(members, fmt, stop_step, base_blocks, sparse, data):
    """A ``Run`` (the scanner's arrays) says what its list of spans says, member by member,
    and the parts it is cut into hold the same members as the list's parts."""
    named = [(key + ext, payload) for (key, ext), payload in members]
    raw = _mutate(bytearray(_build(named, fmt)), data)
    base = base_blocks * 512

    def scan(runs: bool):
        return lambda *a: tarblocks.scan(
            *a, min_blocks=0, min_headers=0, sparse_blocks=sparse, runs=runs
        )

    as_lists = _outcome(lambda: _scan_all(scan(False), raw, stop_step, base))
    as_runs = _outcome(lambda: _scan_all(scan(True), raw, stop_step, base))
    if as_runs[0] == "error":
        assert as_runs == as_lists
        return
    assert len(as_runs[1]) == len(as_lists[1])
    for (run, *rest), (spans, *want) in zip(as_runs[1], as_lists[1], strict=True):
        assert rest == want
        if type(run) is not tarblocks.Run:
            assert run == spans
            continue
        assert run.spans() == spans
        assert [run[i] for i in range(len(run))] == spans
        assert [run.name(i) for i in range(len(run))] == [s[0] for s in spans]
        cut = [p.spans() for p in tarparse._parts(run, 1024)]
        assert sum(cut, []) == spans
        # Each part: as much as 1 KiB of data holds, or one member.
        for part, after in zip(cut, [*cut[1:], []], strict=True):
            held = sum(s[3] for s in part)
            assert part and (held <= 1024 or len(part) == 1)
            assert not after or held + after[0][3] > 1024


def test_byte_sums_are_the_sums_of_the_bytes():
    """The checksum's sum of each header's 512 bytes, added two bytes to a 16-bit lane."""
    rng = np.random.default_rng(0)
    for n in (1, 3, 700, 2100):
        rows = rng.integers(0, 256, (n, 512), dtype=np.uint8)
        rows[0] = 255  # the largest sum: no lane may carry into the next
        rows[-1] = 0
        assert tarblocks._byte_sums(rows).tolist() == rows.sum(axis=1, dtype=np.int64).tolist()


def _build(members, fmt) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            try:
                t.addfile(info, io.BytesIO(payload))
            except ValueError:  # a name this format cannot hold
                continue
    return buf.getvalue()


# Shards of many small samples, with anomalies here and there: what bulk grouping must hand to
# the member-by-member rule, unchanged.
SAMPLE = st.tuples(
    # Key stem (numbered below); with padded numbers, a 90-byte stem makes 100-byte names (no
    # NUL in the name field) and "ü" a key of multi-byte characters.
    st.sampled_from(["s", "t/u", "v.w/x", "y", "ü", "z" * 90]),
    st.sampled_from(
        [
            (".cls", ".json", ".bin"),
            (".cls", ".json", ".bin"),
            (".cls", ".json", ".bin"),
            (".cls", ".txt"),
            (".cls", ".cls"),  # a repeated extension
            (".cls", ""),  # a member without one
            (".a.b",),
        ]
    ),
    st.booleans(),  # a key that comes back later (not adjacent)
)


def _shard(samples, payload: bytes, padded: bool = False) -> list[tuple[str, bytes]]:
    """Members of ``samples``; ``padded``: every number in 5 digits (keys of one length: the
    grouping compares the names of such runs as arrays, formats/tarblocks.py ``Run``)."""
    members = []
    for n, (stem, exts, again) in enumerate(samples):
        number = n // 2 if again and n % 2 else n  # odd ones may reuse their neighbour's key
        key = f"{stem}{number:05d}" if padded else f"{stem}{number}"
        members += [(key + ext, payload + bytes([n % 256])) for ext in exts]
    return members


@settings(max_examples=budget(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(SAMPLE, min_size=1, max_size=120),
    st.sampled_from([b"", b"p" * 40, b"q" * 700]),
    st.sampled_from(["raise", "skip", "stop"]),
    st.sampled_from([(), (".cls",), (".json",)]),
    st.sampled_from([8192, 1 << 20]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_fused_grouping_matches_member_by_member(
    tmp_path_factory, samples, payload, handler, required, chunk_size, mapped, padded, bulk, data
):
    members = _shard(samples, payload, padded)
    raw = _mutate(bytearray(tar_bytes(members, tarfile.USTAR_FORMAT)), data)
    path = write_bytes(tmp_path_factory.mktemp("s") / "s.tar", raw)
    later = write_bytes(tmp_path_factory.mktemp("t") / "t.tar", tar_bytes(_shard(samples, b"")))

    def source():
        if mapped:  # local files: the memory-mapped reader
            return IterableWrapper([path, later]).open_files_by_fsspec(mode="rb")
        return IterableWrapper(  # streams: the chunked reader
            [(path, io.BytesIO(raw)), (later, io.BytesIO(open(later, "rb").read()))]
        )

    def run(fused: bool):
        tars = source().load_from_tar(chunk_size=chunk_size)
        if not fused:
            tars = tars.map(_same)  # webdataset() cannot fuse through map(): member by member
        dp = tars.webdataset(required=required, handler=handler)
        got = _outcome(lambda: [dict(s) for s in dp])
        return got, dp.skipped.samples, dp.skipped.shards

    with _bulk_everywhere(bulk):
        assert run(fused=True) == run(fused=False)


def _picky(data: bytes) -> tuple[int, bytes]:
    """A decoder that fails on some values (the last byte a multiple of 7)."""
    if data and data[-1] % 7 == 0:
        raise ValueError(f"no: {data[-1]}")
    return len(data), data[-1:]


@settings(max_examples=budget(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(SAMPLE, min_size=1, max_size=120),
    st.sampled_from([b"", b"p" * 40, b"q" * 700]),
    st.sampled_from(["raise", "skip", "stop"]),
    st.sampled_from(["raise", "skip", "stop"]),
    st.sampled_from([8192, 1 << 20]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_fused_decoding_matches_decoding_the_samples(
    tmp_path_factory,
    samples,
    payload,
    wds_handler,
    handler,
    chunk_size,
    mapped,
    picky,
    padded,
    bulk,
    data,
):
    """decode() straight over webdataset() (runs decoded from the shard's bytes) == decode() of
    the samples webdataset() yields: samples, field order, value types, skips and errors."""
    members = _shard(samples, payload, padded)
    raw = _mutate(bytearray(tar_bytes(members, tarfile.USTAR_FORMAT)), data)
    path = write_bytes(tmp_path_factory.mktemp("s") / "s.tar", raw)
    tail = tar_bytes(_shard(samples, b""))
    later = write_bytes(tmp_path_factory.mktemp("t") / "t.tar", tail)
    decoders = {"cls": _picky, "seg.png": _picky} if picky else {"txt": _picky}

    def run(fused: bool):
        if mapped:
            src = IterableWrapper([path, later]).open_files_by_fsspec(mode="rb")
        else:
            src = IterableWrapper([(path, io.BytesIO(raw)), (later, io.BytesIO(tail))])
        wds = src.load_from_tar(chunk_size=chunk_size).webdataset(handler=wds_handler)
        dp = (wds if fused else wds.map(_same)).decode(decoders=decoders, handler=handler)
        got = _outcome(lambda: [[(k, type(v), v) for k, v in s.items()] for s in dp])
        return got, wds.skipped.samples, wds.skipped.shards, dp.skipped.samples

    with _bulk_everywhere(bulk):
        assert run(fused=True) == run(fused=False)


def test_fused_decoding_takes_the_bulk_path(tmp_path):
    """The benchmark's shape is decoded in runs; the values are what decode() makes."""
    members = [
        (f"{i:06d}{ext}", b"%d" % i if ext != ".json" else b'{"i": %d}' % i)
        for i in range(3000)
        for ext in (".cls", ".json", ".bin")
    ]
    path = write_bytes(tmp_path / "s.tar", tar_bytes(members, tarfile.USTAR_FORMAT))
    wds = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    runs = [x for x in wds.decoded(lambda shape: [None] * len(shape)) if type(x) is list]
    assert sum(map(len, runs)) > 2900  # all but the heads and tails of parts
    got = list(wds.decode())
    assert [(s["__key__"], s[".cls"], s[".json"], bytes(s[".bin"])) for s in got] == [
        (f"{i:06d}", i, {"i": i}, b"%d" % i) for i in range(3000)
    ]
    assert all(type(s[".bin"]).__name__ == "StreamBytes" for s in got)


# .json values the column decoder (decoders.decode_json_values) must read as decode_json does:
# documents, space around them, a BOM, text after one, bad UTF-8, bad JSON, nothing at all.
JSON_VALUES = [
    b'{"i": 1, "n": "s"}',
    b"[1, 2.5, null]",
    b'"\\u00fc"',
    b" {}",
    b"{} \n",
    b"\xef\xbb\xbf{}",
    b"{}x",
    b"\xff",
    b"{",
    b"",
    b"1e400",
    b"NaN",
]


@settings(max_examples=budget(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(JSON_VALUES), min_size=1, max_size=400),
    st.sampled_from(["raise", "skip", "stop"]),
    st.booleans(),
    st.booleans(),
)
def test_fused_json_column_matches_decoding_the_samples(
    tmp_path_factory, values, handler, mapped, bulk
):
    """decode() over webdataset() decodes a run's .json column at once: the same values, skips
    and errors as decode() of each sample's .json."""
    members = [
        (f"{i:05d}{ext}", b"%d" % i if ext == ".cls" else v)
        for i, v in enumerate(values)
        for ext in (".cls", ".json")
    ]
    raw = tar_bytes(members, tarfile.USTAR_FORMAT)
    path = write_bytes(tmp_path_factory.mktemp("s") / "s.tar", raw)

    def run(fused: bool):
        if mapped:
            src = IterableWrapper([path]).open_files_by_fsspec(mode="rb")
        else:
            src = IterableWrapper([(path, io.BytesIO(raw))])
        wds = src.load_from_tar().webdataset()
        dp = (wds if fused else wds.map(_same)).decode(handler=handler)
        got = _outcome(lambda: [[(k, type(v), repr(v)) for k, v in s.items()] for s in dp])
        return got, dp.skipped.samples

    with _bulk_everywhere(bulk):
        assert run(fused=True) == run(fused=False)


def test_json_column_is_decode_json_of_each_value():
    from shardpipes.formats.decoders import decode_json, decode_json_values

    def outcome(fn):
        try:
            return ("ok", repr(fn()))
        except (ValueError, UnicodeDecodeError) as exc:
            return ("error", type(exc).__name__, str(exc))

    for value in JSON_VALUES:
        for column in ([value], [b"{}", value, b"[]"], [memoryview(value)]):
            assert outcome(lambda c=column: decode_json_values(c)) == outcome(
                lambda c=column: [decode_json(bytes(x)) for x in c]
            ), column


@settings(max_examples=budget(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(SAMPLE, min_size=1, max_size=300),
    st.sampled_from([1, 7, 100, 1000]),
    st.integers(0, 2**32),
)
def test_deferred_shuffle_matches_the_shuffle_of_the_samples(
    tmp_path_factory, samples, buffer_size, seed
):
    members = _shard(samples, b"z" * 100)
    path = write_bytes(tmp_path_factory.mktemp("s") / "s.tar", tar_bytes(members))

    def wds():
        tars = IterableWrapper([path, path]).open_files_by_fsspec(mode="rb").load_from_tar()
        return tars.webdataset(handler="skip")

    fast = LeanShufflerIterDataPipe(wds(), buffer_size, True, seed)
    want = list(buffered_shuffle(list(wds()), seed, buffer_size))
    got = list(fast)
    assert [type(s) for s in got] == [dict] * len(want)
    assert got == want
    assert [list(s) for s in got] == [list(s) for s in want]  # field order too


def test_a_large_shard_takes_the_bulk_paths(tmp_path):
    """The shapes the benchmark reads: bulk scan, bulk grouping and deferred samples all run."""
    members = [
        (f"{i:06d}{ext}", b"%d" % i) for i in range(3000) for ext in (".cls", ".json", ".bin")
    ]
    path = write_bytes(tmp_path / "s.tar", tar_bytes(members, tarfile.USTAR_FORMAT))
    tars = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_tar()
    wds = tars.webdataset()
    deferred = list(wds.deferred())
    assert sum(type(s) is tuple for s in deferred) > 2900  # all but the heads and tails of parts
    assert [tarblocks.scan.__module__] == ["shardpipes.formats.tarblocks"]
    samples = list(wds)
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(3000)]
    assert all(
        s[".bin"] == b"%d" % i and s[".bin"].read() == b"%d" % i for i, s in enumerate(samples)
    )


def _shuffle_one_draw_at_a_time(items, seed: int, buffer_size: int):
    """The buffered shuffle as it was written first: one counter-based draw per item."""
    it = iter(items)
    buffer = []
    for x in it:
        buffer.append(x)
        if len(buffer) == buffer_size:
            break
    draws = shuffle_draws(seed, 0, 3 * (len(items) + buffer_size + 1)).tolist()
    d = 0
    for x in it:
        idx = int(draws[d] * buffer_size)
        d += 1
        val, buffer[idx] = buffer[idx], x
        yield val
    while buffer:
        yield buffer.pop(int(draws[d] * len(buffer)))
        d += 1


@settings(max_examples=budget(60), deadline=None)
@given(st.integers(0, 9000), st.sampled_from([1, 2, 7, 1000, 4096, 5000]), st.integers(0, 2**63))
def test_shuffle_slots_made_in_blocks_are_the_draws_one_by_one(n, buffer_size, seed):
    """buffered_shuffle's slots, made a numpy block at a time, give the order of one draw each
    (across block boundaries: blocks are 4096 draws)."""
    items = list(range(n))
    assert list(buffered_shuffle(items, seed, buffer_size)) == list(
        _shuffle_one_draw_at_a_time(items, seed, buffer_size)
    )


@settings(max_examples=budget(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 150),
    st.lists(SAMPLE, min_size=1, max_size=100),
    st.sampled_from([1, 7, 100]),
    st.sampled_from([1, 3, 64]),
    st.booleans(),
    st.sampled_from(["raise", "skip"]),
    st.booleans(),
    st.integers(0, 2**32),
)
def test_shuffle_and_batch_over_decode_match_the_general_path(
    tmp_path_factory, uniform, samples, buffer_size, batch_size, drop_last, handler, picky, seed
):
    """The lean shuffle reading decode()'s runs (parts()) and the lean batch reading the
    shuffle's own iterator give the batches (and errors) of the same stages over a source
    they cannot fuse with."""
    # A run of samples of one shape first, with values every decoder takes (the picky one
    # fails on some): runs decoded together, as in a large shard.
    samples = [("s", (".cls", ".json", ".bin"), False)] * uniform + samples
    values = {".cls": b"%d", ".json": b'{"n": %d}', ".txt": b"t%d"}
    members = [
        (name, values.get(name[name.find(".") :], b"b%d") % n)
        for n, (name, _) in enumerate(_shard(samples, b"", padded=True))
    ]
    path = write_bytes(tmp_path_factory.mktemp("s") / "s.tar", tar_bytes(members))
    decoders = {"cls": _picky} if picky else {}

    def run(fused: bool):
        tars = IterableWrapper([path, path]).open_files_by_fsspec(mode="rb").load_from_tar()
        dp = tars.webdataset(handler="skip").decode(decoders=decoders, handler=handler)
        if not fused:
            dp = dp.map(_same)  # neither the shuffle nor the batch can fuse through map()
        shuffled = LeanShufflerIterDataPipe(dp, buffer_size, True, seed)
        batched = LeanBatcherIterDataPipe(shuffled, batch_size, drop_last, list)
        if not fused:  # nor the batch through a shuffle it does not know
            batched = LeanBatcherIterDataPipe(shuffled.map(_same), batch_size, drop_last, list)
        got = []

        def take():
            for b in batched:
                got.append([[(k, type(v), v) for k, v in s.items()] for s in b])
            return len(got)

        return _outcome(take), got

    with _bulk_everywhere(True):  # runs of samples, as a large shard has
        assert run(fused=True) == run(fused=False)
