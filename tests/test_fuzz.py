"""Fuzzing: random and mutated tar bytes through the tar reader, webdataset grouping and decode.

Only the package's documented exceptions may escape (ShardpipesError subclasses), nothing may
hang, and memory stays bounded by the input. Inputs that once failed live in tests/fuzz_corpus/
and are replayed here. ``python tests/fuzz_tar.py`` runs the same check under atheris.
"""

from __future__ import annotations

import io
import pathlib
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _hyp import budget
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import ShardpipesError
from shardpipes.formats.tarparse import iter_tar

CORPUS = pathlib.Path(__file__).parent / "fuzz_corpus"


class _Stream(io.BytesIO):
    url = "mem://fuzz.tar"


def run_chain(data: bytes) -> int:
    """Parse, group and decode ``data``; return the number of samples (or raise)."""
    dp = (
        IterableWrapper([("mem://fuzz.tar", io.BytesIO(data))])
        .load_from_tar(chunk_size=4096)
        .webdataset()
        .decode(image=None)
    )
    return sum(1 for _ in dp)


def check(data: bytes) -> None:
    try:
        run_chain(data)
    except ShardpipesError:
        pass
    try:
        for _ in iter_tar(io.BytesIO(data), "mem://fuzz.tar", require_end=False):
            pass
    except ShardpipesError:
        pass


names = st.one_of(
    st.sampled_from(
        ["a.cls", "a.json", "a.txt", "b.cls", "b.npy", "noext", "a.cls", "d/e.f.json", ".hidden"]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=120),
)
payloads = st.one_of(
    st.binary(max_size=2000),
    st.sampled_from([b"12", b"{}", b'{"a": [1, 2]}', b"\x93NUMPY", b"x" * 700]),
)
formats = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def build(members, fmt) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            try:
                t.addfile(info, io.BytesIO(data))
            except ValueError:  # a name this format cannot hold
                continue
    return buf.getvalue()


@settings(max_examples=budget(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, payloads), max_size=8), formats, st.data())
def test_mutated_tars_raise_only_our_errors(members, fmt, data):
    raw = bytearray(build(members, fmt))
    action = data.draw(st.sampled_from(["none", "flip", "truncate", "splice", "size"]))
    if raw and action == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "truncate":
        del raw[data.draw(st.integers(0, len(raw))) :]
    elif action == "splice":
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(max_size=600))
    elif raw and action == "size":  # a size field that claims far more than the file holds
        block = data.draw(st.integers(0, max(len(raw) // 512 - 1, 0))) * 512
        raw[block + 124 : block + 136] = data.draw(
            st.sampled_from([b"77777777777\0", b"\x80" + b"\xff" * 11])
        )
    check(bytes(raw))


@settings(max_examples=budget(100), deadline=None)
@given(st.binary(max_size=3000))
def test_random_bytes_raise_only_our_errors(raw):
    check(raw)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.tar")), ids=lambda p: p.name)
def test_corpus_inputs_that_once_failed(path):
    check(path.read_bytes())


@pytest.mark.slow
def test_atheris_finds_nothing(tmp_path):
    atheris = pytest.importorskip("atheris", reason="atheris does not install on this platform")
    del atheris
    import shutil
    import subprocess
    import sys

    harness = pathlib.Path(__file__).parent / "fuzz_tar.py"
    corpus = tmp_path / "corpus"  # libFuzzer adds new inputs to its corpus: work on a copy
    shutil.copytree(CORPUS, corpus)
    proc = subprocess.run(
        [
            sys.executable,
            str(harness),
            "-runs=30000",
            "-max_len=4096",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("crash-*"))
