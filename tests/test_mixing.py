"""Mixtures: 0.9's SampleMultiplexer under the loader, and the plan-based mixture (docs/mixing.md)."""

from __future__ import annotations

import collections
import json
import pickle
from typing import Any

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper, SampleMultiplexer
from shardpipes.index import build_index
from shardpipes.synthetic import write_synthetic

A_COUNTS = [7, 9, 11, 5]  # 32 samples
B_COUNTS = [6, 4, 8]  # 18 samples


def tag(name: str):
    return _Tag(name)


class _Tag:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: dict[str, Any]) -> str:
        return f"{self.name}{json.loads(bytes(sample['.json']))['id']}"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[list[str], Any]]:
    out = {}
    for name, counts in (("a", A_COUNTS), ("b", B_COUNTS)):
        d = tmp_path_factory.mktemp(f"mix-{name}")
        paths = write_synthetic(d, shards=len(counts), samples=counts, payload_bytes=8)
        out[name] = (paths, build_index(paths, progress=False))
    return out


def source(sources, name: str) -> Any:
    urls, index = sources[name]
    return (
        IterableWrapper(urls)
        .shuffle()
        .sharding_by_index(index)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(tag(name))
    )


def _mp(workers: int) -> Any:
    return (
        MultiProcessingReadingService(workers, multiprocessing_context="fork") if workers else None
    )


def _epoch(dp: Any, workers: int, seed: int = 3) -> list[list[str]]:
    with DataLoader2(dp, reading_service=_mp(workers)) as dl:
        dl.seed(seed)
        return [list(b) for b in dl]


# --- 0.9's SampleMultiplexer ----------------------------------------------------------------------


def multiplexed(sources) -> Any:
    return SampleMultiplexer({source(sources, "a"): 0.7, source(sources, "b"): 0.3}).batch(4)


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
def test_sample_multiplexer_same_seed_same_order(sources, workers):
    first = _epoch(multiplexed(sources), workers)
    assert first == _epoch(multiplexed(sources), workers)
    assert first != _epoch(multiplexed(sources), workers, seed=4)
    flat = collections.Counter(x for b in first for x in b)
    assert len(flat) == sum(A_COUNTS) + sum(B_COUNTS) and set(flat.values()) == {1}


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_sample_multiplexer_resumes_exactly_on_the_same_topology(sources, workers, k):
    with DataLoader2(multiplexed(sources), reading_service=_mp(workers)) as dl:
        dl.seed(3)
        first = [list(b) for b in dl]
        second = [list(b) for b in dl]
    with DataLoader2(multiplexed(sources), reading_service=_mp(workers)) as dl:
        dl.seed(3)
        it = iter(dl)
        head = [list(next(it)) for _ in range(k)]
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    assert head == first[:k]
    with DataLoader2(multiplexed(sources), reading_service=_mp(workers)) as dl:
        dl.load_state_dict(state)
        assert [list(b) for b in dl] == first[k:]
        assert [list(b) for b in dl] == second  # the next epoch too


def test_sample_multiplexer_refuses_another_topology(sources):
    with DataLoader2(multiplexed(sources), reading_service=_mp(2)) as dl:
        dl.seed(3)
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    with DataLoader2(multiplexed(sources), reading_service=_mp(1)) as dl:
        with pytest.raises(
            ValueError, match=r"saved with 1 rank\(s\) x 2 worker\(s\).*SampleMultiplexer"
        ):
            dl.load_state_dict(state)


# --- mix(): the mixture in the plan ---------------------------------------------------------------

C_COUNTS = [3, 2]  # 5 samples


@pytest.fixture(scope="module")
def three(sources, tmp_path_factory) -> dict[str, tuple[list[str], Any]]:
    d = tmp_path_factory.mktemp("mix-c")
    paths = write_synthetic(d, shards=len(C_COUNTS), samples=C_COUNTS, payload_bytes=8)
    return {**sources, "c": (paths, build_index(paths, progress=False))}


