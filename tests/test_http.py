"""Streaming shards over HTTP from a local server that honours (or ignores) Range requests."""

from __future__ import annotations

import json
import threading
import time
import traceback

import pytest

from servers import HTTPServerHandle, Shards, read_samples, requests_until_it_fails, retry_waits
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.fsspec import (
    ForbiddenShardError,
    MissingShardError,
    open_url,
    read_shard_list,
)
from shardpipes.errors import ShardReadError

pytestmark = pytest.mark.http

SMALL = {"block_size": 8192}


def _serve_all(http_server: HTTPServerHandle, shards: Shards) -> list[str]:
    return [http_server.add(name, data) for name, data in shards.data.items()]


def test_brace_pattern_over_http_streams_every_sample_in_order(http_server, shards):
    _serve_all(http_server, shards)
    pattern = f"{http_server.url}/train-{{000000..000006}}.tar"
    urls = list(IterableWrapper([pattern]).shard_expand())
    assert urls == [f"{http_server.url}/{n}" for n in shards.names]
    assert read_samples(urls, **SMALL) == shards.expected


def test_list_files_by_fsspec_reads_an_html_index(http_server, shards):
    for name, data in shards.data.items():
        http_server.add(f"shards/{name}", data)
    http_server.add("shards/README.txt", b"hello")
    listed = list(
        IterableWrapper([f"{http_server.url}/shards/"]).list_files_by_fsspec(masks="*.tar")
    )
    assert listed == [f"{http_server.url}/shards/{n}" for n in shards.names]
    assert read_samples(listed, **SMALL) == shards.expected


def test_reads_are_range_requests_of_at_most_block_size(http_server, shards):
    url = http_server.add("train-000006.tar", shards.data["train-000006.tar"])
    size = len(shards.data["train-000006.tar"])
    with open_url(url, block_size=8192) as f:
        assert f.read() == shards.data["train-000006.tar"]
    ranges = sorted((g.range for g in http_server.log.gets("train-000006")), key=_start)
    assert ranges == [f"bytes={s}-{min(s + 8192, size) - 1}" for s in range(0, size, 8192)]


def _start(header: str) -> int:
    return int(header.split("=")[1].split("-")[0])


def test_bounded_memory_stream_never_holds_the_whole_object(http_server):
    import tracemalloc

    data = bytes(range(256)) * (16 << 12)  # 16 MiB
    url = http_server.add("big.bin", data)
    tracemalloc.start()
    try:
        with open_url(url, block_size=256 << 10, readahead=2) as f:
            total = 0
            while chunk := f.read(64 << 10):
                total += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == len(data)
    assert peak < 4 << 20  # (readahead + 1) x 256 KiB plus the server's copy of one response


def test_leaving_a_shard_early_stops_the_read_ahead_threads(http_server, shards):
    urls = [http_server.add(name, data) for name, data in shards.data.items()]
    dp = IterableWrapper(urls).open_files_by_fsspec(block_size=4096, readahead=4).load_from_tar()
    for i, _ in enumerate(dp):
        if i == 5:
            break  # the generator is closed: load_from_tar closes the stream
    del dp
    _wait_for_no_readahead_threads()


def test_read_ahead_stays_within_readahead_blocks(http_server):
    url = http_server.add("big.bin", bytes(1 << 20))
    with open_url(url, block_size=4096, readahead=4) as f:
        assert f.read(10) == bytes(10)
        # Wait (a poll, however slow the machine) until the window is full: the probe and 4
        # blocks ahead; then give the threads a moment in which fetching more would show.
        deadline = time.monotonic() + 60
        while len(http_server.log.gets()) < 1 + 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(http_server.log.gets()) >= 1 + 4
        time.sleep(0.3)
    _wait_for_no_readahead_threads()
    # The first block alone (the probe), then at most 4 ahead of the one being read.
    assert len(http_server.log.gets()) <= 1 + 4 + 1


def _wait_for_no_readahead_threads() -> None:
    deadline = time.monotonic() + 60  # a poll, not a measurement: threads are slow under load
    while _readahead_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _readahead_threads() == []


def _readahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "shardpipes-readahead"]


def test_missing_content_length_streams_to_the_end(http_server, shards):
    http_server.behaviour.content_length = False
    urls = _serve_all(http_server, shards)
    assert read_samples(urls, **SMALL) == shards.expected


def test_server_that_ignores_ranges_is_streamed_once(http_server, shards):
    http_server.behaviour.ranges = False
    urls = _serve_all(http_server, shards)
    assert read_samples(urls, **SMALL) == shards.expected
    # One probe (answered with the whole body), then one streaming GET per shard.
    for name in shards.names:
        assert len(http_server.log.gets(name)) == 2


def test_accept_ranges_none_streams_without_range_headers(http_server, shards):
    http_server.behaviour.advertise_no_ranges = True
    urls = _serve_all(http_server, shards)
    assert read_samples(urls, **SMALL) == shards.expected
    gets = http_server.log.gets()
    assert len(gets) == len(shards.names)
    assert all(g.range is None for g in gets)


