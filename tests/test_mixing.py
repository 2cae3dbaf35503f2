"""Mixtures: 0.9's SampleMultiplexer under the loader, and the plan-based mixture (docs/mixing.md)."""

from __future__ import annotations

import collections
import json
import os
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
        return f"{self.name}{json.loads(sample['.json'])['id']}"


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
