"""formats/ owns each format once, storage/ is the one way in and out (issue 24 items 1 and 2).

Each format (compression, decoders, TFRecord, hashes, tar writing) has one implementation;
these tests check that every front end that reads it gets the same answer from it.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats import compression, decoders, hashes, tfrecord
from shardpipes.formats.tarparse import iter_tar
from shardpipes.storage.open import open_text, open_url
from shardpipes.storage.source import ReadOptions, resolve
from shardpipes.storage.write import write_atomic
from shardpipes.webdataset import autodecode, utils
from shardpipes.webdataset.wids import default_decoder as wids_decoder
from shardpipes.webdataset.writer import ShardWriter as WdsShardWriter
from shardpipes.webdataset.writer import TarWriter as WdsTarWriter
from shardpipes.writer import ShardWriter

COMPRESS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}


# --- compression ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_one_table_knows_each_codec_by_magic_and_by_suffix(codec):
    data = COMPRESS[codec](b"payload" * 100)
    assert compression.by_magic(data[: compression.MAGIC_LENGTH]) == codec
    for suffix in compression.CODECS[codec].suffixes:
        assert compression.by_suffix(f"s3://b/train-0.tar{suffix.upper()}") == codec
    assert compression.decompress_stream(codec, io.BytesIO(data)).read() == b"payload" * 100


def test_uncompressed_and_unknown_are_none():
    assert compression.by_magic(b"ustar\0") is None
    assert compression.by_suffix("train.tar") is None and compression.by_suffix("noext") is None
    with pytest.raises(ValueError, match="'zstd' is not known; must be one of"):
        compression.decompress_stream("zstd", io.BytesIO(b""))


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_tar_reader_webdataset_and_td09_decompress_alike(tmp_path, codec):
    """The tar reader (by magic), webdataset (by suffix) and 0.9's decompress read one shard."""
    from shardpipes.webdataset import WebDataset

    plain = tmp_path / "plain.tar"
    with ShardWriter(os.fspath(tmp_path / "plain-%d.tar")) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", ".txt": f"text {i}"})
    os.replace(tmp_path / "plain-0.tar", plain)
    suffix = compression.CODECS[codec].suffixes[0]
    packed = tmp_path / f"shard.tar{suffix}"
    packed.write_bytes(COMPRESS[codec](plain.read_bytes()))

    with open(packed, "rb") as f:
        by_magic = [(e.name, bytes(e.data)) for e in iter_tar(f, str(packed))]
    assert by_magic == [(f"k{i}.txt", f"text {i}".encode()) for i in range(3)]
    wds = [(s["__key__"], s["txt"]) for s in WebDataset(str(packed), shardshuffle=False)]
    assert wds == [(f"k{i}", f"text {i}".encode()) for i in range(3)]
    file_type = {"gzip": "gzip", "bzip2": "bz2", "xz": "lzma"}[codec]
    with open(packed, "rb") as f:
        [(_, stream)] = list(
            IterableWrapper([(str(packed), f)], deepcopy=False).decompress(file_type)
        )
        assert stream.read() == plain.read_bytes()


# --- decoders ---------------------------------------------------------------------------------


def _npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


FIELDS = {
    ".cls": b"7",
    ".txt": "héllo".encode(),
    ".json": b'{"a": [1, 2]}',
    ".npy": _npy(np.arange(6, dtype=np.int16).reshape(2, 3)),
}


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_decode_webdataset_and_wids_give_the_registry_values():
    sample = {"__key__": "k", "__url__": "u", **FIELDS}
    (ours,) = IterableWrapper([sample]).decode(image=None)
    wds = autodecode.default_decoder(
        {k.lstrip(".") if k[0] == "." else k: v for k, v in sample.items()}
    )
    wids = wids_decoder({k: io.BytesIO(v) if k[0] == "." else v for k, v in sample.items()})
    table = decoders.decoders()
    for field, raw in FIELDS.items():
        expected = decoders.lookup(table, field)(raw)
        assert _same(ours[field], expected), field
        assert _same(wds[field[1:]], expected), field
        assert _same(wids[field], expected), field


def test_pickles_only_with_the_switch():
    blob = pickle.dumps({"x": 1})
    assert "pickle" not in decoders.decoders() and "pkl" not in decoders.decoders()
    assert decoders.decoders(allow_pickle=True)["pickle"](blob) == {"x": 1}
    sample = {"__key__": "k", "__url__": "u", ".pickle": blob}
    assert next(iter(IterableWrapper([sample]).decode()))[".pickle"] == blob  # stays bytes
    assert next(iter(IterableWrapper([sample]).decode(allow_pickle=True)))[".pickle"] == {"x": 1}


class Opaque:
    """Not a tensor nor a plain container: ``weights_only`` refuses it."""


