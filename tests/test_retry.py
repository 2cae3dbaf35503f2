"""Transient errors mid-shard are retried with backoff and resume at the byte offset reached."""

from __future__ import annotations

import errno
import pickle
import socket
import traceback

import pytest

from servers import DUMMY_SECRET, read_samples, retry_waits
from shardpipes.datapipes.iter.fsspec import (
    ForbiddenShardError,
    MissingShardError,
    RetriesExhaustedError,
    open_url,
)
from shardpipes.errors import ShardReadError
from shardpipes.storage.retry import classify_error

FAST = {"block_size": 8192, "backoff": 0.01}


def _serve(http_server, shards) -> list[str]:
    return [http_server.add(name, data) for name, data in shards.data.items()]


def _blocks(shards, block_size: int = 8192) -> int:
    return sum(-(-len(d) // block_size) for d in shards.data.values())


# --- HTTP ------------------------------------------------------------------------------------------


@pytest.mark.http
@pytest.mark.parametrize("readahead", [0, 2], ids=["readahead0", "readahead2"])
def test_connection_cut_mid_block_resumes_without_losing_or_repeating(
    http_server, shards, readahead
):
    urls = _serve(http_server, shards)
    http_server.behaviour.faults.match = "train-"
    http_server.behaviour.faults.drop_first = 4
    http_server.behaviour.faults.drop_after = 1000
    assert read_samples(urls, readahead=readahead, **FAST) == shards.expected
    gets = http_server.log.gets("train-")
    assert sum(g.fault == "drop" for g in gets) == 4
    assert len(gets) == _blocks(shards) + 4  # every block once, plus one retry per cut
    assert http_server.log.bytes_served("train-") == sum(map(len, shards.data.values()))


@pytest.mark.http
def test_503_is_retried_with_exponential_backoff(http_server, shards, caplog):
    name = shards.names[0]
    url = http_server.add(name, shards.data[name])
    http_server.behaviour.faults.fail_first = 3
    with open_url(url, block_size=8192, backoff=0.05) as f:
        assert f.read() == shards.data[name]
    assert retry_waits(caplog.records) == ["0.05s", "0.10s", "0.20s"]  # each twice the last
    assert [g.status for g in http_server.log.gets()][:4] == [503, 503, 503, 206]


@pytest.mark.http
def test_transient_errors_while_opening_are_retried(http_server, shards):
    urls = _serve(http_server, shards)
    http_server.behaviour.faults.methods = ("HEAD", "GET")
    http_server.behaviour.faults.fail_first = 3
    assert read_samples(urls, **FAST) == shards.expected
    fails = [r for r in http_server.log.records if r.fault == "fail"]
    assert [r.status for r in fails] == [503, 503, 503]


@pytest.mark.http
def test_a_stalled_response_times_out_and_resumes(http_server, shards):
    urls = _serve(http_server, shards)
    faults = http_server.behaviour.faults
    # The stall is far longer than the time-out, the time-out far longer than a block takes.
    faults.match, faults.stall_first, faults.drop_after, faults.stall_seconds = (
        "train-",
        1,
        1000,
        60,
    )
    assert read_samples(urls, timeout=3, **FAST) == shards.expected
    gets = http_server.log.gets("train-")
    (stalled,) = [g for g in gets if g.fault == "stall"]
    # Gave up on the stalled response (did not wait it out): its range was asked for again.
    assert [(g.path, g.range) for g in gets].count((stalled.path, stalled.range)) == 2
    assert len(gets) == _blocks(shards) + 1


@pytest.mark.http
def test_a_stream_without_ranges_reopens_and_skips_to_the_offset(http_server, shards):
    http_server.behaviour.advertise_no_ranges = True
    urls = _serve(http_server, shards)
    faults = http_server.behaviour.faults
    faults.match, faults.drop_first, faults.drop_after = "train-", 3, 20_000
    assert read_samples(urls, **FAST) == shards.expected
    gets = http_server.log.gets("train-")
    assert len(gets) == len(shards.names) + 3
    assert all(g.range is None for g in gets)  # whole-body GETs, the start skipped on reopening


@pytest.mark.http
def test_failing_past_the_retries_names_url_and_offset(http_server, shards):
    name = shards.names[-1]
    data = shards.data[name]
    url = http_server.add(name, data)
    faults = http_server.behaviour.faults
    faults.after, faults.drop_first, faults.drop_after = 2, 100, 100
    got = bytearray()
    pattern = rf"^{url}: read failed at byte offset 16384 after 3 attempts .*ClientPayloadError"
    with open_url(url, block_size=8192, readahead=0, retries=2, backoff=0.01) as f:
        while len(got) < 16384:  # everything before the failing block, once
            got += f.read(1000)
        with pytest.raises(RetriesExhaustedError, match=pattern) as info:
            f.read(1000)
    assert bytes(got) == data[:16384]
    assert info.value.url == url
    assert info.value.offset == 16384
    assert isinstance(info.value, ShardReadError)
    assert [g.range for g in http_server.log.gets()][2:] == ["bytes=16384-24575"] * 3


@pytest.mark.http
def test_failing_past_the_retries_in_the_pipeline_raises(http_server, shards):
    urls = _serve(http_server, shards)
    http_server.behaviour.faults.drop_first = 1000
    http_server.behaviour.faults.drop_after = 10
    with pytest.raises(RetriesExhaustedError, match=rf"^{urls[0]}: read failed at byte offset 0"):
        read_samples(urls, retries=1, **FAST)


@pytest.mark.http
def test_an_error_stays_raised_on_later_reads(http_server):
    url = http_server.add("x.bin", bytes(50_000))
    http_server.behaviour.faults.after = 1
    http_server.behaviour.faults.drop_first = 100
    with open_url(url, block_size=8192, readahead=0, retries=0) as f:
        assert f.read(8192) == bytes(8192)
        with pytest.raises(RetriesExhaustedError, match="byte offset 8192"):
            f.read(8192)
        with pytest.raises(RetriesExhaustedError, match="byte offset 8192"):
            f.read(8192)  # never a silent end of file


@pytest.mark.http
def test_connection_refused_is_retried_then_named(caplog):
    # Bound but not listening: connections are refused, and no other process can take the port
    # while the test runs (closing it first would leave a race).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/shard.tar"
        with pytest.raises(
            RetriesExhaustedError, match=rf"^{url}: read failed at byte offset 0 after 3"
        ):
            open_url(url, retries=2, backoff=0.05)
    assert retry_waits(caplog.records) == ["0.05s", "0.10s"]


# --- S3 (moto behind a fault-injecting proxy) ------------------------------------------------------


@pytest.mark.s3
def test_s3_cut_mid_shard_resumes_past_s3fs_own_retries(s3, fault_proxy, shards):
    urls = s3.put("retry", shards.data)
    proxy = fault_proxy(s3.endpoint)
    # s3fs retries a cut body 5 times itself; the 6th and 7th cuts reach our retry loop.
    proxy.set_faults(match="train-000003", drop_first=7, drop_after=500)
    opts = s3.options(proxy.url)
    assert read_samples(urls, storage_options=opts, **FAST) == shards.expected
    gets = proxy.log.gets("train-000003")
    assert sum(g.fault == "drop" for g in gets) == 7
    assert len(gets) == -(-len(shards.data["train-000003.tar"]) // 8192) + 7


@pytest.mark.s3
def test_s3_stall_times_out_and_resumes(s3, fault_proxy, shards):
    urls = s3.put("stall", shards.data)
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match="train-000001", stall_first=1, drop_after=100, stall_seconds=60)
    got = read_samples(urls, storage_options=s3.options(proxy.url), timeout=3, **FAST)
    assert got == shards.expected
    gets = proxy.log.gets("train-000001")
    (stalled,) = [g for g in gets if g.fault == "stall"]
    assert [g.range for g in gets].count(stalled.range) == 2  # abandoned, then asked again
    assert len(gets) == -(-len(shards.data["train-000001.tar"]) // 8192) + 1


@pytest.mark.s3
def test_s3_failing_past_retries_names_url_offset_and_hides_the_secret(s3, fault_proxy, shards):
    name = shards.names[0]
    (url,) = s3.put("fail", {name: shards.data[name]})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match=name, after=1, fail_first=1000, fail_status=503)
    # botocore retries a 503 itself (with up to 20 s of backoff); leave the retrying to us.
    opts = s3.options(proxy.url, config_kwargs={"retries": {"total_max_attempts": 1}})
    pattern = rf"^{url}: read failed at byte offset 8192"
    with (
        open_url(
            url, storage_options=opts, block_size=8192, readahead=0, retries=2, backoff=0.01
        ) as f,
        pytest.raises(RetriesExhaustedError, match=pattern) as info,
    ):
        f.read()
    assert info.value.offset == 8192
    assert [g.fault for g in proxy.log.gets(name)] == [None, "fail", "fail", "fail"]
    assert DUMMY_SECRET not in "".join(traceback.format_exception(info.value))


@pytest.mark.s3
def test_s3_403_mid_shard_fails_at_once(s3, fault_proxy, shards):
    name = shards.names[0]
    (url,) = s3.put("deny", {name: shards.data[name]})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match=name, after=2, fail_first=1000, fail_status=403)
    pattern = rf"^{url}: access denied \(at byte offset 16384\)"
    opts = s3.options(proxy.url)
    with (
        open_url(url, storage_options=opts, block_size=8192, readahead=0, backoff=10) as f,
        pytest.raises(ForbiddenShardError, match=pattern),
    ):
        f.read()
    assert sum(g.fault == "fail" for g in proxy.log.gets()) == 1  # not retried


# --- classification and pickling (no server) --------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionResetError(errno.ECONNRESET, "reset"), "transient"),
        (TimeoutError(), "transient"),
        (OSError(errno.EBUSY, "SlowDown"), "transient"),
        (OSError(errno.EIO, "eio"), "transient"),
        (FileNotFoundError("x"), "missing"),
        (PermissionError("x"), "forbidden"),
        (OSError("Forbidden: bucket/key"), "forbidden"),
        (OSError(errno.EINVAL, "InvalidRange"), "fatal"),
        (ValueError("Bad Request"), "fatal"),
    ],
    ids=[
        "reset",
        "timeout",
        "s3-slowdown",
        "eio",
        "enoent",
        "eacces",
        "gcsfs-403",
        "einval",
        "valueerror",
    ],
)
def test_classify_error(exc, kind):
    assert classify_error(exc) == kind


def test_a_file_not_found_caused_by_a_refused_connection_is_transient():
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        except ConnectionRefusedError as inner:
            raise FileNotFoundError("http://127.0.0.1:1/x") from inner
    except FileNotFoundError as exc:
        assert classify_error(exc) == "transient"


@pytest.mark.parametrize(
    "cls", [MissingShardError, ForbiddenShardError, RetriesExhaustedError], ids=lambda c: c.__name__
)
def test_read_errors_pickle_with_their_type_url_and_offset(cls):
    err = cls("s3://b/k.tar: bad at byte offset 42", url="s3://b/k.tar", offset=42, err=errno.EIO)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.url, back.offset, str(back)) == ("s3://b/k.tar", 42, str(err))
