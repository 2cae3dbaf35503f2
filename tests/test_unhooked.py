"""``shuffle``, ``map`` and ``filter`` without torch's per-element hook behave as torch's own.

The classes the functional names build (``_unhooked.py``) are compared with torch's classes on
the same inputs: the same items in the same order for the same seed, the same count of samples
yielded, the same error when a second iterator replaces the first, and the same outcome of torch's
snapshot restoration (``_simple_graph_snapshot_restoration``).
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes._hook_iterator import _SnapshotState
from torch.utils.data.datapipes.iter import Filter as TorchFilter
from torch.utils.data.datapipes.iter import Mapper as TorchMapper
from torch.utils.data.datapipes.iter import Shuffler as TorchShuffler
from torch.utils.data.datapipes.utils.snapshot import _simple_graph_snapshot_restoration

from shardpipes.dataloader2.graph.utils import find_dps
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._unhooked import (
    FilterIterDataPipe,
    MapperIterDataPipe,
    ShufflerIterDataPipe,
    torch_kind,
)


def _double(x: int) -> int:
    return 2 * x


def _odd(x: int) -> bool:
    return x % 2 == 1


def test_the_functional_names_build_the_unhooked_subclasses():
    import shardpipes.datapipes.iter as stages

    src = IterableWrapper(range(10))
    assert type(src.shuffle()) is ShufflerIterDataPipe
    assert (
        type(src.map(_double)) is MapperIterDataPipe
        and type(src.filter(_odd)) is FilterIterDataPipe
    )
    pairs = (
        (ShufflerIterDataPipe, TorchShuffler),
        (MapperIterDataPipe, TorchMapper),
        (FilterIterDataPipe, TorchFilter),
    )
    for ours, theirs in pairs:
        assert issubclass(ours, theirs) and ours is not theirs
        assert torch_kind(ours) is theirs
        # the class names stay torch's own objects, as torchdata 0.9 exported them
        assert getattr(stages, theirs.__name__.replace("IterDataPipe", "")) is theirs


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 300),
    buffer_size=st.integers(1, 64),
    seed=st.integers(0, 2**63 - 1),
)
def test_shuffle_yields_torchs_order_for_the_same_seed(n, buffer_size, seed):
    ours = IterableWrapper(range(n)).shuffle(buffer_size=buffer_size).set_seed(seed)
    theirs = TorchShuffler(IterableWrapper(range(n)), buffer_size=buffer_size).set_seed(seed)
    assert list(ours) == list(theirs)
    assert ours._number_of_samples_yielded == theirs._number_of_samples_yielded == n


def test_shuffle_unseeded_draws_its_seed_from_torch_as_torch_does():
    torch.manual_seed(5)
    ours = list(IterableWrapper(range(100)).shuffle(buffer_size=10))
    torch.manual_seed(5)
    theirs = list(TorchShuffler(IterableWrapper(range(100)), buffer_size=10))
    assert ours == theirs != list(range(100))


def test_shuffle_turned_off_passes_items_in_order():
    dp = IterableWrapper(range(20)).shuffle(buffer_size=5).set_shuffle(False)
    assert list(dp) == list(range(20))


def test_map_and_filter_yield_torchs_items_columns_included():
    rows = [(i, i + 1) for i in range(30)]
    assert list(IterableWrapper(rows).map(_double, input_col=1)) == list(
        TorchMapper(IterableWrapper(rows), _double, input_col=1)
    )
    assert list(IterableWrapper(range(30)).map(_double).filter(_odd)) == []
    assert list(IterableWrapper(range(30)).filter(_odd)) == list(range(1, 30, 2))


@pytest.mark.parametrize("make", ["shuffle", "map", "filter"])
def test_a_second_iterator_invalidates_the_first_as_torch_does(make):
    src = IterableWrapper(range(50))
    dp = {
        "shuffle": lambda: src.shuffle(buffer_size=4).set_seed(1),
        "map": lambda: src.map(_double),
        "filter": lambda: src.filter(_odd),
    }[make]()
    first = iter(dp)
    next(first)
    second = iter(dp)
    assert next(second) is not None
    with pytest.raises(RuntimeError, match="This iterator has been invalidated"):
        next(first)


def _restored(shuffle, mapper):
    torch.manual_seed(11)  # the restored shuffle seeds itself from torch's generator
    dp = mapper(shuffle(IterableWrapper(range(40)), buffer_size=8).set_seed(3), _double)
    it = iter(dp)
    head = [next(it) for _ in range(13)]
    count = dp._number_of_samples_yielded
    copy = pickle.loads(pickle.dumps(dp))
    _simple_graph_snapshot_restoration(copy, count)
    copy._snapshot_state = _SnapshotState.Restored
    return head, list(it), list(copy), count


def test_snapshot_restoration_does_what_it_does_with_torchs_stages():
    ours = _restored(ShufflerIterDataPipe, MapperIterDataPipe)
    assert ours == _restored(TorchShuffler, TorchMapper)
    head, rest, _, count = ours
    assert count == 13 and sorted(head + rest) == [2 * i for i in range(40)]


def test_under_a_profiler_the_stage_is_recorded():
    dp = IterableWrapper(range(10)).shuffle(buffer_size=3).set_seed(0)
    with torch.autograd.profiler.profile() as prof:
        out = list(dp)
    assert sorted(out) == list(range(10))
    names = {e.name for e in prof.function_events}
    assert any(n.startswith("Shuffler(buffer_size=3") for n in names), sorted(names)[:20]


def test_find_dps_counts_torchs_class_and_ours_as_one():
    graph = IterableWrapper(range(5)).shuffle().map(_double)
    from torch.utils.data.graph import traverse_dps

    g = traverse_dps(graph)
    assert len(find_dps(g, TorchShuffler)) == 1 == len(find_dps(g, ShufflerIterDataPipe))
    assert len(find_dps(g, TorchMapper)) == 1


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("bad item 3")
    return x


def _odd_but_not_three(x: int) -> bool:
    return _fails_on_three(x) % 2 == 1


@pytest.mark.parametrize("make", ["map", "filter", "shuffle"])
def test_an_error_inside_carries_torchs_note(make):
    def build(src, kind):
        if make == "map":
            return kind[1](src, _fails_on_three)
        if make == "filter":
            return kind[2](src, _odd_but_not_three)
        return kind[0](kind[1](src, _fails_on_three), buffer_size=4)

    ours = (ShufflerIterDataPipe, MapperIterDataPipe, FilterIterDataPipe)
    theirs = (TorchShuffler, TorchMapper, TorchFilter)
    messages = []
    for kind in (ours, theirs):
        with pytest.raises(ValueError) as info:
            list(build(IterableWrapper(range(10)), kind))
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "bad item 3" in messages[0] and "This exception is thrown by __iter__ of" in messages[0]