def mixed(three, batch: int = 4, **kwargs: Any) -> Any:
    kwargs = kwargs or {"repeat": [1, 2, None], "choose": [None, None, 4]}
    names = list(kwargs.pop("names", ["a", "b", "c"]))
    dp = source(three, names[0]).mix(*(source(three, n) for n in names[1:]), names=names, **kwargs)
    return dp.batch(batch)


def flat(batches: list[list[str]]) -> collections.Counter[str]:
    return collections.Counter(x for b in batches for x in b)


def by_source(counter: collections.Counter[str]) -> dict[str, int]:
    out: dict[str, int] = collections.defaultdict(int)
    for x, n in counter.items():
        out[x[0]] += n
    return dict(out)


@pytest.mark.parametrize("workers", [0, 2, 3], ids=["inproc", "mp2", "mp3"])
def test_mix_same_seed_same_batches_and_exact_proportions(three, workers):
    first = _epoch(mixed(three), workers)
    assert first == _epoch(mixed(three), workers)
    assert first != _epoch(mixed(three), workers, seed=4)
    got = flat(first)
    readers = max(workers, 1)
    # a (repeat 1): every sample exactly once; b twice; c 4 of 5; < readers left out, not from a
    assert {x for x in got if x[0] == "a"} == {f"a{i}" for i in range(32)}
    assert all(n == 1 for x, n in got.items() if x[0] == "a")
    assert all(n <= 2 for x, n in got.items() if x[0] == "b")
    wanted = {"a": 32, "b": 36, "c": 4}
    lost = sum(wanted.values()) - sum(got.values())
    assert 0 <= lost < readers and by_source(got)["a"] == 32, by_source(got)


def _head(dp: Any, rs: Any, k: int, seed: int = 3) -> tuple[list[list[str]], dict[str, Any]]:
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.seed(seed)
        it = iter(dl)
        head = [list(next(it)) for _ in range(k)]
        return head, pickle.loads(pickle.dumps(dl.state_dict()))


def _tail(dp: Any, rs: Any, state: dict[str, Any], epochs: int = 1) -> list[list[list[str]]]:
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.load_state_dict(state)
        return [[list(b) for b in dl] for _ in range(epochs)]


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
@pytest.mark.parametrize("k", [1, 5, 11])
def test_mix_resumes_exactly_on_the_same_topology(three, workers, k):
    with DataLoader2(mixed(three), reading_service=_mp(workers)) as dl:
        dl.seed(3)
        first, second = [list(b) for b in dl], [list(b) for b in dl]
    head, state = _head(mixed(three), _mp(workers), k)
    assert head == first[:k]
    rest, nxt = _tail(mixed(three), _mp(workers), state, epochs=2)
    assert rest == first[k:] and nxt == second


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 0), (2, 3), (0, 2)])
def test_mix_elastic_resume_reads_exactly_the_rest(three, before, after):
    full = flat(_epoch(mixed(three), before))
    head, state = _head(mixed(three), _mp(before), 5)
    (tail,) = _tail(mixed(three), _mp(after), state)
    got = flat(head) + flat(tail)
    assert not (got - full), got - full  # nothing twice that was not twice in the plan
    missing = full - got
    assert sum(missing.values()) < max(after, 1), missing  # left out to keep readers equal
    assert all(n == 1 for x, n in got.items() if x[0] == "a")
    assert {x for x in got if x[0] == "a"} == {f"a{i}" for i in range(32)}


