"""webdataset's ``pipe:`` URLs: the common commands are read by our reader; others only when allowed."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

import shardpipes.webdataset as wds
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import ShardReadError
from shardpipes.storage.pipeurl import ENV_ALLOW, parse_pipe_url


@pytest.mark.parametrize(
    ("url", "reads", "options"),
    [
        ("pipe:aws s3 cp s3://b/train-000.tar -", "s3://b/train-000.tar", {}),
        ("pipe:aws s3 cp --quiet s3://b/x.tar -", "s3://b/x.tar", {}),
        (
            "pipe:aws --endpoint-url http://127.0.0.1:9000 s3 cp s3://b/x.tar -",
            "s3://b/x.tar",
            {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}},
        ),
        ("pipe:aws s3 cp --no-sign-request s3://b/x.tar -", "s3://b/x.tar", {"anon": True}),
        ("pipe:gsutil cat gs://b/x.tar", "gs://b/x.tar", {}),
        ("pipe:gsutil -q cat gs://b/x.tar", "gs://b/x.tar", {}),
        ("pipe:gcloud storage cat gs://b/x.tar", "gs://b/x.tar", {}),
        ("pipe:curl -s -L https://h/x.tar", "https://h/x.tar", {}),
        ("pipe:curl --retry 3 -fsSL 'https://h/a b.tar'", "https://h/a b.tar", {}),
        ("pipe:cat /data/x.tar", "/data/x.tar", {}),
    ],
)
def test_the_common_commands_are_parsed_into_the_url_they_read(url, reads, options):
    parsed = parse_pipe_url(url)
    assert parsed is not None and parsed.command is None
    assert (parsed.url, parsed.storage_options) == (reads, options)


@pytest.mark.parametrize(
    "url",
    [
        "pipe:curl -s https://h/x.tar | tar -x",  # a shell pipeline
        "pipe:curl -H 'Authorization: x' https://h/x.tar",  # an option that changes the request
        "pipe:aws s3 cp s3://b/x.tar /tmp/x.tar",  # to a file, not to standard output
        "pipe:sh -c 'cat x'",
        "pipe:cat a b",
    ],
)
def test_other_commands_are_not_taken_for_a_url(url):
    assert parse_pipe_url(url) is None


def _tar(path: str, n: int, start: int = 0) -> str:
    with tarfile.open(path, "w") as tar:
        for i in range(start, start + n):
            for ext, data in (("txt", f"sample {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _keys(dataset) -> list[str]:
    return [s["__key__"] for s in dataset]


def test_pipe_cat_reads_without_a_subprocess(tmp_path, monkeypatch):
    a = _tar(str(tmp_path / "a-0.tar"), 3)
    _tar(str(tmp_path / "a-1.tar"), 2, start=3)
    monkeypatch.setenv("PATH", "")  # no program can be found: a subprocess would fail
    ds = wds.WebDataset(f"pipe:cat {tmp_path}/a-{{0..1}}.tar", shardshuffle=False)
    samples = list(ds)
    assert _keys(samples) == ["0000", "0001", "0002", "0003", "0004"]
    assert samples[0]["__url__"] == f"pipe:cat {a}" and samples[0]["txt"] == b"sample 0"


@pytest.mark.s3
def test_pipe_aws_s3_cp_reads_through_s3fs(s3, tmp_path, monkeypatch):
    with open(_tar(str(tmp_path / "x.tar"), 4), "rb") as f:
        s3.put("data", {"x.tar": f.read()})
    monkeypatch.setenv("PATH", "")  # no aws CLI: the bytes come through our S3 reader
    url = f"pipe:aws s3 cp --quiet --endpoint-url {s3.endpoint} s3://data/x.tar -"
    assert _keys(wds.WebDataset(url, shardshuffle=False)) == ["0000", "0001", "0002", "0003"]
    dp = IterableWrapper([url]).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    assert [s[".cls"] for s in dp] == [b"0", b"1", b"2", b"3"]


def test_other_commands_need_the_user_to_allow_them(tmp_path, monkeypatch):
    a = _tar(str(tmp_path / "a.tar"), 2)
    url = f"pipe:cat {a} | cat"
    monkeypatch.delenv(ENV_ALLOW, raising=False)
    with pytest.raises(ShardReadError, match=f"does not run other shell text.*{ENV_ALLOW}=1"):
        list(wds.WebDataset(url, shardshuffle=False))
    monkeypatch.setenv(ENV_ALLOW, "1")
    assert _keys(wds.WebDataset(url, shardshuffle=False)) == ["0000", "0001"]


def test_a_failing_command_names_the_command_its_status_and_its_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_ALLOW, "1")
    url = "pipe:echo 'no such bucket: b' >&2; exit 3"
    with pytest.raises(ShardReadError) as err:
        list(wds.WebDataset(url, shardshuffle=False))
    message = str(err.value)
    assert "echo 'no such bucket: b' >&2; exit 3" in message
    assert "status 3" in message and "no such bucket: b" in message


def test_stopping_early_ends_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_ALLOW, "1")
    a = _tar(str(tmp_path / "a.tar"), 50)
    ds = wds.WebDataset(f"pipe:cat {a} | cat", shardshuffle=False)
    it = iter(ds)
    assert next(it)["__key__"] == "0000"
    del it  # the generator closes the stream, which ends the command without an error
    assert os.path.exists(a)
