"""Requests in flight learnt from the store, within one read-ahead budget per process.

The policy (``storage/adapt.py``) is pure: it is driven here by a simulated link (latency, a
rate per connection, a cap on the sum) with made-up times, so its properties hold exactly.
The integration runs real reads against the test HTTP server (Range support), which counts the
range requests and bytes it is answering at once; the server's latency only changes what the
reader measures. Nothing asserts on time: counts, bytes and digests.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import shardpipes.storage.pool as pool_module
from shardpipes.cli.bench import fetch_line
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.storage.adapt import Concurrency
from shardpipes.storage.link import measure_link
from shardpipes.storage.pool import START_REQUESTS, fetch_limits, process_pool, set_fetch_limits

MiB = 1 << 20


# --- the policy, against a simulated link ---------------------------------------------------


def _run(c: Concurrency, latency: float, conn_rate: float, cap: float, block: int, windows: int,
         reader_share: float = 1.0) -> list[int]:  # fmt: skip
    """Feed ``c`` rounds of requests over a link; return the count allowed after each round.

    Each round, ``n`` requests (``reader_share`` of those allowed: a slow reader keeps fewer in
    flight) start together and share the link: each runs ``latency + block / rate`` with
    ``rate = min(conn_rate, cap / n)``.
    """
    now, seen = 0.0, []
    for _ in range(windows):
        n = max(1, int(c.requests * reader_share))
        took = latency + block / min(conn_rate, cap / n)
        for _ in range(n):
            c.started(now)
        for _ in range(n):
            c.finished(now + took, block)
        now += took
        seen.append(c.requests)
    return seen


links = st.tuples(
    st.floats(0.0, 0.2),  # first-byte latency, s
    st.floats(5e6, 200e6),  # per connection, bytes/s
    st.floats(50e6, 5e9),  # the sum's cap, bytes/s
    st.sampled_from([1 * MiB, 4 * MiB, 8 * MiB]),
)


@settings(max_examples=60, deadline=None)
@given(link=links, cap=st.integers(1, 64))
@example(link=(0.05, 50e6, 1e12, 8 * MiB), cap=32)
def test_the_count_stays_between_1_and_the_cap(link, cap):
    c = Concurrency(cap=cap)
    assert all(1 <= n <= cap for n in _run(c, *link, windows=40))


@settings(max_examples=40, deadline=None)
@given(latency=st.floats(0.01, 0.2), block=st.sampled_from([1 * MiB, 8 * MiB]))
def test_without_a_cap_on_the_sum_the_count_reaches_the_cap(latency, block):
    # Each connection carries its rate whatever the count: every raise pays.
    c = Concurrency(cap=32)
    assert _run(c, latency, 50e6, 1e15, block, windows=20)[-1] == 32


@settings(max_examples=60, deadline=None)
@given(
    latencies=st.tuples(st.floats(0.0, 0.2), st.floats(0.0, 0.2)),
    conn_rate=st.floats(10e6, 100e6),
    cap=st.floats(100e6, 2e9),
)
@example(latencies=(0.0, 0.05), conn_rate=50e6, cap=480e6)
def test_more_latency_never_means_fewer_requests(latencies, conn_rate, cap):
    low, high = sorted(latencies)

    def settled(latency: float) -> int:
        seen = _run(Concurrency(cap=64), latency, conn_rate, cap, 8 * MiB, windows=60)
        return min(seen[-20:])  # a kept count, not one of the raises tried every few windows

    assert settled(high) >= settled(low)


@example(latency=0.05, share=0.5)
@settings(max_examples=40, deadline=None)
@given(latency=st.floats(0.0, 0.2), share=st.floats(0.05, 0.65))
def test_a_slow_reader_teaches_nothing(latency, share):
    # The reader keeps fewer requests in flight than allowed: the link is not what limits it.
    c = Concurrency(cap=32, start=8)
    assert set(_run(c, latency, 50e6, 1e12, 4 * MiB, windows=20, reader_share=share)) == {8}
    assert c.counted == 0


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="should be >= 1"):
        Concurrency(cap=0)


# --- the process's budget, from the environment -----------------------------------------------


@pytest.fixture
def fresh_pool(monkeypatch):
    """A process pool of its own for the test (the process's one comes back afterwards)."""
    monkeypatch.setattr(pool_module, "_pool", None)
    monkeypatch.setattr(pool_module, "_limits", None)
    monkeypatch.delenv("SHARDPIPES_READAHEAD_BYTES", raising=False)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("1048576", 1 << 20), ("96M", 96 << 20), ("2g", 2 << 30), ("512K", 512 << 10)],
    ids=["bytes", "mib", "gib", "kib"],
)
def test_the_budget_comes_from_the_environment(fresh_pool, monkeypatch, raw, want):
    monkeypatch.setenv("SHARDPIPES_READAHEAD_BYTES", raw)
    assert fetch_limits().readahead_bytes == want
    assert process_pool().budget == want


def test_a_bad_budget_is_named(fresh_pool, monkeypatch):
    monkeypatch.setenv("SHARDPIPES_READAHEAD_BYTES", "lots")
    with pytest.raises(ValueError, match="SHARDPIPES_READAHEAD_BYTES='lots' should be"):
        fetch_limits()


# --- real reads -------------------------------------------------------------------------------


