"""Regression tests for the findings of issue 19: each failed before its fix.

- ``sharding_by_index`` followed by ``on_disk_cache`` gave every reader its whole shard;
- forked workers broke the parent's pooled HTTP connections (fsspec's aiohttp session);
- an epoch of nothing passed silently;
- ``as_node`` seeded one worker / one distributed rank differently from ``DataLoader2``.
"""

from __future__ import annotations

import collections
import os

import pytest

from _dist import run_ranks
from _graphs import id_graph, sample_id
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.fsspec import MissingShardError
from shardpipes.errors import EmptyEpochWarning
from shardpipes.index import build_index
from shardpipes.nodes import as_node
from shardpipes.storage.open import open_url
from shardpipes.synthetic import write_synthetic

# --- sharding_by_index -> on_disk_cache ------------------------------------------------------


def _cached_graph(urls, index, cache_dir, so=None):
    return (
        IterableWrapper(urls)
        .sharding_by_index(index)
        .on_disk_cache(cache_dir, storage_options=so)
        .open_files_by_fsspec(storage_options=so)
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
    )


def _ids(dp, workers):
    rs = MultiProcessingReadingService(num_workers=workers) if workers else None
    with DataLoader2(dp, reading_service=rs) as dl:
        return list(dl)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_cache_after_sharding_by_index_keeps_each_readers_range_local(tmp_path, workers):
    paths = write_synthetic(tmp_path / "src", shards=3, samples=40, payload_bytes=16)
    urls = ["file://" + p for p in paths]
    index = build_index(urls, progress=False)
    got = _ids(_cached_graph(urls, index, tmp_path / "cache"), workers)
    assert sorted(got) == list(range(120)), collections.Counter(got).most_common(3)
    # The cache holds whole shards: a second run reads the same ranges from the local copies.
    again = _ids(_cached_graph(urls, index, tmp_path / "cache"), workers)
    assert sorted(again) == list(range(120))
    assert len([n for n in os.listdir(tmp_path / "cache") if n.endswith(".tar")]) == 3


@pytest.mark.s3
def test_cache_after_sharding_by_index_keeps_each_readers_range_s3(s3, tmp_path):
    paths = write_synthetic(tmp_path / "src", shards=3, samples=40, payload_bytes=16)
    files = {os.path.basename(p): open(p, "rb").read() for p in paths}  # noqa: SIM115
    urls = s3.put("bucket", files)
    so = s3.options()
    index = build_index(urls, storage_options=so, progress=False)
    got = _ids(_cached_graph(urls, index, tmp_path / "cache", so), 2)
    assert len(got) == 120, collections.Counter(got).most_common(3)
    assert sorted(got) == list(range(120))


# --- as_node seeds every reader as DataLoader2 does ------------------------------------------


def _node_batches(pattern, seed, epochs=2, **kwargs):
    from torchdata.nodes import Loader

    loader = Loader(as_node(id_graph(pattern), seed=seed, **kwargs))
    return [[list(b) for b in loader] for _ in range(epochs)]


def _dl2_batches(pattern, seed, rs, epochs=2):
    with DataLoader2(id_graph(pattern), reading_service=rs) as dl:
        dl.seed(seed)
        return [[list(b) for b in dl] for _ in range(epochs)]


def _interleave(parts):
    """Round-robin the batches of several readers, as the worker pool delivers them."""
    out = []
    for i in range(max(len(p) for p in parts)):
        out.extend(p[i] for p in parts if i < len(p))
    return out


def test_as_node_seeds_one_worker_as_dataloader2(shard_pattern):
    want = _dl2_batches(shard_pattern, 5, MultiProcessingReadingService(num_workers=1))
    assert _node_batches(shard_pattern, 5, worker=0, num_workers=1) == want
    # ... and no workers: the path without a worker part.
    assert _node_batches(shard_pattern, 5) == _dl2_batches(shard_pattern, 5, None)


def test_as_node_seeds_two_workers_as_dataloader2(shard_pattern):
    want = _dl2_batches(shard_pattern, 5, MultiProcessingReadingService(num_workers=2))
    parts = [_node_batches(shard_pattern, 5, worker=w, num_workers=2) for w in range(2)]
    assert [_interleave([p[e] for p in parts]) for e in range(2)] == want


def _one_rank_both_ways(rank, world, pattern):
    from shardpipes.dataloader2 import DistributedReadingService

    return (
        _dl2_batches(pattern, 5, DistributedReadingService(timeout=60)),
        _node_batches(pattern, 5, timeout=60),
    )


@pytest.mark.distributed
def test_as_node_seeds_a_one_rank_distributed_run_as_dataloader2(shard_pattern):
    [(via_dl2, via_nodes)] = run_ranks(_one_rank_both_ways, 1, shard_pattern)
    assert via_nodes == via_dl2


