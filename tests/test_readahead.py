"""Read-ahead across shard boundaries: requests counted at the server and in the reader's budget.

No wall-clock asserts: a test waits (with a generous deadline) for a count of requests to be
reached, or checks counts after the fact.
"""

from __future__ import annotations

import threading
import time

import pytest

import shardpipes.storage.pool as pool_module
from servers import read_samples
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.fsspec import open_url
from shardpipes.storage.readahead import (
    AUTO_MAX_BLOCK,
    AUTO_MAX_BYTES,
    Readahead,
    auto_block_size,
)


def _wait_for(cond, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.01)


@pytest.mark.s3
def test_next_shards_first_blocks_are_requested_while_the_current_one_is_read(
    s3, shards, fault_proxy
):
    urls = s3.put("data", shards.data)
    proxy = fault_proxy(s3.endpoint)
    opened = iter(
        IterableWrapper(urls).open_files_by_fsspec(mode="rb", storage_options=s3.options(proxy.url))
    )
    url, stream = next(opened)
    assert stream.read(10) == shards.data[shards.names[0]][:10]
    # The opener was asked for one shard only; the next ones are looked up and fetched ahead.
    _wait_for(lambda: proxy.log.gets(shards.names[2]), "a GET of the third shard")
    assert stream.tell() == 10  # the first shard is not exhausted
    assert stream.read() == shards.data[shards.names[0]][10:]
    stream.close()
    rest = [(u, s.read()) for u, s in opened]
    assert rest == [(u, shards.data[n]) for u, n in zip(urls[1:], shards.names[1:], strict=True)]
    # Every shard was fetched once: one GET each (all are smaller than one block).
    assert [len(proxy.log.gets(n)) for n in shards.names] == [1] * len(shards.names)


@pytest.mark.s3
def test_s3_streams_skip_the_range_probe(s3, fault_proxy):
    data = bytes(range(256)) * 4096  # 1 MiB
    (url,) = s3.put("data", {"big.bin": data})
    proxy = fault_proxy(s3.endpoint)
    with open_url(url, storage_options=s3.options(proxy.url), block_size=64 << 10) as f:
        pool = f._q.pool
        # Before anything is read, every block is claimed (all 16 fit in the budget): not one
        # probe first.
        _wait_for(lambda: pool.requests >= 16, "16 requests")
        assert f.tell() == 0
        assert f.read() == data
    assert len(proxy.log.gets("big.bin")) == len(data) // (64 << 10)


@pytest.mark.http
def test_http_streams_probe_one_block_then_widen_before_being_read(http_server):
    data = bytes(1 << 20)
    url = http_server.add("big.bin", data)
    with open_url(url, block_size=64 << 10) as f:
        pool = f._q.pool
        _wait_for(lambda: pool.requests >= 4, "4 requests")
        assert f.tell() == 0  # widened on the probe's arrival, not when it was read
        assert pool.peak_in_flight >= 1
        assert f.read() == data


@pytest.mark.http
def test_reads_and_readinto_within_and_across_blocks_give_the_objects_bytes(http_server):
    data = bytes(range(256)) * 1200  # 307,200 bytes: 4.7 blocks of 64 KiB
    url = http_server.add("mixed.bin", data)
    got = bytearray()
    # Within a block, across one and two block ends, exactly a block, alternately into a buffer.
    sizes = [6, 1000, 70_000, 65_536, 100, 131_072, 5000, 70_000]
    with open_url(url, block_size=64 << 10) as f:
        for i, n in enumerate(sizes):
            if i % 2:
                buf = bytearray(n)
                k = f.readinto(buf)
                got += buf[:k]
            else:
                chunk = f.read(n)
                assert type(chunk) is bytes
                got += chunk
            assert f.tell() == len(got)
        got += f.read()
        assert f.readinto(bytearray(10)) == 0
    assert bytes(got) == data


def _opened(urls, **options):
    return list(IterableWrapper(urls).open_files_by_fsspec(mode="rb", **options))


@pytest.mark.http
@pytest.mark.parametrize("order", ["reversed", "interleaved"], ids=["reversed", "interleaved"])
def test_streams_read_out_of_order_do_not_wait_forever(http_server, shards, order):
    urls = [http_server.add(n, d) for n, d in shards.data.items()]
    # A budget of 2 blocks of 4 KiB: the first streams hold it; later ones fetch for themselves.
    pairs = _opened(urls, block_size=4096, readahead=2)
    want = {u: shards.data[n] for u, n in zip(urls, shards.names, strict=True)}
    if order == "reversed":
        got = {u: s.read() for u, s in reversed(pairs)}
    else:
        got = {u: b"" for u, _ in pairs}
        while any(not s.closed for _, s in pairs):
            for u, s in pairs:
                if not s.closed:
                    chunk = s.read(3000)
                    got[u] += chunk
                    if not chunk:
                        s.close()
    assert got == want
    for _, s in pairs:
        s.close()
    pool = pairs[0][1]._q.pool
    # One block beyond the budget per stream that fetched for itself, never more.
    assert pool.peak_bytes <= 2 * 4096 + len(pairs) * 4096


