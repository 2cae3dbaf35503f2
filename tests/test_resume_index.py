"""Exact resume with a shard index: seeking instead of replaying, and elastic resume (R x W -> R' x W')."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest

from _dist import run_ranks
from _graphs import indexed_graph, resumed, sample_id, uninterrupted
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic

COUNTS = [37, 20, 51, 8, 44]  # 160 samples, uneven shards


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("indexed")
    paths = write_synthetic(folder, shards=len(COUNTS), samples=COUNTS, payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))
    return f"{folder}/train-{{000000..{len(COUNTS) - 1:06d}}}.tar"


def mp(workers: int) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_indexed_resume_continues_batch_for_batch(indexed, workers):
    batches, states = uninterrupted(indexed_graph(indexed), mp(workers))
    per_epoch = len(batches) // 2
    assert per_epoch == 40  # 160 samples in batches of 4
    # start, middle, last batch of epoch 0, epoch boundary, middle of epoch 1
    for k in (0, per_epoch // 2, per_epoch - 1, per_epoch, per_epoch + per_epoch // 3):
        assert states[k]["segments"] == [] and states[k]["skipped"] == 0
        rest = batches[k:]
        got = resumed(indexed_graph(indexed), mp(workers), states[k], len(rest))
        assert got == rest, f"resume after {k} batches diverged"
    # No samples, no buffer in the state: its position, and what it is bound to (~300 bytes).
    assert len(pickle.dumps(states[per_epoch // 2])) < 900


READS: Counter = Counter()


def counted(sample):
    READS[sample["__key__"]] += 1
    return sample


def test_indexed_resume_seeks_instead_of_replaying(indexed):
    """The resumed epoch reads only the samples it has yet to yield (plus those that were sitting
    in the shuffle buffer), however far the epoch had got."""

    def graph():
        return (
            IterableWrapper([indexed]).shard_expand().shuffle().sharding_by_index()
            .open_files_by_fsspec().load_from_tar().webdataset().map(counted)
            .decode().map(sample_id).shuffle(buffer_size=16).batch(4)
        )  # fmt: skip

    batches, states = uninterrupted(graph(), mp(0), epochs=1)
    for k in (1, 20, 39):
        READS.clear()
        got = resumed(graph(), mp(0), states[k], 40 - k)
        assert got == batches[k:]
        assert sum(READS.values()) == 160 - 4 * k  # a replay would read all 160 again
        assert max(READS.values()) == 1


def epoch_ids(batches):
    return [x for b in batches for x in b]


@pytest.mark.parametrize(("before", "after"), [(2, 0), (2, 3), (0, 2)])
def test_elastic_resume_between_worker_counts(indexed, before, after):
    batches, states = uninterrupted(indexed_graph(indexed), mp(before), epochs=1)
    k = 13
    state = states[k]
    with DataLoader2(indexed_graph(indexed), reading_service=mp(after)) as dl:
        dl.load_state_dict(state)
        assert dl.state_dict()["segments"] == [[1, before, 0, k]]
        rest = [list(b) for b in dl]
        next_epoch = [list(b) for b in dl]
    seen = Counter(epoch_ids(batches[:k]) + epoch_ids(rest))
    assert seen == Counter(epoch_ids(batches))  # the epoch's samples, each exactly once
    # Later epochs are those of the new configuration, as if it had run from the start.
    fresh, _ = uninterrupted(indexed_graph(indexed), mp(after), epochs=2)
    assert next_epoch == fresh[len(fresh) // 2 :]


def test_elastic_resume_needs_an_index_and_no_skips(indexed, shard_pattern):
    from _graphs import id_graph

    _, states = uninterrupted(id_graph(shard_pattern), mp(2), epochs=1)
    with pytest.raises(ValueError, match=r"1 rank\(s\) x 2 worker\(s\).*sharding_by_index"):
        DataLoader2(id_graph(shard_pattern), reading_service=mp(0)).load_state_dict(states[3])
    _, states = uninterrupted(indexed_graph(indexed), mp(2), epochs=1)
    with pytest.raises(ValueError, match="handlers skipped 2 samples or shards"):
        DataLoader2(indexed_graph(indexed), reading_service=mp(0)).load_state_dict(
            {**states[3], "skipped": 2}
        )
    # The same topology with skips falls back to replay, which reproduces them exactly.
    dl = DataLoader2(indexed_graph(indexed), reading_service=mp(2))
    dl.load_state_dict({**states[3], "skipped": 2})
    assert dl.state_dict()["consumed"] == 3
    dl.shutdown()


def dist_rs(workers: int):
    return SequentialReadingService(DistributedReadingService(timeout=60), mp(workers))


def rank_first_part(rank, world, pattern, k):
    """2 ranks x 2 workers: the whole epoch, and a run stopped after k batches with its state."""
    full, _ = uninterrupted(indexed_graph(pattern), dist_rs(2), epochs=1)
    with DataLoader2(indexed_graph(pattern), reading_service=dist_rs(2)) as dl:
        dl.seed(3)
        it = iter(dl)
        part = [list(next(it)) for _ in range(k)]
        state = dl.state_dict()
    same = resumed(indexed_graph(pattern), dist_rs(2), state, len(full) - k)
    return full, part, state, same


def rank_rest(rank, world, pattern, state):
    """3 ranks x 1 worker: the rest of the epoch from the saved state, then the next epoch."""
    with DataLoader2(indexed_graph(pattern), reading_service=dist_rs(1)) as dl:
        dl.load_state_dict(state)
        rest = [list(b) for b in dl]
        next_epoch = [list(b) for b in dl]
    fresh, _ = uninterrupted(indexed_graph(pattern), dist_rs(1), epochs=2)
    return rest, next_epoch, fresh[len(fresh) // 2 :]


@pytest.mark.distributed
def test_distributed_resume_same_and_elastic_from_2x2_to_3x1(indexed):
    k = 7
    first = run_ranks(rank_first_part, 2, indexed, k)
    for full, part, _, same in first:  # the same topology seeks to exactly the rest, per rank
        assert part == full[:k] and same == full[k:]
    first = [(full, part, state) for full, part, state, _ in first]
    states = [state for _, _, state in first]
    # Every rank saves the same position; the binding names the rank that saved it.
    assert [s["binding"].pop("rank") for s in states] == [0, 1]
    assert states[0] == states[1]
    assert states[0]["consumed"] == k
    second = run_ranks(rank_rest, 3, indexed, states[0])
    # Equal batch counts on the new ranks (no DDP hang), and the rest of the epoch is exactly
    # the samples not yet yielded: none twice, none skipped.
    assert len({len(rest) for rest, _, _ in second}) == 1
    epoch = Counter(x for full, _, _ in first for x in epoch_ids(full))
    before = Counter(x for _, part, _ in first for x in epoch_ids(part))
    after = Counter(x for rest, _, _ in second for x in epoch_ids(rest))
    assert before + after == epoch
    assert max(epoch.values()) == 1
    # The next epoch is the new configuration's own, deterministic epoch.
    for _, next_epoch, fresh in second:
        assert next_epoch == fresh and next_epoch


@pytest.mark.s3
def test_indexed_resume_from_s3_continues_batch_for_batch(s3, shards):
    """Over S3 (sparse reads of the shuffle buffer through cat_ranges), the resumed run is
    batch for batch the uninterrupted one."""
    urls = s3.put("data", shards.data)
    opts = s3.options()
    build_index(urls, storage_options=opts, progress=False).save(
        default_index_url(urls), storage_options=opts
    )

    def graph():
        return (
            IterableWrapper(urls).shuffle().sharding_by_index(storage_options=opts)
            .open_files_by_fsspec(storage_options=opts).load_from_tar().webdataset().decode()
            .map(sample_id).shuffle(buffer_size=32).batch(4)
        )  # fmt: skip

    batches, states = uninterrupted(graph(), mp(0), epochs=1)
    k = len(batches) // 2
    assert resumed(graph(), mp(0), states[k], len(batches) - k) == batches[k:]


@pytest.mark.s3
def test_sparse_range_reads_exactly_the_chosen_samples(s3, shards):
    from shardpipes.formats.tarparse import iter_tar
    from shardpipes.index import index_shard, open_range

    name = shards.names[0]
    local = f"{shards.directory}/{name}"
    (remote,) = s3.put("data", {name: shards.data[name]})
    info = index_shard(local)
    chosen = [0, 2, 3, 7, 7, info.num_samples - 1]  # adjacent, gaps, a repeat, the last
    spans = [info.byte_range(i, i + 1) for i in chosen]
    size = sum(n for _, n in spans)
    for url, opts in ((local, None), (remote, s3.options())):
        with open_range(url, spans[0][0], size, opts, spans=spans) as f:
            keys = [e.name.split(".")[0] for e in iter_tar(f, url, require_end=False)]
        assert list(dict.fromkeys(keys)) == [info.keys[i] for i in dict.fromkeys(chosen)]
        assert len(keys) == len(chosen) * 3  # three members per sample, the repeat included


def test_a_state_between_epochs_loads_under_any_topology(shard_pattern):
    """Nothing of the next epoch was consumed, so no index is needed to change R or W there."""
    from _graphs import id_graph

    batches, states = uninterrupted(id_graph(shard_pattern), mp(2), epochs=1)
    boundary = states[len(batches)]
    assert boundary["consumed"] == 0 and boundary["epoch"] == 1
    fresh, _ = uninterrupted(id_graph(shard_pattern), mp(0), epochs=2)
    second = fresh[len(fresh) // 2 :]
    assert resumed(id_graph(shard_pattern), mp(0), boundary, len(second)) == second


@pytest.mark.s3
def test_index_reads_retry_transient_errors_and_fail_permanent_ones(s3, fault_proxy, shards):
    """Contiguous and sparse index reads are retried whole after 503s and cut connections (the
    same samples come back), and a 403 fails at once naming the URL, never the secret."""
    from servers import DUMMY_SECRET
    from shardpipes.datapipes.iter.fsspec import ForbiddenShardError
    from shardpipes.formats.tarparse import iter_tar
    from shardpipes.index import index_shard, open_range

    name = shards.names[2]
    (url,) = s3.put("flaky", {name: shards.data[name]})
    info = index_shard(f"{shards.directory}/{name}")
    proxy = fault_proxy(s3.endpoint)
    # botocore retries on its own; leave the retrying to us so the faults reach our loop.
    opts = s3.options(proxy.url, config_kwargs={"retries": {"total_max_attempts": 1}})

    def names(**kw):
        with open_range(url, kw.pop("offset"), kw.pop("size"), opts, backoff=0.01, **kw) as f:
            return [e.name for e in iter_tar(f, url, require_end=False)]

    offset, size = info.byte_range(1, 4)
    expected = [f"{info.keys[i]}.{ext}" for i in range(1, 4) for ext in ("cls", "json", "bin")]
    proxy.set_faults(match=name, fail_first=2, fail_status=503)
    assert names(offset=offset, size=size) == expected
    assert [g.fault for g in proxy.log.gets(name)] == ["fail", "fail", None]
    proxy.set_faults(match=name, drop_first=2, drop_after=100)
    assert names(offset=offset, size=size) == expected
    spans = [info.byte_range(i, i + 1) for i in (0, 5)]
    proxy.set_faults(match=name, fail_first=1, fail_status=503)
    assert len(names(offset=spans[0][0], size=sum(n for _, n in spans), spans=spans)) == 6
    proxy.set_faults(match=name, fail_first=1, fail_status=403)
    with pytest.raises(ForbiddenShardError, match=rf"^{url}") as err:
        names(offset=offset, size=size)
    assert DUMMY_SECRET not in str(err.value)


def test_main_process_stages_do_not_hide_the_resume_shape(indexed):
    """The loader's own graph (pool, main-process prefetch, pin_memory) still seeks."""
    from shardpipes.dataloader2.graph import resume_shape

    rs = MultiProcessingReadingService(num_workers=2, main_prefetch_cnt=2, pin_memory=True)
    with DataLoader2(indexed_graph(indexed).pin_memory(), reading_service=rs) as dl:
        iter(dl)  # builds the loader's graph
        found = resume_shape(dl._graph)
    assert not isinstance(found, str), found
    assert found[0].batch_size == 4 and found[0].buffer_size == 16
