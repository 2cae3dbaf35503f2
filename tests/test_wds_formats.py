"""webdataset's field formats and caches: tenbin (``.ten``/``.tb``), msgpack, ``LMDBCached``."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shardpipes.webdataset as wds
from _hyp import budget
from shardpipes.formats import tenbin

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64"]
DTYPES += ["uint8", "uint16", "uint32", "uint64"]


@settings(max_examples=budget(200), deadline=None)
@given(
    st.lists(
        st.sampled_from(DTYPES).flatmap(
            lambda t: hnp.arrays(
                t, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
            )
        ),
        max_size=4,
    ),
    st.lists(st.text(alphabet="abcxyz01", max_size=8), min_size=4, max_size=4),
)
def test_tenbin_round_trips_every_array_with_its_info(arrays, infos):
    infos = infos[: len(arrays)]
    buf = tenbin.encode_buffer(arrays, infos)
    assert len(buf) % 16 == 0  # 16 bytes of magic and length, then 64-byte padded data
    back, found = tenbin.decode_buffer(bytes(buf), infos=True)
    assert found == infos
    assert len(back) == len(arrays)
    for a, b in zip(arrays, back, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape
        assert a.tobytes() == b.astype(a.dtype.newbyteorder("=")).tobytes()  # NaNs too
    assert tenbin.decode_buffer(buf, infos=infos)[0].shape == arrays[0].shape if arrays else True
    stream = io.BytesIO()
    tenbin.write(stream, arrays, infos)
    stream.seek(0)
    assert [a.shape for a in tenbin.read(stream)] == [a.shape for a in arrays]


def test_tenbin_layout_is_webdatasets():
    """The bytes of one array, chunk by chunk, as the format is written by webdataset."""
    buf = bytes(tenbin.encode_buffer([np.arange(3, dtype=np.uint8)], ["hi"]))
    header = b"u1".ljust(8, b"\0") + b"hi".ljust(8, b"\0") + struct.pack("<qq", 1, 3)
    want = b"~TenBin~" + struct.pack("<q", len(header)) + header.ljust(64, b"\0")
    want += b"~TenBin~" + struct.pack("<q", 3) + bytes([0, 1, 2]).ljust(64, b"\0")
    assert buf == want


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (b"~TenBin?" + bytes(8), "no chunk magic at byte 0"),
        (b"~TenBin~" + struct.pack("<q", 999) + bytes(64), "says 999 bytes"),
        (
            bytes(tenbin.encode_buffer([np.zeros(2)]))[:80],  # the header chunk alone
            "header without its data",
        ),
        (
            bytes(tenbin.encode_buffer([np.zeros(2)])).replace(b"f8\0", b"x9\0", 1),
            "unknown type code 'x9'",
        ),
    ],
)
def test_a_bad_tenbin_buffer_is_an_error_saying_what(buf, message):
    with pytest.raises(ValueError, match=message):
        tenbin.decode_buffer(buf)


def test_tenbin_refuses_what_it_cannot_encode(tmp_path):
    with pytest.raises(ValueError, match="cannot encode an array of bool"):
        tenbin.encode_buffer([np.zeros(2, dtype=bool)])
    with pytest.raises(ValueError, match="at most 8 ASCII"):
        tenbin.encode_buffer([np.zeros(2)], ["too long a name"])
    with pytest.raises(ValueError, match="has info 'a', not 'b'"):
        tenbin.decode_buffer(tenbin.encode_buffer([np.zeros(2)], ["a"]), infos=["b"])
    with pytest.raises(ValueError, match=r"should end in \.ten"):
        tenbin.save(str(tmp_path / "x.bin"), np.zeros(2))
    tenbin.save(str(tmp_path / "x.ten"), np.ones(2), np.zeros((2, 2)))
    assert [a.shape for a in tenbin.load(str(tmp_path / "x.ten"))] == [(2,), (2, 2)]


def test_the_writer_encodes_and_decode_reads_tenbin_and_msgpack(tmp_path):
    path = str(tmp_path / "formats.tar")
    with wds.TarWriter(path) as sink:
        sink.write(
            {
                "__key__": "a",
                "ten": np.arange(6.0).reshape(2, 3),
                "tb": [np.ones(1, dtype=np.uint32), np.zeros(2, dtype=np.int16)],
                "mp": {"label": 3, "tags": ["x", "y"]},
            }
        )
    (sample,) = list(wds.WebDataset(path, shardshuffle=False).decode())
    (ten,) = sample["ten"]
    assert ten.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert [a.dtype.name for a in sample["tb"]] == ["uint32", "int16"]
    assert sample["mp"] == {"label": 3, "tags": ["x", "y"]}


def _tar(path, keys):
    with wds.TarWriter(str(path)) as sink:
        for i, key in enumerate(keys):
            sink.write({"__key__": key, "cls": i})


def test_lmdb_cached_replays_the_recorded_pass_in_order_duplicate_keys_included(tmp_path):
    pytest.importorskip("lmdb")
    _tar(tmp_path / "a.tar", ["000000", "000001", "000002"])
    _tar(tmp_path / "b.tar", ["000000", "000001"])  # the same keys again, in another shard
    urls = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    db = str(tmp_path / "cache.lmdb")

    def dataset():
        return wds.DataPipeline(
            wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode(), wds.LMDBCached(db)
        )

    first = [(s["__key__"], s["cls"]) for s in dataset()]
    assert first == [("000000", 0), ("000001", 1), ("000002", 2), ("000000", 0), ("000001", 1)]
    for shard in urls:  # a replay does not read the shards
        open(shard, "wb").close()
    assert [(s["__key__"], s["cls"]) for s in dataset()] == first


def test_lmdb_cached_records_again_after_an_unfinished_pass(tmp_path):
    pytest.importorskip("lmdb")
    _tar(tmp_path / "a.tar", [f"{i:06d}" for i in range(5)])
    db = str(tmp_path / "cache.lmdb")
    ds = wds.WebDataset(str(tmp_path / "a.tar"), shardshuffle=False).decode().lmdb_cached(db)
    for n, _ in enumerate(ds):
        if n == 1:
            break
    assert [s["cls"] for s in ds] == [0, 1, 2, 3, 4]  # not the 2 of the unfinished pass
    assert [s["cls"] for s in ds] == [0, 1, 2, 3, 4]  # replayed


def test_lmdb_cached_under_several_readers_is_an_error_not_a_partial_cache(tmp_path):
    pytest.importorskip("lmdb")
    _tar(tmp_path / "a.tar", ["0", "1"])
    _tar(tmp_path / "b.tar", ["2", "3"])
    urls = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    ds = wds.WebDataset(urls, shardshuffle=False).lmdb_cached(str(tmp_path / "c.lmdb"))
    loader = wds.WebLoader(ds, batch_size=None, num_workers=2)
    try:
        with pytest.raises(ValueError, match=r"2 readers \(1 rank\(s\) x 2 worker\(s\)\)"):
            list(loader)
    finally:
        loader.shutdown()


def test_lmdb_cached_iterated_directly_and_by_a_loader_shares_one_database(tmp_path):
    """DataLoader2 iterates its own copy of the stage: the copy uses the open database (LMDB
    forbids opening one file twice in a process) and replays what the first pass recorded."""
    pytest.importorskip("lmdb")
    _tar(tmp_path / "a.tar", [f"{i:06d}" for i in range(4)])
    ds = wds.WebDataset(str(tmp_path / "a.tar"), shardshuffle=False).decode()
    ds = ds.lmdb_cached(str(tmp_path / "c.lmdb"))
    first = [s["cls"] for s in ds]
    loader = wds.WebLoader(ds, batch_size=None, num_workers=0)
    try:
        assert [int(s["cls"]) for s in loader] == first == [0, 1, 2, 3]
    finally:
        loader.shutdown()


def test_a_tenbin_stream_cut_short_is_an_error_naming_the_chunk():
    whole = bytes(tenbin.encode_buffer([np.zeros(3)]))
    with pytest.raises(ValueError, match="the chunk at byte 80 says 24 bytes; the stream has 4"):
        tenbin.read(io.BytesIO(whole[:100]))
    with pytest.raises(ValueError, match="ends inside the chunk header at byte 0"):
        tenbin.read(io.BytesIO(whole[:10]))
