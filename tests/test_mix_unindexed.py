"""mix() over sources without a shard index (docs/mixing.md, "Sources without an index").

Weights are per-sample draws from the loader's seed, per reader: the same seed gives the same
batches (in-process and with workers), a state resumes exactly on the same topology (replay),
another topology is refused when the state is loaded, naming the source without an index, and
what needs the sources' sizes (repeat/choose, samples_per_epoch, a schedule) is refused at
construction, naming it.
"""

from __future__ import annotations

import collections
import json
import pickle
from typing import Any

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper, Mixer
from shardpipes.index import build_index
from shardpipes.synthetic import write_synthetic

A_COUNTS = [7, 9, 11, 5]  # 32 samples
B_COUNTS = [6, 4, 8]  # 18 samples


class Tag:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: dict[str, Any]) -> str:
        return f"{self.name}{json.loads(bytes(sample['.json']))['id']}"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, list[str]]:
    out = {}
    for name, counts in (("a", A_COUNTS), ("b", B_COUNTS), ("big", [200, 200])):
        d = tmp_path_factory.mktemp(f"unindexed-{name}")
        out[name] = write_synthetic(d, shards=len(counts), samples=counts, payload_bytes=8)
    return out


def unindexed(urls: list[str], name: str) -> Any:
    return (
        IterableWrapper(urls)
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(Tag(name))
    )


def with_index(urls: list[str], name: str) -> Any:
    return (
        IterableWrapper(urls)
        .shuffle()
        .sharding_by_index(build_index(urls, progress=False))
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(Tag(name))
    )


def mixed(shards, until: str = "last", a: Any = unindexed, **kwargs: Any) -> Any:
    kwargs.setdefault("weights", [0.7, 0.3])
    return (
        a(shards["a"], "a")
        .mix(unindexed(shards["b"], "b"), until=until, names=["a", "b"], **kwargs)
        .batch(4)
    )


def _mp(workers: int) -> Any:
    return (
        MultiProcessingReadingService(workers, multiprocessing_context="fork") if workers else None
    )


def _epochs(dp: Any, workers: int, seed: int = 3, epochs: int = 1) -> list[list[list[str]]]:
    with DataLoader2(dp, reading_service=_mp(workers)) as dl:
        dl.seed(seed)
        return [[list(b) for b in dl] for _ in range(epochs)]


def _flat(batches: list[list[str]]) -> collections.Counter[str]:
    return collections.Counter(x for b in batches for x in b)


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
@pytest.mark.parametrize("source_a", [unindexed, with_index], ids=["both-unindexed", "one-indexed"])
def test_same_seed_same_batches_and_every_sample_once(shards, workers, source_a):
    first = _epochs(mixed(shards, a=source_a), workers)[0]
    assert first == _epochs(mixed(shards, a=source_a), workers)[0]
    assert first != _epochs(mixed(shards, a=source_a), workers, seed=4)[0]
    seen = _flat(first)  # until="last": every source read once
    assert len(seen) == sum(A_COUNTS) + sum(B_COUNTS) and set(seen.values()) == {1}


def test_until_first_ends_with_the_first_source_to_run_out(shards):
    short = 0
    for seed in range(5):
        (epoch,) = _epochs(mixed(shards, until="first"), 0, seed=seed)
        seen = _flat(epoch)
        assert set(seen.values()) == {1}
        a = sum(1 for x in seen if x.startswith("a"))
        b = sum(1 for x in seen if x.startswith("b"))
        assert a == sum(A_COUNTS) or b == sum(B_COUNTS)  # one source finished
        short += a + b < sum(A_COUNTS) + sum(B_COUNTS)  # and the other not, mostly
    assert short >= 3


def test_draws_follow_the_weights(shards):
    # 20 seeds x the first 200 samples of two 400-sample sources at 0.7 / 0.3: the share of
    # "a" has a standard deviation of about 0.01 around 0.7; 0.03 is three of them.
    def big(weights: list[float]) -> Any:
        return unindexed(shards["big"], "a").mix(
            unindexed(shards["big"], "b"), weights=weights, until="first"
        )

    shares = []
    for seed in range(20):
        (epoch,) = _epochs(big([0.7, 0.3]).batch(200), 0, seed=seed)
        shares.append(sum(x.startswith("a") for x in epoch[0]) / 200)
    assert abs(sum(shares) / len(shares) - 0.7) < 0.03
    (even,) = _epochs(big([1, 1]).batch(200), 0)
    assert 0.4 < sum(x.startswith("a") for x in even[0]) / 200 < 0.6