def _objects(n: int, size: int) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        seed = hashlib.sha256(str(i).encode()).digest()
        out[f"obj{i}.bin"] = (seed * (size // len(seed) + 1))[:size]
    return out


def _read_all(urls: list[str], **options) -> dict[str, str]:
    got = {}
    for url, stream in IterableWrapper(urls).open_files_by_fsspec(mode="rb", **options):
        h = hashlib.sha256()
        while chunk := stream.read(100_000):
            h.update(chunk)
        stream.close()
        got[url] = h.hexdigest()
    return got


def _digests(urls: list[str], objects: dict[str, bytes]) -> dict[str, str]:
    return {u: hashlib.sha256(d).hexdigest() for u, d in zip(urls, objects.values(), strict=True)}


@pytest.mark.http
def test_latency_raises_the_requests_within_the_budget(fresh_pool, http_server):
    block, budget = 64 << 10, 2 * MiB  # 32 blocks
    set_fetch_limits(readahead_bytes=budget, threads=24)
    objects = _objects(3, 3 * MiB)
    urls = [http_server.add(n, d) for n, d in objects.items()]
    http_server.behaviour.latency = 0.05  # each request waits: more of them carry more
    assert _read_all(urls, block_size=block) == _digests(urls, objects)
    pool = process_pool()
    start = START_REQUESTS
    assert pool.concurrency.kept >= 1  # a raise paid and was kept
    assert pool.concurrency.requests > start
    assert http_server.flight.peak_requests > start  # the server saw them at once
    # Never more bytes ahead than the budget: in flight at the server, and held in the reader
    # (plus one block the reading thread may fetch itself when later streams hold the budget).
    assert http_server.flight.peak_bytes <= budget + block
    assert pool.peak_held <= budget + block
    assert pool.held == 0 and pool.blocks == 0  # everything taken or given back


_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


@pytest.mark.http
def test_automatic_blocks_cover_each_object_once_and_retries_resume_at_the_offset(
    fresh_pool, http_server
):
    set_fetch_limits(readahead_bytes=8 * MiB)
    objects = _objects(3, 12 * MiB)
    urls = [http_server.add(n, d) for n, d in objects.items()]
    faults = http_server.behaviour.faults
    faults.after, faults.drop_first, faults.drop_after = 3, 3, 1000
    assert _read_all(urls, backoff=0.01) == _digests(urls, objects)
    for name, data in objects.items():
        gets = http_server.log.gets(name)
        whole = sorted(
            tuple(map(int, _RANGE.match(r.range).groups()))
            for r in gets
            if r.fault is None and r.status == 206
        )
        # Fault-free answers tile the object: no gap, no overlap.
        assert whole[0][0] == 0 and whole[-1][1] == len(data) - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(whole, whole[1:], strict=False))
        assert all(b - a + 1 <= 3 * MiB for a, b in whole)  # a quarter of the object at most
        # Every cut request was asked again for the same range: the retry resumed there.
        for r in gets:
            if r.fault == "drop":
                assert r.range in {x.range for x in gets if x.fault is None}
    assert sum(r.fault == "drop" for r in http_server.log.gets()) == 3
    assert process_pool().peak_held <= 8 * MiB + 4 * MiB  # + the block a reader fetches itself


@pytest.mark.http
def test_the_link_is_measured_with_n_ranges_at_once(http_server):
    objects = _objects(2, 1 * MiB + 5)
    urls = [http_server.add(n, d) for n, d in objects.items()]
    http_server.behaviour.latency = 0.02  # so that the requests overlap
    link = measure_link(urls, requests=3, block_size=256 << 10)
    assert (link.nbytes, link.object_bytes, link.ranges) == (2 * MiB + 10, 2 * MiB + 10, 10)
    assert link.mb_per_s > 0
    assert 1 <= http_server.flight.peak_requests <= 3
    assert len(http_server.log.gets()) == 10  # one request per range, none repeated
    with pytest.raises(ValueError, match="requests >= 1"):
        measure_link(urls, requests=0)


# --- what was learnt, in the loader's stats ---------------------------------------------------


def _tar_of(i: int, samples: int = 40) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for k in range(samples):
            data = bytes([i, k]) * 2000
            info = tarfile.TarInfo(f"s{i:02d}{k:03d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.http
@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_stats_show_each_readers_learnt_requests(fresh_pool, http_server, workers):
    urls = [http_server.add(f"t{i}.tar", _tar_of(i)) for i in range(4)]
    http_server.behaviour.latency = 0.01
    dp = (
        IterableWrapper(urls)
        .sharding_filter()
        .open_files_by_fsspec(mode="rb", block_size=16 << 10)
        .load_from_tar()
        .batch(8)
    )
    dl = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers))
    try:
        assert "fetch" not in dl.stats()  # nothing read yet
        assert sum(map(len, dl)) == 160
        fetch = dl.stats()["fetch"]
    finally:
        dl.shutdown()
    # One entry per reader: the process that read (each worker learns its own).
    assert [f["worker"] for f in fetch] == ([None] if workers == 0 else [0, 1])
    for f in fetch:
        assert 1 <= f["requests"] <= fetch_limits().threads
        assert f["windows"] >= 1 and f["mb_per_s"] > 0  # measured, not the starting guess
        assert f["peak_requests"] >= 1 and f["peak_readahead_mb"] <= f["budget_mb"]
    if workers:  # `shardpipes bench --link` prints them per worker
        line = fetch_line(process_pool(), workers, fetch)
        want = ", ".join(f"{f['requests']} in worker {f['worker']}" for f in fetch)
        assert line.startswith(f"requests in flight: {want} learnt (started at 6)")