def test_mix_second_resume_and_next_epoch(three):
    """2 workers -> 1 worker -> 3 workers in one epoch, then the next epoch as the new topology plans it."""
    full = flat(_epoch(mixed(three), 2))
    head, state = _head(mixed(three), _mp(2), 3)
    with DataLoader2(mixed(three), reading_service=_mp(1)) as dl:
        dl.load_state_dict(state)
        it = iter(dl)
        middle = [list(next(it)) for _ in range(4)]
        state2 = pickle.loads(pickle.dumps(dl.state_dict()))
    tail, nxt = _tail(mixed(three), _mp(3), state2, epochs=2)
    got = flat(head) + flat(middle) + flat(tail)
    assert not (got - full) and sum((full - got).values()) < 3
    assert {x for x in got if x[0] == "a"} == {f"a{i}" for i in range(32)}
    with DataLoader2(mixed(three), reading_service=_mp(3)) as dl:
        dl.seed(3)
        [list(b) for b in dl]
        assert nxt == [list(b) for b in dl]


SCHEDULE = [(0, [0.9, 0.1]), (6, [0.1, 0.9])]  # steps of 4 samples


def test_mix_schedule_changes_the_composition_at_its_step(three):
    dp = mixed(three, names=["a", "b"], schedule=SCHEDULE, step_samples=4)
    batches = _epoch(dp, 0)
    assert len(batches) == 50 // 4 + 1
    before = by_source(flat(batches[:6]))
    after = by_source(flat(batches[6:12]))
    assert before.get("a", 0) >= 19 and after.get("b", 0) >= 19, (before, after)
    assert batches == _epoch(mixed(three, names=["a", "b"], schedule=SCHEDULE, step_samples=4), 0)


@pytest.mark.parametrize(("before", "after", "k"), [(2, 1, 2), (0, 3, 5), (2, 3, 4)])
def test_mix_schedule_elastic_resume_across_the_change_point(three, before, after, k):
    def graph() -> Any:
        return mixed(three, names=["a", "b"], schedule=SCHEDULE, step_samples=4)

    full = flat(_epoch(graph(), before))
    head, state = _head(graph(), _mp(before), k)
    (tail,) = _tail(graph(), _mp(after), state)
    got = flat(head) + flat(tail)
    assert not (got - full), got - full
    assert sum((full - got).values()) < max(after, 1)


def test_mix_refuses_a_state_whose_source_changed(three, tmp_path):
    _, state = _head(mixed(three), None, 2)
    paths, _ = three["b"]
    extra = write_synthetic(tmp_path, shards=1, samples=[3], payload_bytes=8)
    bigger = dict(three)
    urls = [*paths, *extra]
    bigger["b"] = (urls, build_index(urls, progress=False))
    with DataLoader2(mixed(bigger), reading_service=None) as dl:
        with pytest.raises(
            ValueError,
            match=r"mix\(\) source 'b' changed.*3 shards and 18 samples.*4 shards and 21",
        ):
            dl.load_state_dict(state)
    with DataLoader2(mixed(three), reading_service=None) as dl:
        dl.load_state_dict(state)  # the same sources: accepted


def test_mix_refuses_a_source_it_cannot_count(three):
    urls, index = three["a"]
    bad = (
        IterableWrapper(urls)
        .sharding_by_index(index)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .filter(bool)
    )
    with pytest.raises(ValueError, match=r"mix\(\) source 'x' should be sharding_by_index"):
        bad.mix(source(three, "b"), names=["x", "b"], weights=[0.5, 0.5])


# --- under DistributedReadingService: 2 ranks x 2 workers -> 3 ranks x 1 worker -------------------


def _dist_service(workers: int) -> Any:
    from shardpipes.dataloader2 import DistributedReadingService, SequentialReadingService

    dist = DistributedReadingService(timeout=60)
    return SequentialReadingService(dist, _mp(workers)) if workers else dist


def _dist_first(rank: int, world: int, three: Any, k: int) -> Any:
    with DataLoader2(mixed(three), reading_service=_dist_service(2)) as dl:
        dl.seed(3)
        full = [list(b) for b in dl]
    head, state = _head(mixed(three), _dist_service(2), k)
    return full, head, state


def _dist_rest(rank: int, world: int, three: Any, state: dict[str, Any]) -> Any:
    (tail,) = _tail(mixed(three), _dist_service(1), state)
    return tail