def test_torch_files_load_weights_only_unless_pickles_are_allowed():
    buf = io.BytesIO()
    torch.save({"t": torch.arange(3)}, buf)
    tensors = buf.getvalue()
    assert torch.equal(decoders.DECODERS["pt"](tensors)["t"], torch.arange(3))
    buf = io.BytesIO()
    torch.save(Opaque(), buf)
    with pytest.raises(pickle.UnpicklingError):
        decoders.DECODERS["pth"](buf.getvalue())
    assert type(decoders.PICKLE_DECODERS["pth"](buf.getvalue())) is Opaque


def test_webdataset_unpickles_only_when_security_is_off(monkeypatch):
    blob = pickle.dumps([1, 2])
    monkeypatch.setattr(utils, "enforce_security", True)
    with pytest.raises(ValueError, match="enforce_security"):
        autodecode.decoders["pyd"](blob)
    monkeypatch.setattr(utils, "enforce_security", False)
    assert autodecode.decoders["pyd"](blob) == [1, 2]


# --- TFRecord -----------------------------------------------------------------------------------


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, body):
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _entry(key, feature):
    return _field(1, _field(1, key.encode()) + _field(2, feature))


def _record(data):
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4


def test_tfrecord_example_and_sequence_example():
    floats = _field(2, _field(1, struct.pack("<2f", 0.5, -2.0)))  # FloatList, packed
    ints = _field(3, _field(1, _varint(5) + _varint((1 << 64) - 3)))  # Int64List: 5, -3
    strings = _field(1, _field(1, b"ab") + _field(1, b""))  # BytesList
    example = _field(1, _entry("f", floats) + _entry("i", ints) + _entry("s", strings))
    seq = _field(1, _entry("c", ints)) + _field(2, _entry("l", _field(1, floats) * 2))
    stream = io.BytesIO(_record(example) + _record(seq))
    (ctx, lists), (ctx2, lists2) = [tfrecord.parse_record(r) for r in tfrecord.iter_records(stream)]
    assert ctx["f"].dtype == np.float32 and ctx["f"].tolist() == [0.5, -2.0]
    assert ctx["i"].dtype == np.int64 and ctx["i"].tolist() == [5, -3]
    assert ctx["s"] == [b"ab", b""] and lists == {}
    assert ctx2["c"].tolist() == [5, -3]
    assert [v.tolist() for v in lists2["l"]] == [[0.5, -2.0], [0.5, -2.0]]


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"\x05\0\0\0", "record size"),
        (struct.pack("<Q", 4) + b"\0" * 4 + b"ab", "failed to read the record"),
        (struct.pack("<Q", 2) + b"\0" * 4 + b"ab", "end token"),
    ],
)
def test_tfrecord_truncation_is_named(blob, match):
    with pytest.raises(RuntimeError, match=match):
        list(tfrecord.iter_records(io.BytesIO(blob)))


# --- hashes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("hash_type", hashes.HASH_TYPES)
def test_one_digest_for_text_bytes_streams_and_files(tmp_path, hash_type):
    data = b"line 1\nline 2\n" * 1000
    want = hashlib.new(hash_type, data).hexdigest()
    path = tmp_path / "f"
    path.write_bytes(data)
    assert hashes.digest_of(data, hash_type) == want
    assert hashes.digest_of(data.decode(), hash_type) == want
    assert hashes.digest_of(io.BytesIO(data), hash_type) == want
    assert hashes.file_digest(os.fspath(path), hash_type) == want
    ok = {str(path): want}
    with open(path, "rb") as f:
        [(_, checked)] = list(
            IterableWrapper([(str(path), f)], deepcopy=False).check_hash(ok, hash_type)
        )
        assert checked.read() == data  # rewound after hashing
    with pytest.raises(ValueError, match="should be one of \\['sha256', 'md5'\\]"):
        hashes.digest_of(data, "sha1")


# --- writing ------------------------------------------------------------------------------------


def test_both_shard_writers_write_the_same_members(tmp_path):
    samples = [{"__key__": f"s{i:03d}", "cls": str(i), "txt": f"t{i}"} for i in range(5)]
    with ShardWriter(os.fspath(tmp_path / "a-%d.tar"), maxcount=2) as ours:
        for s in samples:
            ours.write(s)
    with WdsShardWriter(os.fspath(tmp_path / "b-%d.tar"), maxcount=2, verbose=0) as wds:
        for s in samples:
            wds.write(dict(s))

    def members(path):
        with open(path, "rb") as f:
            return [(e.name, bytes(e.data)) for e in iter_tar(f, os.fspath(path))]

    for i in range(3):
        assert members(tmp_path / f"a-{i}.tar") == members(tmp_path / f"b-{i}.tar")
    assert not list(tmp_path.glob("*.partial"))


def test_webdataset_shard_writer_compresses_a_local_tar_gz_and_renames_it(tmp_path):
    pattern = os.fspath(tmp_path / "s-%d.tar.gz")
    w = WdsShardWriter(pattern, verbose=0)
    w.write({"__key__": "a", "txt": "hello"})
    assert (tmp_path / "s-0.tar.gz.partial").exists() and not (tmp_path / "s-0.tar.gz").exists()
    w.close()
    raw = (tmp_path / "s-0.tar.gz").read_bytes()
    assert compression.by_magic(raw) == "gzip"
    with open(tmp_path / "s-0.tar.gz", "rb") as f:
        assert [(e.name, bytes(e.data)) for e in iter_tar(f, "s-0")] == [("a.txt", b"hello")]