@pytest.mark.http
def test_budget_holds_across_streams(http_server, shards):
    urls = [http_server.add(n, d) for n, d in shards.data.items()]
    dp = IterableWrapper(urls).open_files_by_fsspec(mode="rb", block_size=4096, readahead=3)
    pools = set()
    total = 0
    for _, stream in dp:
        pools.add(stream._q.pool)
        while chunk := stream.read(1000):
            total += len(chunk)
        stream.close()
    (pool,) = pools  # one budget for the whole reader
    assert total == sum(map(len, shards.data.values()))
    assert pool.peak_bytes <= 3 * 4096
    assert pool.peak_in_flight <= 3
    assert pool.requests == sum(-(-len(d) // 4096) for d in shards.data.values())


@pytest.mark.http
def test_automatic_budget_stays_within_64_mib(http_server, monkeypatch):
    monkeypatch.setattr(pool_module, "_pool", None)  # a pool of its own: nothing learnt yet
    data = bytes(range(256)) * (160 << 12)  # 160 MiB would be held whole without a bound
    urls = [http_server.add(f"s{i}.bin", data[: (40 << 20)]) for i in range(4)]
    peak_block = 0
    pools = set()
    for _, stream in IterableWrapper(urls).open_files_by_fsspec(mode="rb"):
        pools.add(stream._q.pool)
        peak_block = max(peak_block, stream._block_size)
        while stream.read(1 << 20):
            pass
        stream.close()
    (pool,) = pools
    assert peak_block == AUTO_MAX_BLOCK  # the first stream's, before any raise
    assert pool.peak_bytes <= AUTO_MAX_BYTES
    assert pool.shared.peak_held <= AUTO_MAX_BYTES
    assert AUTO_MAX_BYTES + AUTO_MAX_BLOCK <= 64 << 20  # held ahead + the block being read


def test_block_size_adapts_to_the_object():
    assert auto_block_size(None) == AUTO_MAX_BLOCK
    assert auto_block_size(10_000) == 1 << 20  # at least 1 MiB (one request for the object)
    assert auto_block_size(6_700_000) == 7 << 18  # a quarter, in whole 256 KiB
    assert auto_block_size(1 << 30) == AUTO_MAX_BLOCK


def test_a_stopped_queue_gives_its_budget_back():
    pool = Readahead(max_bytes=3 * 10, max_requests=2)
    release = threading.Event()
    queues = [pool.queue() for _ in range(3)]

    def fetch(offset: int, length: int, halt: threading.Event) -> bytes:
        release.wait(30)
        return bytes(length)

    for q in queues:
        q.start(fetch, lambda i: (i * 10, 10) if i < 5 else None, 2)
    _wait_for(lambda: pool.in_flight == 2, "two requests in flight")
    assert (pool.held, pool.blocks, queues[0].claimed) == (20, 2, {0: 10, 1: 10})  # in order
    queues[0].stop()
    assert (pool.held, pool.blocks) == (0, 0)  # given back while its requests still run
    release.set()
    got = [b"".join(iter(q.take, b"")) for q in queues[1:]]
    assert got == [bytes(50), bytes(50)]
    _wait_for(lambda: pool.threads == 0, "the threads ended")  # the process's, none left
    assert (pool.held, pool.blocks, pool.in_flight, pool.queues) == (0, 0, 0, [])
    assert pool.peak_bytes <= 30 and pool.peak_in_flight <= 2


@pytest.mark.s3
def test_pipeline_over_s3_with_defaults_reads_every_sample_in_order(s3, shards):
    urls = s3.put("data", shards.data)
    assert read_samples(urls, storage_options=s3.options()) == shards.expected


@pytest.mark.s3
def test_sizes_from_the_listing_save_the_look_ups(s3, shards, fault_proxy):
    s3.put("data", shards.data)
    proxy = fault_proxy(s3.endpoint)
    opts = s3.options(proxy.url)
    dp = (
        IterableWrapper(["s3://data/"])
        .list_files_by_fsspec(masks="*.tar", storage_options=opts)
        .open_files_by_fsspec(mode="rb", storage_options=opts)
    )
    got = {u.rsplit("/", 1)[1]: s.read() for u, s in dp}
    assert got == shards.data
    methods = [r.method for r in proxy.log.records]
    # s3fs answers the opener's look-ups from the listing it cached: no HEAD per shard.
    assert methods.count("HEAD") == 0
    assert methods.count("GET") == len(shards.data) + 1  # one listing, one GET per shard


@pytest.mark.s3
def test_a_range_read_requests_nothing_before_its_offset(s3, fault_proxy):
    from shardpipes.index import open_range

    data = bytes(range(256)) * 4096  # 1 MiB
    (url,) = s3.put("data", {"big.bin": data})
    proxy = fault_proxy(s3.endpoint)
    offset, size = 300_000, 500_000
    opts = s3.options(proxy.url)
    with open_range(url, offset, size, opts, max_fetch=65536, block_size=65536) as f:
        assert f.read() == data[offset : offset + size]
    starts = sorted(int(g.range.split("=")[1].split("-")[0]) for g in proxy.log.gets("big.bin"))
    assert starts[0] == offset  # no block from the start of the object, fetched and dropped


@pytest.mark.s3
def test_sizes_from_the_index_save_the_look_ups(s3, shards, fault_proxy, tmp_path):
    from shardpipes.index import ShardIndex, build_index

    urls = s3.put("data", shards.data)
    build_index(urls, storage_options=s3.options(), progress=False).save(str(tmp_path / "i.json"))
    index = ShardIndex.load(str(tmp_path / "i.json"))  # a fresh process's index: no s3fs cache
    proxy = fault_proxy(s3.endpoint)
    opts = s3.options(proxy.url)
    dp = IterableWrapper(index.urls).open_files_by_fsspec(mode="rb", storage_options=opts)
    got = {u.rsplit("/", 1)[1]: s.read() for u, s in dp}
    assert got == shards.data
    assert [u.size for u in index.urls] == [len(shards.data[u.rsplit("/", 1)[1]]) for u in urls]
    methods = [r.method for r in proxy.log.records]
    # The index knows each shard's size: no HEAD, one GET per shard (they fit one block).
    assert methods.count("HEAD") == 0
    assert methods.count("GET") == len(shards.data)
