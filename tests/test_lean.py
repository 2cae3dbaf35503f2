"""The loader's lean stand-ins for torch's shuffle/batch/map/filter behave exactly like them."""

from __future__ import annotations

import copy

import pytest

from shardpipes.dataloader2.graph import lean_graph
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._lean import LeanBatcherIterDataPipe, LeanShufflerIterDataPipe


def double(x):
    return 2 * x


def odd(x):
    return x % 2 == 1


@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("buffer_size", [1, 7, 1000])
def test_lean_shuffle_is_a_seeded_permutation(seed, buffer_size):
    lean = lean_graph(copy.deepcopy(IterableWrapper(range(200)).shuffle(buffer_size=buffer_size)))
    assert isinstance(lean, LeanShufflerIterDataPipe)
    first = list(lean.set_seed(seed))
    assert sorted(first) == list(range(200))
    assert list(lean.set_seed(seed)) == first
    assert list(lean.set_seed(seed + 1)) != first or buffer_size == 1
    if buffer_size == 1:
        assert first == list(range(200))  # a buffer of one keeps the order, as torch's does


def test_lean_graph_matches_torch_graph_and_leaves_the_original_alone():
    dp = IterableWrapper(range(50)).map(double).filter(odd).batch(4, drop_last=True)
    dp2 = IterableWrapper(range(50)).map(double).shuffle(buffer_size=5).batch(3)
    for graph in (dp, dp2):
        original = list(graph) if graph is dp else None
        owned = lean_graph(copy.deepcopy(graph))
        assert isinstance(owned, LeanBatcherIterDataPipe)
        if original is not None:
            assert list(owned) == original
        assert type(graph).__name__ == "BatcherIterDataPipe"  # the caller's graph is untouched


def test_columns_and_other_stages_are_kept():
    dp = IterableWrapper([{"a": 1}]).map(double, input_col="a")
    assert lean_graph(dp) is dp


def test_shared_sources_are_rewired_everywhere():
    src = IterableWrapper(range(6)).map(double)
    a, b = src.fork(2)
    zipped = a.zip(b)
    owned = lean_graph(copy.deepcopy(zipped))
    assert list(owned) == [(2 * i, 2 * i) for i in range(6)]
