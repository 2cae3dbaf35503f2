"""Values read like torchdata 0.9's streams and still are bytes; compressed tars; 0.9 stage arguments (issue 16)."""

import io
import pathlib
import pickle
import tarfile

import pytest

from shardpipes.datapipes.iter import IterableWrapper

PIL = pytest.importorskip("PIL.Image")


def _jpeg(i):
    out = io.BytesIO()
    PIL.new("RGB", (8, 8), (i * 40 % 256, 0, 0)).save(out, format="JPEG")
    return out.getvalue()


def _write(path, samples, mode="w"):
    with tarfile.open(path, mode) as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def _samples(n, start=0):
    return [
        (f"{i:04d}", {".jpg": _jpeg(i), ".txt": f"caption {i}\nsecond line".encode()})
        for i in range(start, start + n)
    ]


def _decode_sd(sample):
    # The shape of a Stable Diffusion data loader written for torchdata 0.9: decode inside
    # try/except, drop what fails.
    try:
        image = PIL.open(io.BytesIO(sample[".jpg"].read())).convert("RGB")
        caption = sample[".txt"].read().decode("utf-8")
    except Exception:
        return None
    return image.size, caption


def test_a_stable_diffusion_style_09_loader_yields_its_samples(tmp_path):
    _write(tmp_path / "a.tar", _samples(3))
    _write(tmp_path / "b.tar", _samples(2, 3))
    dp = (
        IterableWrapper([str(tmp_path)])
        .list_files_by_fsspec(masks="*.tar", anon=False)
        .open_files_by_fsspec(mode="rb", kwargs_for_open={}, anon=False)
        .load_from_tar()
        .webdataset()
        .map(_decode_sd)
        .filter(lambda x: x is not None)
    )
    out = list(dp)
    assert [caption for _, caption in out] == [f"caption {i}\nsecond line" for i in range(5)]
    assert all(size == (8, 8) for size, _ in out)


def test_values_are_bytes_and_streams(tmp_path):
    path = _write(tmp_path / "a.tar", _samples(1))
    [sample] = IterableWrapper([path]).open_files_by_fsspec().load_from_tar().webdataset()
    txt = sample[".txt"]
    # A file, not a bytes (libraries take a bytes for a file name), that answers like bytes
    assert isinstance(txt, io.BufferedIOBase) and not isinstance(txt, bytes)
    assert txt == b"caption 0\nsecond line" and len(txt) == 21 and txt[:7] == b"caption"
    assert {txt: 1}[b"caption 0\nsecond line"] == 1 and txt.decode().startswith("caption")
    assert pickle.loads(pickle.dumps(txt)) == txt
    assert list(txt) == [b"caption 0\n", b"second line"]  # iterating reads lines, as a stream
    assert txt.read() == b""  # ... and moved the position to the end
    txt.seek(0)
    assert txt.read(7) == b"caption" and txt.file_obj is txt
    txt.close()
    assert bytes(txt) == b"caption 0\nsecond line"  # closing keeps the bytes


def test_load_from_tar_members_are_streams_and_bytes(tmp_path):
    path = _write(tmp_path / "a.tar", _samples(2))
    dp = IterableWrapper([path]).open_files_by_fsspec().load_from_tar(mode="r", length=4)
    assert len(dp) == 4
    pairs = list(dp)
    assert [p.rsplit("/", 1)[1] for p, _ in pairs] == [
        "0000.jpg",
        "0000.txt",
        "0001.jpg",
        "0001.txt",
    ]
    _, member = pairs[1]
    assert member == b"caption 0\nsecond line" and member.readline() == b"caption 0\n"
    assert member.name == "0000.txt" and member.url == path


def test_open_files_by_fsspec_yields_stream_wrappers(tmp_path):
    from torch.utils.data.datapipes.utils.common import StreamWrapper

    (tmp_path / "x.bin").write_bytes(b"abc")
    [(url, stream)] = IterableWrapper([str(tmp_path / "x.bin")]).open_files_by_fsspec(mode="rb")
    assert isinstance(stream, StreamWrapper) and stream.file_obj is not None
    assert stream.read() == b"abc"
    stream.close()


@pytest.mark.parametrize(
    ("suffix", "mode"),
    [(".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")],
    ids=["tar.gz", "tgz", "tar.bz2", "tar.xz"],
)
def test_compressed_tars_stream_through_load_from_tar(tmp_path, suffix, mode):
    samples = _samples(3)
    plain = _write(tmp_path / "p.tar", samples)
    packed = _write(tmp_path / f"c{suffix}", samples, mode)

    def read(path):
        dp = IterableWrapper([path]).open_files_by_fsspec().load_from_tar().webdataset()
        return [{k: v for k, v in s.items() if k != "__url__"} for s in dp]

    assert read(packed) == read(plain) and len(read(packed)) == 3


def _members(dp):
    return [(url.rsplit("/", 1)[1], bytes(value)) for url, value in dp]


def test_the_text_default_reads_tars_as_bytes_locally(tmp_path):
    # 0.9's open_files_by_fsspec opened in text mode by default; a tar pipeline written without
    # mode="rb" reads the same bytes, through the mapped-file path (the stream's binary file).
    from shardpipes.formats.stream import binary_stream

    path = _write(tmp_path / "a.tar", _samples(3))
    text = list(IterableWrapper([path]).open_files_by_fsspec().load_from_tar())
    binary = list(IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_tar())
    assert _members(text) == _members(binary) and len(text) == 6
    [(_, stream)] = list(IterableWrapper([path]).open_files_by_fsspec())
    with stream:
        assert isinstance(stream.file_obj, io.TextIOBase)
        assert binary_stream(stream).read(5) == pathlib.Path(path).read_bytes()[:5]


def test_the_text_default_reads_remote_tars_as_bytes(s3, tmp_path):
    data = {
        f"{n}.tar": pathlib.Path(_write(tmp_path / f"{n}.tar", _samples(2, 2 * n))).read_bytes()
        for n in range(3)
    }
    urls = s3.put("text-default", data)
    opts = s3.options()
    text = list(IterableWrapper(urls).open_files_by_fsspec(storage_options=opts).load_from_tar())
    binary = list(
        IterableWrapper(urls).open_files_by_fsspec(mode="rb", storage_options=opts).load_from_tar()
    )
    assert _members(text) == _members(binary) and len(text) == 12


def test_a_text_stream_without_a_buffer_is_refused_by_name(tmp_path):
    dp = IterableWrapper([("x.tar", io.StringIO("not bytes"))]).load_from_tar()
    with pytest.raises(TypeError, match="mode='rb'"):
        list(dp)


def test_a_text_stream_already_read_from_is_refused_not_cut(tmp_path):
    path = _write(tmp_path / "a.tar", [(f"{i}", {".txt": b"text"}) for i in range(3)])
    [(url, stream)] = list(IterableWrapper([path]).open_files_by_fsspec())
    stream.read(1)  # the text layer now holds bytes the binary buffer has passed
    with pytest.raises(ValueError, match=r"already read from .*mode='rb'"):
        list(IterableWrapper([(url, stream)]).load_from_tar())
