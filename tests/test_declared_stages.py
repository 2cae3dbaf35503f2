"""A stage a user writes between ``webdataset()`` and ``batch()`` gets what it declares (issue 38 item 1).

The loader reads one description of the graph built from the stages' traits
(``datapipes/iter/_description.py``); no list of classes decides. A stage that declares its
traits (``one_to_one``, ``carries_ids``) gets what built-in stages get: resume by seeking (also
on another topology), ids for attestation, a place in a ``mix()`` source. The same stage without
the declarations gets the documented fallback: a replay on the same topology and a refusal
naming why on another, batches without ids (and a warning saying which stage), a refusal of the
``mix()`` source. Never other data: both yield the same batches.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _graphs import resumed, uninterrupted
from _hyp import budget
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.graph import describe, resume_shape
from shardpipes.dataloader2.graph.identity import NOT_CARRIED, carry_ids
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._index_length import exact_length_plan
from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.errors import AttestationWarning
from shardpipes.index import build_index, default_index_url
from shardpipes.plan.identity import SampleIds, sample_id
from shardpipes.synthetic import write_synthetic

COUNTS = [11, 13, 7]  # 31 samples, uneven shards


class Undeclared(StageIterDataPipe[dict[str, Any]]):
    """Adds ``.size``; one sample out per sample in, but it says nothing about it."""

    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for sample in self.source_datapipe:
            yield {**sample, ".size": len(sample[".bin"])}


class Declared(Undeclared):
    """The same stage, declaring what it is (as docs/writing-a-stage.md shows)."""

    one_to_one = True
    carries_ids = "in_step"


class PairSwap(StageIterDataPipe[Any]):
    """Swaps neighbours without looking at the items: one-to-one, ids can pass untouched."""

    one_to_one = True
    carries_ids = "untouched"

    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Any]:
        held = None
        for item in self.source_datapipe:
            if held is None:
                held = [item]
                continue
            yield item
            yield held[0]
            held = None
        if held is not None:
            yield held[0]


def _dataset(folder: Any, counts: list[int], prefix: str = "train") -> list[str]:
    paths = write_synthetic(
        folder, shards=len(counts), samples=counts, payload_bytes=8, prefix=prefix
    )
    build_index(paths, progress=False).save(default_index_url(paths))
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> list[str]:
    return _dataset(tmp_path_factory.mktemp("declared"), COUNTS)


def _source(paths: list[str]) -> Any:
    return (
        IterableWrapper(paths).shuffle().sharding_by_index()
        .open_files_by_fsspec().load_from_tar().webdataset()
    )  # fmt: skip


def _graph(paths: list[str], stage: type, buffer: int = 8) -> Any:
    return stage(_source(paths)).shuffle(buffer_size=buffer).batch(4)


def _key(sample: dict[str, Any]) -> tuple[str, str]:
    return sample["__url__"], sample["__key__"]


def _keys(batches: list[Any]) -> list[list[tuple[str, str]]]:
    return [[_key(s) for s in b] for b in batches]


def _mp(workers: int) -> Any:
    return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")


# --- resume by seeking --------------------------------------------------------------------


def test_the_description_reads_the_user_stage_traits(data):
    graph = describe(_graph(data, Declared))
    node = next(n for n in graph.nodes if isinstance(n.stage, Declared))
    assert node.traits.one_to_one and node.traits.carries_ids == "in_step"
    assert node.after_sharding and not node.traits.random
    assert [type(n.stage).__name__ for n in graph.reader_path()][-2:] == [
        "Declared",
        "WebDatasetIterDataPipe",
    ]
    assert exact_length_plan(graph) == (4, False)
    assert exact_length_plan(_graph(data, Undeclared)) is None


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_a_declared_stage_resumes_by_seeking(data, workers):
    shape = resume_shape(_graph(data, Declared))
    assert not isinstance(shape, str), shape
    assert shape[0].batch_size == 4 and shape[0].buffer_size == 8
    batches, states = uninterrupted(_graph(data, Declared), _mp(workers), epochs=1)
    for k in (1, len(batches) // 2, len(batches) - 1):
        tail = resumed(_graph(data, Declared), _mp(workers), states[k], len(batches) - k)
        assert _keys(tail) == _keys(batches[k:])


def test_a_declared_stage_resumes_on_another_topology(data):
    batches, states = uninterrupted(_graph(data, Declared), _mp(0), epochs=1)
    k = len(batches) // 2
    with DataLoader2(_graph(data, Declared), reading_service=_mp(2)) as dl:
        dl.load_state_dict(states[k])
        tail = list(dl)  # the rest of the epoch, split between 2 workers
    seen = collections.Counter(key for b in _keys(batches[:k]) + _keys(tail) for key in b)
    assert max(seen.values()) == 1  # no sample twice
    assert sum(COUNTS) - len(seen) < 2  # none skipped but what 2 readers leave out (drop)


def test_an_undeclared_stage_replays_and_refuses_another_topology(data):
    why = resume_shape(_graph(data, Undeclared))
    assert isinstance(why, str) and "one-to-one" in why
    batches, states = uninterrupted(_graph(data, Undeclared), _mp(0), epochs=1)
    declared, _ = uninterrupted(_graph(data, Declared), _mp(0), epochs=1)
    assert batches == declared  # the same data, declared or not
    k = len(batches) // 2
    same = resumed(_graph(data, Undeclared), _mp(0), states[k], len(batches) - k)
    assert same == batches[k:]  # replayed to the position on the same topology
    with DataLoader2(_graph(data, Undeclared), reading_service=_mp(2)) as dl:
        with pytest.raises(ValueError, match="another topology.*cannot: the graph is not"):
            dl.load_state_dict(states[k])


# --- ids for attestation ------------------------------------------------------------------


def _attested(dp: Any) -> tuple[list[Any], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AttestationWarning)
        with DataLoader2(dp) as dl:
            dl.attest(every=4)
            dl.seed(3)
            batches = list(dl)
    return batches, [str(w.message) for w in caught if w.category is AttestationWarning]


def test_a_declared_stage_carries_ids_to_the_batches(data):
    batches, notes = _attested(_graph(data, Declared))
    assert notes == []
    for b in batches:
        assert type(b.ids) is SampleIds
        assert list(b.ids) == [sample_id(*_key(s)) for s in b]
    assert sum(len(b.ids) for b in batches) == sum(COUNTS)


def test_an_undeclared_stage_leaves_the_batches_without_ids_and_says_why(data):
    batches, notes = _attested(_graph(data, Undeclared))
    assert len(notes) == 1 and notes[0].startswith(NOT_CARRIED) and "Undeclared" in notes[0]
    assert all(getattr(b, "ids", None) is None for b in batches)
    declared, _ = _attested(_graph(data, Declared))
    assert [list(b) for b in batches] == [list(b) for b in declared]


# --- inside a mix() source ----------------------------------------------------------------


@pytest.fixture(scope="module")
def second(tmp_path_factory: Any) -> list[str]:
    return _dataset(tmp_path_factory.mktemp("declared2"), [5, 9], prefix="other")


def _mixture(data: list[str], second: list[str], stage: type) -> Any:
    return stage(_source(data)).mix(_source(second), repeat=[1, 2]).shuffle(buffer_size=8).batch(4)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_a_declared_stage_sits_in_a_mix_source(data, second, workers):
    shape = resume_shape(_mixture(data, second, Declared))
    assert not isinstance(shape, str), shape
    batches, states = uninterrupted(_mixture(data, second, Declared), _mp(workers), epochs=1)
    assert all(".size" in s for b in batches for s in b if "train-" in s["__url__"])
    for k in (1, len(batches) // 2):
        tail = resumed(_mixture(data, second, Declared), _mp(workers), states[k], len(batches) - k)
        assert _keys(tail) == _keys(batches[k:])


def test_an_undeclared_stage_in_a_mix_source_is_refused(data, second):
    with pytest.raises(ValueError, match="followed only by one-to-one stages"):
        _mixture(data, second, Undeclared)


# --- a property over generated graphs -------------------------------------------------------

MIDDLE = {
    "declared": Declared,
    "undeclared": Undeclared,
    "pair_swap": PairSwap,
    "decode": lambda dp: dp.decode(),
    "map": lambda dp: dp.map(dict),
    "filter": lambda dp: dp.filter(bool),
    "shuffle": lambda dp: dp.shuffle(buffer_size=3),
}
ONE_TO_ONE = {"declared", "pair_swap", "decode", "map", "shuffle"}
CARRIES = {"declared", "pair_swap", "decode", "map", "shuffle"}


@settings(max_examples=budget(30), deadline=None)
@given(st.lists(st.sampled_from(sorted(MIDDLE)), max_size=3))
def test_what_the_loader_decides_follows_the_declarations(data, middle):
    def graph() -> Any:
        dp = _source(data)
        for name in middle:
            dp = MIDDLE[name](dp)
        return dp.batch(4)

    counted = all(name in ONE_TO_ONE for name in middle)
    assert (exact_length_plan(graph()) == (4, False)) is counted
    random_after = sum(name == "shuffle" for name in middle)
    seeks = not isinstance(resume_shape(graph()), str)
    assert seeks is (counted and random_after <= 1)
    _, note = carry_ids(graph())
    carried = all(name in CARRIES for name in middle)
    assert (note is None) is carried
    batches, notes = _attested(graph())
    for b in batches:  # never a wrong id: an id is the one of the sample in its place
        ids = getattr(b, "ids", None)
        assert (ids is not None) is carried
        if ids is not None:
            assert list(ids) == [sample_id(*_key(s)) for s in b]
    keys = [_key(s) for b in batches for s in b]
    assert len(keys) == len(set(keys))
    if counted:
        assert len(keys) == sum(COUNTS)
