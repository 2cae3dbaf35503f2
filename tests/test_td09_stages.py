"""torchdata 0.9 compatibility stages: the behaviours 0.9 code relies on."""

from __future__ import annotations

import bz2
import io
import lzma
import struct
import zipfile

import pytest
import torch

from shardpipes.datapipes import DataChunk, functional_datapipe  # noqa: F401 - 0.9's import line
from shardpipes.datapipes.iter import (
    AISFileLister,
    DataFrameMaker,
    HuggingFaceHubReader,
    IterableWrapper,
    IterKeyZipper,
    RarArchiveLoader,
    SampleMultiplexer,
    TFRecordLoader,
)
from shardpipes.datapipes.map import SequenceWrapper
from shardpipes.datapipes.utils import StreamWrapper, janitor, pin_memory_fn


def key(x):
    return x


def double_list(x):
    return [x, 2 * x]


def test_iter_key_zipper_pairs_out_of_order_references():
    dp = IterKeyZipper(IterableWrapper([3, 1, 2]), IterableWrapper([1, 2, 3]), key, keep_key=True)
    assert list(dp) == [(3, (3, 3)), (1, (1, 1)), (2, (2, 2))]


def test_iter_key_zipper_missing_key_names_the_item():
    dp = IterableWrapper([5]).zip_with_iter(IterableWrapper([1]), key)
    with pytest.raises(BufferError, match="No matching key can be found .* data 5"):
        list(dp)


def test_zip_with_map_bad_key_is_a_key_error():
    dp = IterableWrapper([0, 7]).zip_with_map(SequenceWrapper(["a"]), key)
    it = iter(dp)
    assert next(it) == (0, "a")
    with pytest.raises(KeyError, match="maps 7 to 7"):
        next(it)


def test_unzip_and_round_robin_demux_split_exactly():
    a, b = IterableWrapper([(i, -i) for i in range(5)]).unzip(2)
    assert (list(a), list(b)) == ([0, 1, 2, 3, 4], [0, -1, -2, -3, -4])
    x, y = IterableWrapper(range(5)).round_robin_demux(2)
    assert (list(x), list(y), len(x), len(y)) == ([0, 2, 4], [1, 3], 3, 2)


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed0", "seed1", "seed2"])
def test_random_split_is_a_partition_and_deterministic(seed):
    train, valid = IterableWrapper(range(20)).random_split({"t": 15, "v": 5}, seed=seed)
    t, v = list(train), list(valid)
    assert sorted(t + v) == list(range(20)) and (len(t), len(v)) == (15, 5)
    assert (list(train), list(valid)) == (t, v)


def test_shuffled_flatmap_is_a_permutation_fixed_by_the_seed():
    dp = IterableWrapper(range(10)).shuffled_flatmap(double_list, buffer_size=4).set_seed(3)
    first = list(dp)
    assert sorted(first) == sorted(x for i in range(10) for x in (i, 2 * i))
    assert list(dp.set_seed(3)) == first
    assert list(dp.set_seed(4)) != first


def test_sample_multiplexer_yields_everything_once():
    dp = SampleMultiplexer({IterableWrapper([0] * 5): 0.5, IterableWrapper([1] * 7): 0.5}, seed=1)
    out = list(dp)
    assert (out.count(0), out.count(1), len(dp)) == (5, 7, 12)


def test_csv_lines_json_and_paragraphs():
    files = IterableWrapper([("f", io.StringIO("a,1\nb,2\n"))])
    assert list(files.parse_csv(as_tuple=True)) == [("a", "1"), ("b", "2")]
    lines = IterableWrapper([("g", io.BytesIO(b"x\r\n\r\ny\nz"))]).readlines(decode=True)
    assert list(lines.lines_to_paragraphs()) == [("g", "x"), ("g", "y\nz")]
    assert list(IterableWrapper([("j", io.StringIO('{"k": [1]}'))]).parse_json_files()) == [
        ("j", {"k": [1]})
    ]


