"""``on_disk_cache`` shared by several processes on one machine, fed by a real HTTP server."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing as mp
import os
import queue
import traceback
from dataclasses import dataclass
from typing import Any

import pytest

from servers import serving_http
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.cache import cache_entry_name
from shardpipes.datapipes.iter.fsspec import MissingShardError
from shardpipes.synthetic import write_synthetic

pytestmark = pytest.mark.http

JOIN_TIMEOUT = 60


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_through_cache(
    rank: int, phases: list[tuple[list[str], str, int | None]], barrier: Any, out: Any
) -> None:
    """Child: for each phase, wait for the others, then read every URL through the shared cache."""
    try:
        report = []
        for urls, cache_dir, max_bytes in phases:
            barrier.wait(JOIN_TIMEOUT)
            order = urls[rank % len(urls) :] + urls[: rank % len(urls)]  # contend differently
            dp = IterableWrapper(order).on_disk_cache(cache_dir, max_bytes=max_bytes)
            seen = []
            for url, path in zip(order, dp, strict=True):
                with open(path, "rb") as f:  # opened while the stage still holds the entry
                    seen.append((url, _sha(f.read())))
            report.append(seen)
        out.put((rank, "ok", report))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))


def _fill_a_tiny_disk(url: str, cache_dir: str, limit: int, out: Any) -> None:
    """Child: writes beyond ``limit`` bytes fail with EFBIG, as on a full disk."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        list(IterableWrapper([url]).on_disk_cache(cache_dir))
        out.put(("no error", None, ""))
    except OSError as exc:
        out.put((type(exc).__name__, exc.errno, str(exc)))


def _run(n: int, target: Any, args_of: Any) -> list[Any]:
    """Start ``n`` spawned children, collect one result each; report hung and failed ones."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(ctx, i), out)) for i in range(n)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(n):
            results.append(out.get(timeout=JOIN_TIMEOUT))
    except queue.Empty:
        pass
    for p in procs:
        p.join(10)
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in hung:
        procs[i].kill()
    failed = [(i, p.exitcode) for i, p in enumerate(procs) if not p.is_alive() and p.exitcode]
    assert not hung, f"children {hung} hung"
    assert not failed, f"children exited with (index, code) {failed}"
    assert len(results) == n, f"only {len(results)} of {n} children reported"
    return results


def _serve(http_server, shards, names) -> dict[str, bytes]:
    return {http_server.add(n, shards.data[n]): shards.data[n] for n in names}


def _entries(cache_dir: str) -> list[str]:
    return [n for n in os.listdir(cache_dir) if not n.endswith(".lock")]


@dataclass
class SharedRun:
    """What three spawned processes did with two shared cache directories."""

    log: Any  # the HTTP server's request log
    once: dict[str, bytes]  # phase 1: URL -> data, no size limit
    once_dir: str
    evict: dict[str, bytes]  # phase 2: URL -> data, max_bytes = two largest shards
    evict_dir: str
    max_bytes: int
    reports: list[tuple[int, str, Any]]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> SharedRun:
    """Three 'spawn' processes read the same shards through two shared caches at once.

    One run for the module: starting Python processes that import torch costs seconds each.
    """
    root = tmp_path_factory.mktemp("shared")
    paths = write_synthetic(root / "src", shards=8, samples=[11, 13, 17, 19, 23, 29, 31, 37])
    data = []
    for p in paths:
        with open(p, "rb") as f:
            data.append(f.read())
    with serving_http() as server:
        once = {server.add(f"once-{i}.tar", d): d for i, d in enumerate(data[:5])}
        evict = {server.add(f"evict-{i}.tar", d): d for i, d in enumerate(data[2:])}
        max_bytes = 2 * max(map(len, evict.values())) + 1
        once_dir, evict_dir = os.fspath(root / "once"), os.fspath(root / "evict")
        phases = [(list(once), once_dir, None), (list(evict), evict_dir, max_bytes)]
        barrier_box: list[Any] = []

        def args_of(ctx: Any, i: int) -> tuple[Any, ...]:
            if not barrier_box:
                barrier_box.append(ctx.Barrier(3))
            return (i, phases, barrier_box[0])

        reports = _run(3, _read_through_cache, args_of)
    return SharedRun(server.log, once, once_dir, evict, evict_dir, max_bytes, reports)


def test_shared_cache_downloads_each_shard_once_and_never_shows_a_torn_file(shared_run):
    for _, status, report in shared_run.reports:
        assert status == "ok", report
        assert sorted(report[0]) == sorted((u, _sha(d)) for u, d in shared_run.once.items())
    for url, data in shared_run.once.items():
        name = url.rsplit("/", 1)[1]
        gets = shared_run.log.gets(name)
        assert len(gets) == 1, f"{name} downloaded {len(gets)} times"
        assert shared_run.log.bytes_served(name) == len(data)
    expected = sorted(cache_entry_name(u) for u in shared_run.once)
    assert sorted(_entries(shared_run.once_dir)) == expected  # and no temporary file


def test_shared_cache_eviction_keeps_max_bytes_and_spares_files_being_opened(shared_run):
    for _, status, report in shared_run.reports:
        assert status == "ok", report
        # Every reader got every shard intact, though entries were evicted all along.
        assert sorted(report[1]) == sorted((u, _sha(d)) for u, d in shared_run.evict.items())
    left = _entries(shared_run.evict_dir)
    assert not [n for n in left if n.startswith(".tmp-")]
    total = sum(os.path.getsize(os.path.join(shared_run.evict_dir, n)) for n in left)
    assert total <= shared_run.max_bytes
    assert 0 < len(left) < len(shared_run.evict)  # something was evicted


def test_a_full_cache_directory_is_a_clear_error_naming_it(http_server, shards, tmp_path):
    name = shards.names[-1]
    url = http_server.add(name, shards.data[name])  # 100 KB
    cache_dir = os.fspath(tmp_path / "cache")
    ((kind, err, message),) = _run(1, _fill_a_tiny_disk, lambda ctx, i: (url, cache_dir, 10_000))
    assert (kind, err) == ("OSError", errno.EFBIG)
    assert f"cache directory {cache_dir}" in message
    assert name in message
    assert _entries(cache_dir) == []  # neither a partial entry nor a temporary file


def test_a_cut_download_is_resumed_and_cached_whole(http_server, shards, tmp_path):
    name = shards.names[-1]
    url = http_server.add(name, shards.data[name])
    faults = http_server.behaviour.faults
    faults.drop_first, faults.drop_after = 2, 30_000
    (path,) = IterableWrapper([url]).on_disk_cache(tmp_path, block_size=16384, backoff=0.01)
    with open(path, "rb") as f:
        assert f.read() == shards.data[name]
    assert sum(g.fault == "drop" for g in http_server.log.gets(name)) == 2


def test_a_failed_download_leaves_nothing_behind(http_server, tmp_path):
    url = f"{http_server.url}/missing.tar"
    with pytest.raises(MissingShardError, match=rf"^{url}: no such file"):
        list(IterableWrapper([url]).on_disk_cache(tmp_path))
    assert _entries(tmp_path) == []


def test_a_second_pass_reads_the_cache_not_the_server(http_server, shards, tmp_path):
    served = _serve(http_server, shards, shards.names[:3])
    dp = IterableWrapper(list(served)).on_disk_cache(tmp_path)
    first = list(dp)
    second = list(dp)
    assert first == second
    assert len(http_server.log.gets()) == 3
