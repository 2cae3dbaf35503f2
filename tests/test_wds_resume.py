"""A ``shardpipes.webdataset`` pipeline over an indexed dataset resumes like a DataPipe graph.

Its shuffle, batching, decoding and per-sample stages are core stages, so with a shard index the
loader knows each reader's length and resumes by seeking: the state after k batches continues
with batch k + 1 exactly, on the same topology or (the rest of the epoch, none twice, none
missing) on another one. What it cannot see into (a user's iterator function) is replayed on
the same topology and refused on another, at ``load_state_dict``.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest

import shardpipes.webdataset as wds
from _dist import run_ranks
from _graphs import resumed, uninterrupted
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.graph import resume_shape
from shardpipes.index import build_index, default_index_url
from shardpipes.plan.seeds import buffered_shuffle
from shardpipes.synthetic import write_synthetic
from shardpipes.webdataset import filters

COUNTS = [37, 20, 51, 8, 44]  # 160 samples, uneven shards
PER_EPOCH = 40  # batches of 4


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("wds-indexed")
    paths = write_synthetic(folder, shards=len(COUNTS), samples=COUNTS, payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))
    return f"{folder}/train-{{000000..{len(COUNTS) - 1:06d}}}.tar"


def json_id(meta):
    return int(meta["id"])


def ids(batch):
    """The sample ids of a batch ``(ids, labels)`` collated by webdataset's default collation."""
    return [int(x) for x in batch[0]]


def same(ds):
    return ds


def dataset(pattern, middle=same):
    """webdataset's usual chain: shard shuffle, sample shuffle, decode, rename, map_dict, to_tuple, map, batched."""
    ds = (
        wds.WebDataset(pattern, shardshuffle=100)
        .shuffle(16)
        .decode()
        .rename(meta="json", label="cls")
        .map_dict(meta=json_id)
        .to_tuple("meta", "label")
    )
    return middle(ds).batched(4)


def mp(workers: int) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")


def as_ids(batches):
    return [ids(b) for b in batches]


def flat(id_batches):
    return [x for b in id_batches for x in b]


def epoch_ids(batches):
    return [x for b in batches for x in ids(b)]


def test_the_pipeline_is_seen_through_by_the_loader(indexed):
    found = resume_shape(dataset(indexed))
    assert not isinstance(found, str), found
    shape, shuffler = found
    assert (shape.batch_size, shape.drop_last, shape.buffer_size) == (4, False, 16)
    assert type(shuffler).__name__ == "Shuffle"  # the sample shuffle, not the shard shuffle