def test_check_hash_rejects_a_wrong_digest_naming_the_file():
    with pytest.raises(RuntimeError, match="of a.bin does not match"):
        list(IterableWrapper([("a.bin", b"data")]).check_hash({"a.bin": "0" * 64}))


def test_zip_xz_bz2_yield_readable_streams(tmp_path):
    zpath = tmp_path / "d.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        z.writestr("in/m.txt", b"zip!")
    (tmp_path / "x.txt.xz").write_bytes(lzma.compress(b"xz!"))
    (tmp_path / "y.txt.bz2").write_bytes(bz2.compress(b"bz!"))
    opened = IterableWrapper([str(zpath)]).open_files(mode="b")
    assert [(p.endswith("d.zip/in/m.txt"), s.read()) for p, s in opened.load_from_zip()] == [
        (True, b"zip!")
    ]
    xz = IterableWrapper([str(tmp_path / "x.txt.xz")]).open_files(mode="b").load_from_xz()
    assert [(p.endswith("x.txt"), s.read()) for p, s in xz] == [(True, b"xz!")]
    bz = IterableWrapper([str(tmp_path / "y.txt.bz2")]).open_files(mode="b").decompress()
    assert [s.read() for _, s in bz] == [b"bz!"]


def _record(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4


def _field(number: int, body: bytes) -> bytes:
    return bytes([(number << 3) | 2, len(body)]) + body


def test_tfrecord_reads_an_example_without_protobuf():
    ints = _field(3, _field(1, bytes([1, 2, 3])))  # Int64List, packed
    raw = _field(1, _field(1, b"ab"))  # BytesList
    features = _field(1, _field(1, b"n") + _field(2, ints)) + _field(
        1, _field(1, b"s") + _field(2, raw)
    )
    stream = io.BytesIO(_record(_field(1, features)))
    (example,) = TFRecordLoader(IterableWrapper([("r.tfrecord", stream)]))
    assert torch.equal(example["n"], torch.tensor([1, 2, 3])) and example["s"] == [b"ab"]
    truncated = io.BytesIO(_record(b"")[:10])
    with (
        pytest.warns(UserWarning, match="r.tfrecord"),
        pytest.raises(RuntimeError, match="start token"),
    ):
        list(TFRecordLoader(IterableWrapper([("r.tfrecord", truncated)])))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: AISFileLister(IterableWrapper([]), url="http://ais"), "S3-compatible"),
        (lambda: HuggingFaceHubReader("squad"), "load_dataset"),
        (lambda: DataFrameMaker(IterableWrapper([])), "torcharrow"),
    ],
    ids=["ais", "huggingface", "dataframe"],
)
def test_unavailable_readers_fail_at_construction_with_the_alternative(build, match):
    with pytest.raises(ModuleNotFoundError, match=match):
        build()


def test_rar_names_the_alternative():
    with pytest.raises(NotImplementedError, match="load_from_zip"):
        RarArchiveLoader(IterableWrapper([]))


def test_utils_janitor_and_pin_memory_fn():
    stream = StreamWrapper(io.BytesIO(b"x"))
    janitor({"a": [stream]})
    assert stream.closed
    assert pin_memory_fn(("s", b"b", 3)) == ("s", b"b", 3)


def test_map_side_names():
    m = IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()
    assert (m["b"], len(m)) == (2, 2)
    first, second = SequenceWrapper([(1, 2), (3, 4)]).unzip(2)
    assert (list(first.to_iter_datapipe()), second[1]) == ([1, 3], 4)
    assert SequenceWrapper([5, 6]).in_memory_cache()[0] == 5