def test_write_atomic_discards_a_failed_local_file_and_writes_remote_ones_directly(tmp_path):
    dest = os.fspath(tmp_path / "sub" / "x.bin")
    with pytest.raises(RuntimeError, match="boom"), write_atomic(dest) as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "sub") == []
    with write_atomic("memory://core24/d/x.json.gz", mode="wt", compression="gzip") as f:
        f.write(json.dumps({"a": 1}))
    with open_url("memory://core24/d/x.json.gz") as f:
        assert json.loads(gzip.decompress(f.read())) == {"a": 1}
    with open_text("memory://core24/d/x.json.gz", compression="gzip") as f:
        assert json.load(f) == {"a": 1}


# --- storage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "local", "streamed"),
    [
        ("/tmp/x.tar", True, False),
        ("file:///tmp/x.tar", True, False),
        ("memory://b/x.tar", False, False),
        ("simplecache::memory://b/x.tar", False, False),
        ("https://example.invalid/x.tar", False, True),
    ],
)
def test_one_local_test(url, local, streamed):
    source = resolve(url)
    assert (source.local, source.streamed) == (local, streamed)


def test_a_resolved_source_shows_no_secret():
    source = resolve("https://user:pw-1@example.invalid/x.tar", {"headers": {"X-Token": "tk-2"}})
    shown = f"{source!r} {source}"
    assert "pw-1" not in shown and "tk-2" not in shown
    assert "example.invalid/x.tar" in shown
    assert source != resolve(source.url)  # compared by identity, as before it was a dataclass


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_size": 0}, "block_size should be a positive integer"),
        ({"readahead": 65}, "readahead should be an integer in \\[0, 64\\]"),
        ({"retries": -1}, "retries should be a non-negative integer"),
        ({"timeout": 0}, "timeout should be a positive number"),
    ],
)
def test_read_options_are_checked_once_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReadOptions(**kwargs)
    assert ReadOptions(retries=2, backoff=0.1).retry.retries == 2


def test_opener_keeps_its_read_options_as_one_value(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    dp = IterableWrapper([os.fspath(path)]).open_files_by_fsspec(
        mode="rb", readahead=0, retries=1, timeout=5
    )
    assert dp.options == ReadOptions(readahead=0, retries=1, timeout=5)
    assert [s.read() for _, s in dp] == [b"abc"]


def test_shard_writer_members_are_plain_ustar_sized(tmp_path):
    """No per-member pax header: a sample of three small fields takes three 1024-byte members."""
    with ShardWriter(os.fspath(tmp_path / "s-%d.tar")) as w:
        w.write({"__key__": "a", ".cls": 1, ".txt": "x", ".json": {"a": 1}})
    with open(tmp_path / "s-0.tar", "rb") as f:
        entries = list(iter_tar(f, "s-0"))
    assert [e.offset for e in entries] == [0, 1024, 2048]


def test_samples_read_by_webdataset_are_written_again_as_they_are(tmp_path):
    # A member read by webdataset() is a file (StreamBytes); the writer takes its bytes.
    with ShardWriter(os.fspath(tmp_path / "src-%d.tar")) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", ".bin": bytes([i]) * 5, ".cls": i})
    read = list(
        IterableWrapper([os.fspath(tmp_path / "src-0.tar")])
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
    )
    with ShardWriter(os.fspath(tmp_path / "copy-%d.tar")) as w:
        for sample in read:
            w.write({k: v for k, v in sample.items() if k != "__url__"})
    with open(tmp_path / "src-0.tar", "rb") as a, open(tmp_path / "copy-0.tar", "rb") as b:
        names_a = [e.name for e in iter_tar(a, "a")]
        names_b = [e.name for e in iter_tar(b, "b")]
    assert names_a == names_b == [f"k{i}{x}" for i in range(3) for x in (".bin", ".cls")]
    copied = list(
        IterableWrapper([os.fspath(tmp_path / "copy-0.tar")])
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
    )
    assert [bytes(s[".bin"]) for s in copied] == [bytes([i]) * 5 for i in range(3)]
    assert [bytes(s[".cls"]) for s in copied] == [b"0", b"1", b"2"]
    # webdataset's TarWriter (dot-less field names) takes them as bytes too.
    with WdsTarWriter(os.fspath(tmp_path / "wds.tar")) as w:
        for sample in read:
            w.write({"__key__": sample["__key__"], "bin": sample[".bin"]})
    with open(tmp_path / "wds.tar", "rb") as f:
        assert [bytes(e.data) for e in iter_tar(f, "wds")] == [bytes([i]) * 5 for i in range(3)]