@pytest.mark.parametrize("workers", [0, 2], ids=["inproc", "mp2"])
@pytest.mark.parametrize("k", [1, 6])
def test_resumes_exactly_on_the_same_topology_by_replay(shards, workers, k):
    first, second = _epochs(mixed(shards), workers, epochs=2)
    with DataLoader2(mixed(shards), reading_service=_mp(workers)) as dl:
        dl.seed(3)
        it = iter(dl)
        head = [list(next(it)) for _ in range(k)]
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    assert head == first[:k]
    with DataLoader2(mixed(shards), reading_service=_mp(workers)) as dl:
        dl.load_state_dict(state)
        assert [list(b) for b in dl] == first[k:]
        assert [list(b) for b in dl] == second  # the next epoch too


@pytest.mark.parametrize("source_a", [unindexed, with_index], ids=["both-unindexed", "one-indexed"])
def test_another_topology_is_refused_naming_the_unindexed_source(shards, source_a):
    with DataLoader2(mixed(shards, a=source_a), reading_service=_mp(2)) as dl:
        dl.seed(3)
        next(iter(dl))
        state = dl.state_dict()
    names = "'a', 'b'" if source_a is unindexed else "'b'"
    with DataLoader2(mixed(shards, a=source_a), reading_service=_mp(1)) as dl:
        with pytest.raises(
            ValueError, match=rf"x 2 worker.*source\(s\) \[{names}\] have no shard index"
        ):
            dl.load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": None, "repeat": [1, 2]}, "per-epoch proportions"),
        ({"weights": None, "choose": [5, None]}, "per-epoch proportions"),
        ({"weights": None}, "per-epoch proportions"),
        ({"weights": None, "schedule": [(0, [1, 1])]}, "schedule"),
        ({"samples_per_epoch": 20, "until": None}, "samples_per_epoch"),
        ({"until": None}, "say where an epoch ends"),
    ],
    ids=["repeat", "choose", "default", "schedule", "samples_per_epoch", "no-until"],
)
def test_what_needs_the_sizes_is_refused_at_construction(shards, kwargs, match):
    with pytest.raises(ValueError, match=rf"source\(s\) \['b'\] have no shard index.*{match}"):
        mixed(shards, a=with_index, **kwargs)


def test_round_robin_and_pickling(shards):
    dp = unindexed(shards["a"], "a").mix(
        unindexed(shards["b"], "b"), weights=[1, 1], even=True, until="first"
    )
    items = list(pickle.loads(pickle.dumps(dp)))
    assert [x[0] for x in items[:6]] == ["a", "b"] * 3
    assert sum(x.startswith("b") for x in items) == sum(B_COUNTS)
    # The indexed mixer still unpickles as itself (its __new__ picks the drawn one only for
    # sources without an index).
    indexed_mix = with_index(shards["a"], "a").mix(with_index(shards["b"], "b"), repeat=[1, 1])
    again = pickle.loads(pickle.dumps(indexed_mix))
    assert type(again) is Mixer and _flat([list(again)]) == _flat([list(indexed_mix)])


# --- under DistributedReadingService: 2 gloo ranks -------------------------------------------------


def _dist_run(rank: int, world: int, shards: dict[str, list[str]], k: int) -> Any:
    from shardpipes.dataloader2 import DistributedReadingService

    def service() -> Any:
        return DistributedReadingService(timeout=60)

    with DataLoader2(mixed(shards), reading_service=service()) as dl:
        dl.seed(3)
        first = [list(b) for b in dl]
        dl.seed(3)
        again = [list(b) for b in dl]
        dl.seed(3)
        it = iter(dl)
        head = [list(next(it)) for _ in range(k)]
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    with DataLoader2(mixed(shards), reading_service=service()) as dl:
        dl.load_state_dict(state)
        tail = [list(b) for b in dl]
    return first, again, head + tail


@pytest.mark.distributed
def test_two_ranks_same_batches_equal_counts_and_replay_resume(shards):
    from _dist import run_ranks

    ranks = run_ranks(_dist_run, 2, shards, 2, timeout=200)
    assert len({len(first) for first, _, _ in ranks}) == 1  # equal batches per rank
    for first, again, resumed in ranks:
        assert first == again and resumed == first
    seen = _flat([b for first, _, _ in ranks for b in first])
    assert set(seen.values()) == {1}  # the ranks read disjoint shards
