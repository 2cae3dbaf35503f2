"""webdataset's RandomMix and RoundRobin (shardpipes.webdataset.mix): webdataset's behaviour, on the mixture."""

from __future__ import annotations

import collections
import pickle
from typing import Any

import pytest

import shardpipes.webdataset as wds
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import Mixer
from shardpipes.index import build_index
from shardpipes.synthetic import write_synthetic


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, list[str]]:
    out = {}
    for name, counts in (("a", [10, 10, 10]), ("b", [4, 4])):
        d = tmp_path_factory.mktemp(f"wdsmix-{name}")
        out[name] = write_synthetic(d, shards=len(counts), samples=counts, payload_bytes=8)
    return out


def dataset(shards, name: str, indexed: bool = True, shuffle: bool = False) -> Any:
    paths = shards[name]
    index = build_index(paths, progress=False) if indexed else False
    return wds.WebDataset(paths, index=index, shardshuffle=shuffle)


def keys(samples: Any) -> list[str]:
    return [f"{s['__url__'].rsplit('/', 2)[-2][-2]}:{s['__key__']}" for s in samples]


def _round_robin(sources: list[Any], longest: bool) -> list[Any]:
    """webdataset 1.0.2's round_robin_shortest / round_robin_longest, as written there."""
    sources = [iter(s) for s in sources]
    out = []
    i = 0
    while sources:
        i %= len(sources)
        try:
            out.append(next(sources[i]))
            i += 1
        except StopIteration:
            if not longest:
                break
            del sources[i]
    return out


@pytest.mark.parametrize("longest", [False, True])
@pytest.mark.parametrize("indexed", [True, False])
def test_round_robin_is_webdatasets(shards, longest, indexed):
    a, b = dataset(shards, "a", indexed), dataset(shards, "b", indexed)
    mixed = wds.RoundRobin([a, b], longest=longest)
    assert isinstance(mixed.source_datapipe, Mixer) == indexed
    expected = keys(_round_robin([dataset(shards, "a"), dataset(shards, "b")], longest))
    assert keys(mixed) == expected
    assert len(expected) == (38 if longest else 17)


@pytest.mark.parametrize("longest", [False, True])
def test_random_mix_counts_are_webdatasets(shards, longest):
    mixed = wds.RandomMix([dataset(shards, "a"), dataset(shards, "b")], [0.7, 0.3], longest)
    got = collections.Counter(k[0] for k in keys(mixed))
    # longest: everything once; else until the first runs out: b's 8 at 0.3 -> 8 / 0.3 draws
    assert dict(got) == ({"a": 30, "b": 8} if longest else {"a": 19, "b": 8})
    assert len(set(keys(mixed))) == sum(got.values())


def _mp(workers: int) -> Any:
    return (
        MultiProcessingReadingService(workers, multiprocessing_context="fork") if workers else None
    )


def random_mix(shards, indexed: bool = True) -> Any:
    a = dataset(shards, "a", indexed, shuffle=True)
    b = dataset(shards, "b", indexed, shuffle=True)
    return wds.RandomMix([a, b], [0.7, 0.3], longest=True)


@pytest.mark.parametrize("indexed", [True, False])
def test_random_mix_same_seed_same_batches(shards, indexed):
    def run(seed: int) -> list[Any]:
        with DataLoader2(random_mix(shards, indexed), reading_service=_mp(2)) as dl:
            dl.seed(seed)
            return keys(dl)

    first = run(3)
    assert first == run(3) and first != run(4)
    assert sorted(first) == sorted(keys(dataset(shards, "a")) + keys(dataset(shards, "b")))


def test_random_mix_resumes_on_another_topology(shards):
    with DataLoader2(random_mix(shards), reading_service=_mp(2)) as dl:
        dl.seed(3)
        full = collections.Counter(keys(dl))
        dl.seed(3)
        it = iter(dl)
        head = [next(it) for _ in range(9)]
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    with DataLoader2(random_mix(shards), reading_service=_mp(1)) as dl:
        dl.load_state_dict(state)
        tail = list(dl)
    got = collections.Counter(keys(head + tail))
    assert got == full  # 38 samples, 2 then 1 readers: nothing left out


def test_random_mix_without_an_index_refuses_another_topology(shards):
    with DataLoader2(random_mix(shards, indexed=False), reading_service=_mp(2)) as dl:
        dl.seed(3)
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    with DataLoader2(random_mix(shards, indexed=False), reading_service=_mp(1)) as dl:
        with pytest.raises(ValueError, match="RandomMix over datasets without a shardpipes index"):
            dl.load_state_dict(state)