def test_the_shuffle_is_the_counter_based_core_shuffle():
    got = list(filters.shuffle_iter(range(50), 8, 2, random.Random(1)))
    assert got == list(buffered_shuffle(range(50), random.Random(1).getrandbits(63), 8))
    assert sorted(got) == list(range(50)) and got != list(range(50))
    # seeded: the same order every iteration, as in webdataset
    ds = wds.DataPipeline(wds.SimpleShardList([f"s{i}" for i in range(50)]), wds.shuffle(8, seed=5))
    assert list(ds) == list(ds) != list(wds.SimpleShardList([f"s{i}" for i in range(50)]))


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_resume_continues_batch_for_batch(indexed, workers):
    batches, states = uninterrupted(dataset(indexed), mp(workers))
    batches = as_ids(batches)
    assert len(batches) == 2 * PER_EPOCH
    assert sorted(x for b in batches[:PER_EPOCH] for x in b) == list(range(160))  # each once
    for k in (0, 1, PER_EPOCH // 2, PER_EPOCH - 1, PER_EPOCH, PER_EPOCH + PER_EPOCH // 3):
        assert states[k]["segments"] == [] and states[k]["skipped"] == 0
        rest = batches[k:]
        got = as_ids(resumed(dataset(indexed), mp(workers), states[k], len(rest)))
        assert got == rest, f"resume after {k} batches diverged"
    assert len(pickle.dumps(states[PER_EPOCH // 2])) < 900  # a position and its binding, no samples


def test_the_key_pattern_stages_and_info_are_one_to_one_too(indexed):
    def graph():
        return (
            wds.WebDataset(indexed, shardshuffle=100)
            .shuffle(16)
            .decode()
            .rename_keys(meta="json", lab="cls")
            .xdecode(must_decode=False)
            .compose(wds.info(n=0))  # passes every sample through
            .extract_keys("meta", "lab")
            .map_tuple(json_id)
            .batched(4)
        )

    assert not isinstance(resume_shape(graph()), str)
    batches, states = uninterrupted(graph(), mp(0), epochs=1)
    assert sorted(epoch_ids(batches)) == list(range(160))
    k = 11
    assert as_ids(resumed(graph(), mp(0), states[k], PER_EPOCH - k)) == as_ids(batches[k:])


READS: Counter = Counter()


def counted(sample):
    READS[sample["__key__"]] += 1
    return sample


def test_resume_seeks_instead_of_replaying(indexed):
    def graph():
        return (
            wds.WebDataset(indexed, shardshuffle=100)
            .map(counted)
            .shuffle(16)
            .decode()
            .to_tuple("json", "cls")
            .map_tuple(json_id)
            .batched(4)
        )

    batches, states = uninterrupted(graph(), mp(0), epochs=1)
    for k in (1, 20, 39):
        READS.clear()
        got = resumed(graph(), mp(0), states[k], PER_EPOCH - k)
        assert as_ids(got) == as_ids(batches[k:])
        assert sum(READS.values()) == 160 - 4 * k  # a replay would read all 160 again
        assert max(READS.values()) == 1


@pytest.mark.parametrize(("before", "after"), [(2, 3), (2, 0), (0, 2)])
def test_elastic_resume_between_worker_counts(indexed, before, after):
    batches, states = uninterrupted(dataset(indexed), mp(before), epochs=1)
    k = 13
    with DataLoader2(dataset(indexed), reading_service=mp(after)) as dl:
        dl.load_state_dict(states[k])
        assert dl.state_dict()["segments"] == [[1, before, 0, k]]
        rest = list(dl)
    seen = Counter(epoch_ids(batches[:k]) + epoch_ids(rest))
    assert seen == Counter(range(160))  # the rest of the epoch: none twice, none missing


def webloader(pattern, workers):
    return wds.WebLoader(
        dataset(pattern), batch_size=None, num_workers=workers, multiprocessing_context="fork"
    )


def part_and_state(loader, k):
    """The first k batches of the loader's next epoch, its state then, and the rest of the epoch."""
    it = iter(loader)
    part = [ids(next(it)) for _ in range(k)]
    state = loader.state_dict()
    return part, state, [ids(b) for b in it]


def test_webloader_state_resumes_by_seeking_and_elastically(indexed):
    loader = webloader(indexed, 2)
    try:
        full = [ids(b) for b in loader]
        part, state, rest_of_1 = part_and_state(loader, 9)  # epoch 1, after 9 batches
    finally:
        loader.shutdown()
    assert len(full) == PER_EPOCH and state["epoch"] == 1 and state["consumed"] == 9
    again = webloader(indexed, 2)
    try:
        again.load_state_dict(state)
        assert [ids(b) for b in again] == rest_of_1  # the same topology: batch for batch
    finally:
        again.shutdown()
    other = webloader(indexed, 3)
    try:
        other.load_state_dict(state)
        rest = [ids(b) for b in other]
    finally:
        other.shutdown()
    assert Counter(flat(part + rest)) == Counter(range(160))


def test_webloader_stages_after_the_pool_are_refused_at_load_state_dict(indexed):
    """A checkpoint can still be written (Lightning writes the loader's state), but it says the
    position cannot be named, and loading it is refused: never a resume at the wrong place."""
    from shardpipes.errors import ShardpipesWarning

    loader = webloader(indexed, 0).unbatched().shuffle(10).batched(4)
    with pytest.warns(ShardpipesWarning, match="stages after the worker pool"):
        state = loader.state_dict()
    with pytest.raises(ValueError, match=r"cannot resume: .*put them on the dataset"):
        webloader(indexed, 0).load_state_dict(state)
    plain_state = webloader(indexed, 0).state_dict()
    with pytest.raises(ValueError, match="stages after the worker pool"):
        webloader(indexed, 0).with_epoch(5).load_state_dict(plain_state)


def passthrough(src):
    """An opaque webdataset stage function: the loader cannot see what it does."""
    yield from src


def is_even(t):
    return t[0] % 2 == 0


def none_for_odd(t):
    return t if t[0] % 2 == 0 else None


@pytest.mark.parametrize(
    "middle",
    [
        lambda ds: ds.compose(passthrough),
        lambda ds: ds.select(is_even),
        lambda ds: ds.rsample(0.5),
        lambda ds: ds.batched(3, collation_fn=None).unbatched(),
    ],
    ids=["compose", "select", "rsample", "unbatched"],
)
def test_what_cannot_seek_replays_on_the_same_topology_and_is_refused_on_another(indexed, middle):
    def graph():
        return dataset(indexed, middle)

    assert isinstance(resume_shape(graph()), str)
    batches, states = uninterrupted(graph(), mp(2), epochs=1)
    k = len(batches) // 2
    assert as_ids(resumed(graph(), mp(2), states[k], len(batches) - k)) == as_ids(batches[k:])
    with pytest.raises(ValueError, match=r"1 rank\(s\) x 2 worker\(s\).*cannot"):
        DataLoader2(graph(), reading_service=mp(3)).load_state_dict(states[k])


def test_a_map_that_drops_samples_counts_them_so_the_loader_never_seeks_past_them(indexed):
    def graph():
        return (
            wds.WebDataset(indexed, shardshuffle=100)
            .decode()
            .to_tuple("json", "cls")
            .map_tuple(json_id)
            .map(none_for_odd)  # webdataset drops a sample whose map returns None
            .batched(4)
        )

    assert not isinstance(resume_shape(graph()), str)  # one-to-one unless it drops
    batches, states = uninterrupted(graph(), mp(0), epochs=1)
    assert sorted(epoch_ids(batches)) == list(range(0, 160, 2))
    k = 7
    assert states[k]["skipped"] > 0
    # the same topology replays, exactly; another one is refused, naming the skips
    assert as_ids(resumed(graph(), mp(0), states[k], len(batches) - k)) == as_ids(batches[k:])
    with pytest.raises(ValueError, match="handlers skipped"):
        DataLoader2(graph(), reading_service=mp(2)).load_state_dict(states[k])


def rank_first_part(rank, world, pattern, k):
    """2 ranks x 2 workers (WebLoader under gloo): the whole epoch, then k batches and the state."""
    loader = webloader(pattern, 2)
    try:
        full = [ids(b) for b in loader]
        part, state, rest = part_and_state(loader, k)
    finally:
        loader.shutdown()
    again = webloader(pattern, 2)
    try:
        again.load_state_dict(state)
        same = [ids(b) for b in again]
    finally:
        again.shutdown()
    return full, part, state, same, part + rest


def rank_rest(rank, world, pattern, state):
    """1 rank x 3 workers: the rest of the epoch from the saved state."""
    loader = webloader(pattern, 3)
    try:
        loader.load_state_dict(state)
        segments = loader.state_dict()["segments"]
        return segments, [ids(b) for b in loader]
    finally:
        loader.shutdown()


@pytest.mark.distributed
def test_distributed_resume_same_and_elastic_from_2x2_to_1x3(indexed):
    k = 5
    first_run = run_ranks(rank_first_part, 2, indexed, k)
    states = [state for _, _, state, _, _ in first_run]
    # Every rank saves the same position; the binding names the rank that saved it.
    assert [s["binding"].pop("rank") for s in states] == [0, 1]
    assert states[0] == states[1] and states[0]["epoch"] == 1 and states[0]["consumed"] == k
    for full, part, _, same, second in first_run:
        assert len(full) == len(first_run[0][0])  # equal batch counts on the ranks
        assert part + same == second  # the same topology seeks to exactly the rest, per rank
    epoch = Counter(x for _, _, _, _, second in first_run for x in flat(second))
    assert epoch == Counter(range(160))
    ((segments, rest),) = run_ranks(rank_rest, 1, indexed, states[0])
    assert segments == [[2, 2, 1, k]]  # an elastic resume (by seeking), not a replay
    before = Counter(x for _, part, _, _, _ in first_run for x in flat(part))
    assert before + Counter(flat(rest)) == epoch  # none twice, none missing