@pytest.mark.parametrize(
    ("status", "error", "what"),
    [
        (401, ForbiddenShardError, "access denied"),
        (403, ForbiddenShardError, "access denied"),
        (404, MissingShardError, "no such file or bucket"),
    ],
    ids=["401", "403", "404"],
)
def test_permanent_errors_fail_at_once_naming_the_url(http_server, status, error, what, caplog):
    url = http_server.add("x.tar", b"x")
    http_server.behaviour.status["/x.tar"] = status
    errors = []

    def fail(retries):
        with pytest.raises(error, match=rf"^{url}: {what} \(at byte offset 0\)") as info:
            open_url(url, retries=retries, backoff=10.0)
        errors.append(info.value)

    sent = requests_until_it_fails(http_server.log, fail)
    assert sent[0] == sent[1] > 0  # no retry: five retries cost no extra request
    assert retry_waits(caplog.records) == []
    assert [(e.url, e.offset) for e in errors] == [(url, 0)] * 2


def test_missing_file_is_a_file_not_found_error(http_server):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_samples([f"{http_server.url}/nope.tar"])


def test_headers_in_storage_options_authenticate(http_server, shards):
    token = "Bearer s3cr3t-token-value"
    http_server.behaviour.require = ("Authorization", token)
    urls = _serve_all(http_server, shards)
    opts = {"headers": {"Authorization": token}}
    assert read_samples(urls, storage_options=opts, **SMALL) == shards.expected
    assert all(r.headers.get("Authorization") == token for r in http_server.log.records)


def test_credentials_in_the_url_are_never_printed(http_server):
    http_server.behaviour.require = ("Authorization", "Bearer right-token")
    url = http_server.add("x.tar", b"x")
    host = http_server.url.split("://", 1)[1]
    secret_url = f"http://user:pa55word-xyz@{host}/x.tar?sig=signature-abc&part=1"
    with pytest.raises(ForbiddenShardError, match=r"user:\*\*\*@.*sig=\*\*\*") as info:
        open_url(secret_url)
    assert info.value.url == f"http://user:***@{host}/x.tar?sig=***&part=1"
    shown = "".join(traceback.format_exception(info.value))
    assert "pa55word-xyz" not in shown
    assert "signature-abc" not in shown
    assert url.rsplit("/", 1)[1] in str(info.value)


def test_credentials_in_storage_options_are_never_printed(http_server):
    http_server.behaviour.require = ("Authorization", "Bearer right-token")
    url = http_server.add("x.tar", b"x")
    opts = {"headers": {"Authorization": "Bearer wrong-token-123"}}
    with pytest.raises(ForbiddenShardError, match=f"^{url}: access denied") as info:
        open_url(url, storage_options=opts)
    assert "wrong-token-123" not in "".join(traceback.format_exception(info.value))


def test_seek_and_tell_read_any_range(http_server):
    data = bytes(range(256)) * 1000
    url = http_server.add("r.bin", data)
    with open_url(url, block_size=4096) as f:
        assert f.seekable()
        assert f.seek(100_000) == 100_000
        assert f.read(10) == data[100_000:100_010]
        f.seek(5)  # backwards, outside the current block
        assert f.read(4096) == data[5:4101]
        assert f.tell() == 4101
        f.seek(-3, 2)
        assert f.read() == data[-3:]


def test_text_mode_reads_a_remote_file(http_server):
    url = http_server.add("notes.txt", "héllo\nwörld\n".encode())
    (got,) = IterableWrapper([url]).open_files_by_fsspec(
        mode="r", open_kwargs={"encoding": "utf-8"}
    )
    assert got[1].read() == "héllo\nwörld\n"


def test_read_shard_list_resolves_urls_relative_to_the_descriptor(http_server, shards):
    for name, data in shards.data.items():
        http_server.add(f"shards/{name}", data)
    desc = {
        "wids_version": 1,
        "shardlist": [{"url": f"../shards/{n}", "nsamples": 1} for n in shards.names[:3]]
        + [{"url": f"/shards/{n}", "nsamples": 1} for n in shards.names[3:5]]
        + [{"url": f"{http_server.url}/shards/{n}", "nsamples": 1} for n in shards.names[5:]],
    }
    desc_url = http_server.add("meta/dataset.json", json.dumps(desc).encode())
    urls = read_shard_list(desc_url)
    assert urls == [f"{http_server.url}/shards/{n}" for n in shards.names]
    assert read_samples(urls, **SMALL) == shards.expected


def test_read_shard_list_rejects_a_descriptor_without_shardlist(http_server):
    url = http_server.add("bad.json", b'{"datasets": []}')
    with pytest.raises(ValueError, match=r"bad\.json: a dataset descriptor needs a 'shardlist'"):
        read_shard_list(url)


def test_read_shard_list_names_a_missing_descriptor(http_server):
    with pytest.raises(ShardReadError, match=r"nope\.json: no such file"):
        read_shard_list(f"{http_server.url}/nope.json")