@pytest.mark.distributed
def test_mix_elastic_resume_under_distributed_2x2_to_3x1(three):
    from _dist import run_ranks

    first = run_ranks(_dist_first, 2, three, 3, timeout=200)
    assert len({len(full) for full, _, _ in first}) == 1  # equal batches per rank
    full = flat([b for f, _, _ in first for b in f])
    assert {x for x in full if x[0] == "a"} == {f"a{i}" for i in range(32)}
    # Every rank saves the same position; the binding names the rank that saved it.
    assert [s["binding"].pop("rank") for _, _, s in first] == [0, 1]
    state = first[0][2]
    assert all(s == state for _, _, s in first)  # the same state on every rank
    tails = run_ranks(_dist_rest, 3, three, state, timeout=200)
    assert len({len(t) for t in tails}) == 1
    got = flat([b for _, h, _ in first for b in h]) + flat([b for t in tails for b in t])
    assert not (got - full), got - full
    assert sum((full - got).values()) < 3
    assert {x for x in got if x[0] == "a"} == {f"a{i}" for i in range(32)}


def shuffled_source(three, name: str) -> Any:
    return source(three, name).shuffle(buffer_size=5)


def test_mix_with_a_shuffle_in_a_source_replays_on_the_same_topology_and_refuses_another(three):
    def graph() -> Any:
        return shuffled_source(three, "a").mix(shuffled_source(three, "b"), repeat=[1, 1]).batch(4)

    first = _epoch(graph(), 2)
    assert first == _epoch(graph(), 2)
    head, state = _head(graph(), _mp(2), 4)
    assert head == first[:4]
    (tail,) = _tail(graph(), _mp(2), state)
    assert tail == first[4:]
    with DataLoader2(graph(), reading_service=_mp(1)) as dl:
        with pytest.raises(ValueError, match=r"source 'source0' has a .*Shuffler.*replay"):
            dl.load_state_dict(state)


def shuffled_mix(three) -> Any:
    dp = source(three, "a").mix(source(three, "b"), source(three, "c"), repeat=[1, 2, 1])
    return dp.shuffle(buffer_size=9).batch(4)


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
@pytest.mark.parametrize("k", [1, 6, 13])
def test_mix_with_a_shuffle_after_it_resumes_exactly(three, workers, k):
    with DataLoader2(shuffled_mix(three), reading_service=_mp(workers)) as dl:
        dl.seed(3)
        first, second = [list(b) for b in dl], [list(b) for b in dl]
    head, state = _head(shuffled_mix(three), _mp(workers), k)
    assert head == first[:k]
    rest, nxt = _tail(shuffled_mix(three), _mp(workers), state, epochs=2)
    assert rest == first[k:] and nxt == second


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3), (0, 2)])
def test_mix_with_a_shuffle_after_it_resumes_elastically(three, before, after):
    full = flat(_epoch(shuffled_mix(three), before))
    head, state = _head(shuffled_mix(three), _mp(before), 7)
    with DataLoader2(shuffled_mix(three), reading_service=_mp(after)) as dl:
        dl.load_state_dict(state)
        it = iter(dl)
        middle = [list(next(it)) for _ in range(3)]
        state2 = pickle.loads(pickle.dumps(dl.state_dict()))
    (tail,) = _tail(shuffled_mix(three), _mp(1), state2)
    got = flat(head) + flat(middle) + flat(tail)
    assert not (got - full), got - full
    assert sum((full - got).values()) < max(after, 1) + 1
    assert {x for x in got if x[0] == "a"} == {f"a{i}" for i in range(32)}


def test_mix_refuses_a_padding_source(three):
    urls, index = three["a"]
    padded = (
        IterableWrapper(urls)
        .sharding_by_index(index, policy="pad")
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
    )
    with pytest.raises(ValueError, match=r"source 'p' has sharding_by_index\(policy='pad'\)"):
        padded.mix(source(three, "b"), names=["p", "b"], weights=[0.5, 0.5])
