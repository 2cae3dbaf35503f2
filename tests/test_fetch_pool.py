"""Threads and open streams per process stay bounded whatever the number of sources.

35 sources over a real HTTP server (Range support, each response held back a little so that
requests overlap): the threads of shardpipes counted by name after every sample, the
connections counted by the server, the streams by the process pool. No wall-clock asserts:
the server's delay only makes requests overlap, as an object store's latency does.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import pytest

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index
from shardpipes.storage.pool import FetchLimits, fetch_limits, process_pool, set_fetch_limits
from shardpipes.synthetic import write_synthetic

SOURCES = 35
COUNTS = [5, 6]  # samples per shard of each source


@pytest.fixture(scope="module")
def local_sources(tmp_path_factory) -> list[list[str]]:
    d = tmp_path_factory.mktemp("sources")
    return [
        write_synthetic(d / f"s{i:02d}", shards=len(COUNTS), samples=COUNTS, payload_bytes=2000)
        for i in range(SOURCES)
    ]


def _serve(http_server, local_sources: list[list[str]]) -> list[list[str]]:
    # Each response waits a little before its body, so that requests overlap (as at a store).
    http_server.behaviour.faults.stall_first = 10**9
    http_server.behaviour.faults.stall_seconds = 0.005
    out = []
    for paths in local_sources:
        urls = []
        for p in paths:
            with open(p, "rb") as f:
                rel = os.path.relpath(p, os.path.dirname(os.path.dirname(p)))
                urls.append(http_server.add(rel, f.read()))
        out.append(urls)
    return out


def _ident(sample: dict[str, Any]) -> tuple[str, str]:
    """(source folder, key) of a sample, the same for a local path and a URL."""
    return sample["__url__"].replace(os.sep, "/").rsplit("/", 2)[-2], sample["__key__"]


def _ours() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shardpipes-")]


def _read_counting(dp: Any, http_server: Any) -> tuple[list[tuple[str, str]], int]:
    """Every sample's identity and the most shardpipes threads seen after any sample."""
    http_server.connections.reset_peak()
    got, peak = [], 0
    for sample in dp:
        got.append(_ident(sample))
        peak = max(peak, len(_ours()))
    return got, peak


def _assert_bounded(threads_seen: int, http_server: Any, limits: FetchLimits) -> None:
    pool = process_pool()
    assert threads_seen <= limits.threads + limits.openers
    assert pool.peak_threads <= limits.threads
    # Requests at once: the fetch threads, the look-ups, and the reading thread's own.
    assert http_server.connections.peak <= limits.threads + limits.openers + 1
    assert pool.peak_streams <= limits.streams


def _sources_unindexed(groups: list[list[str]]) -> list[Any]:
    return [
        IterableWrapper(urls).open_files_by_fsspec(mode="rb", block_size=4096)
        .load_from_tar().webdataset()
        for urls in groups
    ]  # fmt: skip


@pytest.mark.http
@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "no-ranges"])
def test_35_unindexed_sources_multiplexed_keep_threads_and_streams_bounded(
    http_server, local_sources, ranges
):
    http_server.behaviour.ranges = ranges
    groups = _serve(http_server, local_sources)
    expected = [_ident(s) for s in _sources_unindexed(local_sources)[0].mux(
        *_sources_unindexed(local_sources)[1:])]  # fmt: skip
    limits = fetch_limits()
    evicted = process_pool().evictions
    first, *rest = _sources_unindexed(groups)
    got, threads_seen = _read_counting(first.mux(*rest), http_server)
    assert got == expected  # round robin over 35 sources: every sample once, in order
    assert len(got) == len(set(got)) == SOURCES * sum(COUNTS)
    _assert_bounded(threads_seen, http_server, limits)
    # 35 sources read in turn cannot all keep a stream: streams gave their places up and
    # reopened at their offsets (what the comparison with the local read above checks).
    assert process_pool().evictions > evicted


@pytest.mark.http
def test_35_indexed_sources_mixed_by_the_plan_keep_threads_and_connections_bounded(
    http_server, local_sources
):
    groups = _serve(http_server, local_sources)

    def mixture(groups: list[list[str]]) -> Any:
        srcs = [
            IterableWrapper(urls).sharding_by_index(build_index(urls, progress=False))
            .open_files_by_fsspec().load_from_tar().webdataset()
            for urls in groups
        ]  # fmt: skip
        return srcs[0].mix(*srcs[1:], repeat=[1] * SOURCES)

    expected = [_ident(s) for s in mixture(local_sources)]
    remote = mixture(groups)  # the indexes are read before the epoch is counted
    limits = fetch_limits()
    got, threads_seen = _read_counting(remote, http_server)
    assert got == expected  # the plan's order, from local files or over HTTP
    counts = collections.Counter(got)
    assert len(counts) == SOURCES * sum(COUNTS) and set(counts.values()) == {1}
    _assert_bounded(threads_seen, http_server, limits)


def test_limits_are_checked_and_set_per_process():
    with pytest.raises(ValueError, match="threads should be an integer >= 1, got 0"):
        FetchLimits(threads=0)
    before = fetch_limits()
    try:
        assert set_fetch_limits(streams=3) == FetchLimits(before.threads, 3, before.openers)
        assert process_pool().limits.streams == 3
    finally:
        set_fetch_limits(threads=before.threads, streams=before.streams)
    assert fetch_limits() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd (Linux)")
def test_35_local_indexed_sources_mixed_keep_file_handles_bounded(local_sources):
    srcs = [
        IterableWrapper(paths).sharding_by_index(build_index(paths, progress=False))
        .open_files_by_fsspec().load_from_tar().webdataset()
        for paths in local_sources
    ]  # fmt: skip
    dp = srcs[0].mix(*srcs[1:], repeat=[1] * SOURCES)
    handles = len(os.listdir("/proc/self/fd"))
    got, peak = [], 0
    for sample in dp:
        got.append(_ident(sample))
        peak = max(peak, len(os.listdir("/proc/self/fd")) - handles)
    assert peak <= fetch_limits().streams  # one handle per source would be 35
    expected = [(f"s{i:02d}", key) for i, paths in enumerate(local_sources) for key in _keys(paths)]
    assert sorted(got) == sorted(expected) and len(set(got)) == len(got)


def _keys(paths: list[str]) -> list[str]:
    dp = IterableWrapper(paths).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    return [s["__key__"] for s in dp]