class _Maker:
    """Counts how many items the traced (expensive) stage really produced."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, name: str) -> tuple[str, str]:
        self.calls += 1
        return name, f"content {name}"


def _in(folder, name):
    return f"{folder}/{name}"


def test_on_disk_cache_end_caching_runs_the_traced_stage_once_per_item(tmp_path):
    import functools

    where = functools.partial(_in, str(tmp_path))
    maker = _Maker()

    def graph(names):
        cache = IterableWrapper(names).on_disk_cache(filepath_fn=where)
        return cache.map(maker).end_caching(mode="w", filepath_fn=where, skip_read=True)

    assert list(graph(["a", "b"])) == [where("a"), where("b")]
    assert sorted(list(graph(["a", "b", "c"]))) == [where("a"), where("b"), where("c")]
    assert maker.calls == 3  # a and b were read from disk the second time
    assert (tmp_path / "c").read_text() == "content c"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no promise left behind


def test_on_disk_cache_keeps_the_shardpipes_form(tmp_path):
    from shardpipes.datapipes.iter import OnDiskCacheHolder

    assert type(IterableWrapper([]).on_disk_cache(str(tmp_path))) is OnDiskCacheHolder
    with pytest.raises(RuntimeError, match="end_caching"):
        list(IterableWrapper(["x"]).on_disk_cache(filepath_fn=str))


def test_end_caching_without_a_holder_is_an_error():
    with pytest.raises(RuntimeError, match="Expected `OnDiskCacheHolder`"):
        IterableWrapper([("a", b"x")]).end_caching()


def test_webdataset_groups_plain_pairs_as_09_did():
    # 0.9 grouped (path, value) pairs of any kind: values kept as they are, no __url__, and a
    # path without an extension (metadata) left out: here counted and warned about.
    pairs = [
        ("/p/file1.jpg", b"1"),
        ("/p/_something_", b"nothing"),
        ("/p/file1.cls", "two"),
        ("/p/file2.jpg", b"3"),
        ("/p/file2.cls", 4),
    ]
    dp = IterableWrapper(pairs).webdataset()
    with pytest.warns(UserWarning, match="'/p/_something_' has no extension"):
        out = list(dp)
    assert out == [
        {"__key__": "/p/file1", ".jpg": b"1", ".cls": "two"},
        {"__key__": "/p/file2", ".jpg": b"3", ".cls": 4},
    ]
    assert dp.skipped.samples == 1


def test_load_from_tar_reads_a_tarfile_from_decompress(tmp_path):
    # 0.9's decompress() turns a .tar.gz into an opened tarfile.TarFile; load_from_tar reads it.
    import tarfile

    path = tmp_path / "x.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("a.txt", b"alpha"), ("b.bin", b"\x00\x01")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dp = IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").decompress().load_from_tar()
    got = [(p.rsplit("/", 1)[1], bytes(v)) for p, v in dp]
    assert got == [("a.txt", b"alpha"), ("b.bin", b"\x00\x01")]


def _same(x):
    return x


_WHILE_CACHING = {}


def _fetch_while_another_copy_waits(path):
    other = _WHILE_CACHING["other"]
    with pytest.raises(TimeoutError, match="OnDiskCache Exception: .*f.bin .*0.2 seconds"):
        list(other)
    _WHILE_CACHING["seen"] = path
    return path, b"data"


def test_cache_timeout_bounds_the_wait_for_a_file_another_reader_promised(tmp_path):
    # While this graph holds the promise to write the file (inside its map), a copy of it (as
    # a worker process has) with CacheTimeout(0.2) waits for that file and gives up with 0.9's error.
    import copy

    from shardpipes.dataloader2.adapter import CacheTimeout

    target = str(tmp_path / "f.bin")
    graph = (
        IterableWrapper([target])
        .on_disk_cache(filepath_fn=_same)
        .map(_fetch_while_another_copy_waits)
        .end_caching(mode="wb", filepath_fn=_same, skip_read=True)
    )
    _WHILE_CACHING.clear()
    _WHILE_CACHING["other"] = CacheTimeout(0.2)(copy.deepcopy(graph))
    assert list(graph) == [target]
    assert _WHILE_CACHING["seen"] == target
    assert (tmp_path / "f.bin").read_bytes() == b"data"