# --- forked workers must not break the parent's HTTP connections -----------------------------


@pytest.mark.http
def test_forked_workers_leave_the_parents_http_connections_working(http_server, tmp_path):
    paths = write_synthetic(tmp_path, shards=2, samples=8, payload_bytes=16)
    urls = [http_server.add(os.path.basename(p), open(p, "rb").read()) for p in paths]  # noqa: SIM115
    missing = f"{http_server.url}/missing.tar"
    # The main process reads first: its HTTP filesystem holds a pooled connection.
    assert len(list(IterableWrapper(urls[:1]).open_files_by_fsspec().load_from_tar())) == 8 * 3
    dp = IterableWrapper(urls).sharding_filter().open_files_by_fsspec().load_from_tar()
    rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork")
    with DataLoader2(dp, reading_service=rs) as dl:
        assert len(list(dl)) == 2 * 8 * 3
    before = len(http_server.log.records)
    # A lost connection would hang until the 3 s request time-out: a ShardReadError about the
    # time-out, not MissingShardError.
    with pytest.raises(MissingShardError, match="missing.tar"):
        open_url(missing, timeout=3, retries=0).read(1)
    seen = [r.path for r in http_server.log.records[before:]]
    assert "/missing.tar" in seen, seen


# --- an epoch of nothing warns ---------------------------------------------------------------


def _swallowing(sample):
    """A map written for torchdata 0.9's streams: every error becomes None."""
    try:
        return sample[".missing"]
    except KeyError:
        return None


def _swallowed_graph(pattern):
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(_swallowing)
        .filter(_is_not_none)
    )


def _is_not_none(x):
    return x is not None


TOTAL = 11 + 13 + 17 + 19 + 23 + 29 + 31


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_an_epoch_whose_filter_drops_everything_warns_naming_it(shard_pattern, workers):
    rs = MultiProcessingReadingService(num_workers=workers) if workers else None
    with DataLoader2(_swallowed_graph(shard_pattern), reading_service=rs) as dl:
        with pytest.warns(EmptyEpochWarning, match=f"filter received {TOTAL} items") as got:
            assert list(dl) == []
    assert len([w for w in got if issubclass(w.category, EmptyEpochWarning)]) == 1


def _broken(data):
    raise ValueError("no")


def test_a_handler_that_skips_every_sample_is_named(shard_pattern):
    dp = (
        IterableWrapper([shard_pattern])
        .shard_expand()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode(decoders={"bin": _broken}, handler="skip")
    )
    with DataLoader2(dp) as dl:
        with pytest.warns(
            EmptyEpochWarning, match=f"decode received {TOTAL} items and skipped all of them"
        ):
            assert list(dl) == []


def test_an_empty_source_warns():
    with DataLoader2(IterableWrapper([]).map(str)) as dl:
        with pytest.warns(EmptyEpochWarning, match="epoch 0 yielded no items.*IterableWrapper"):
            assert list(dl) == []


def test_a_stage_that_drops_all_it_received_warns_even_if_others_yield():
    dp = IterableWrapper(range(10)).filter(_is_negative).concat(IterableWrapper([7]))
    with DataLoader2(dp) as dl:
        with pytest.warns(EmptyEpochWarning, match="filter received 10 items and dropped all"):
            assert list(dl) == [7]


def _is_negative(x):
    return x < 0


def test_the_nodes_path_warns_too():
    from torchdata.nodes import Loader

    with pytest.warns(EmptyEpochWarning, match="filter received 10 items"):
        assert list(Loader(as_node(IterableWrapper(range(10)).filter(_is_negative)))) == []


def test_an_epoch_with_items_does_not_warn(shard_pattern):
    with DataLoader2(IterableWrapper(range(10)).filter(bool)) as dl:
        assert list(dl) == list(range(1, 10))  # ShardpipesWarning is an error in tests


# --- found by the guarantee matrix: prefetch finalised on another thread must not join ------


def test_prefetch_closed_from_another_thread_does_not_wait_for_its_producer():
    """The garbage collector may finalise an abandoned prefetch in any thread, even fsspec's
    event-loop thread, which the producer (reading a remote shard) waits on: joining the
    producer there deadlocked the matrix (prefetch + HTTP/S3 + an abandoned epoch)."""
    import threading

    release = threading.Event()
    closed = threading.Event()

    def source():
        yield 1
        release.wait()  # the producer is busy, as one waiting on the event loop would be
        yield 2

    it = iter(IterableWrapper(_Source(source)).prefetch(1))
    assert next(it) == 1
    closer = threading.Thread(target=lambda: (it.close(), closed.set()), daemon=True)
    closer.start()
    try:
        assert closed.wait(30), "close() from another thread waited for the busy producer"
    finally:
        release.set()


class _Source:
    def __init__(self, fn):
        self.fn = fn

    def __iter__(self):
        return self.fn()
