"""The contract every registered shardpipes stage keeps (STYLE.md point 27).

The tests run over the registry, not over a hand-kept list: every functional name that a
shardpipes class registers on ``IterDataPipe`` is a parameter, and a name without an entry in
``FACTORIES`` fails (add the entry), so a new stage cannot go uncovered.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

import shardpipes.datapipes.iter  # noqa: F401 - registers the stages
from _tars import read_pair
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic

pytestmark = pytest.mark.filterwarnings(r"ignore:pin_memory\(\) found no accelerator:UserWarning")


def registered() -> dict[str, type]:
    """Functional name -> class, for every name a shardpipes class registered."""
    out = {}
    for name, fn in IterDataPipe.functions.items():
        cls = fn.args[0] if isinstance(fn, functools.partial) and fn.args else None
        if isinstance(cls, type) and cls.__module__.startswith("shardpipes"):
            out[name] = cls
    return dict(sorted(out.items()))


REGISTERED = registered()


@dataclass
class Inputs:
    """What the factories build from; all lists are empty for the empty-input case."""

    items: list[int]  # generic items
    shard_dirs: list[str]  # directories holding the shards
    shards: list[str]  # shard paths
    out_dir: str  # where save_by_fsspec writes
    cache_dir: str  # on_disk_cache's directory


# Module-level functions: the graphs must pickle.
def double(x: int) -> int:
    return 2 * x


def file_url(path: str) -> str:
    return "file://" + path


def _samples(i: Inputs) -> Any:
    return IterableWrapper(i.shards).open_files_by_fsspec().load_from_tar().webdataset()


def _sharding_by_index(i: Inputs) -> Any:
    from shardpipes.index import build_index

    index = build_index(i.shards, progress=False) if i.shards else None
    return IterableWrapper(i.shards).sharding_by_index(index)


def range_fields(r: Any) -> tuple[str, int, int, int, int]:
    """A ``ShardRange`` compares as its URL alone; compare every field."""
    return (str(r), r.start, r.stop, r.offset, r.size)


def _through_nodes(i: Inputs) -> Any:
    from torchdata.nodes import ParallelMapper

    build = functools.partial(ParallelMapper, map_fn=double, num_workers=2, method="thread")
    return IterableWrapper(i.items).through_nodes(build)


# One entry per functional name: a small graph ending in that stage (plus, where the stage
# yields open streams, a map that reads them, so results compare by value).
FACTORIES: dict[str, Callable[[Inputs], Any]] = {
    "cycle": lambda i: IterableWrapper(i.items).cycle(2),
    "decode": lambda i: _samples(i).decode(),
    "fixed_length": lambda i: IterableWrapper(i.items).fixed_length(len(i.items)),
    "fullsync": lambda i: IterableWrapper(i.items).fullsync(),
    "header": lambda i: IterableWrapper(i.items).header(4),
    "in_batch_shuffle": lambda i: IterableWrapper(i.items).batch(3).in_batch_shuffle().set_seed(7),
    "list_files_by_fsspec": lambda i: IterableWrapper(i.shard_dirs).list_files_by_fsspec(
        masks="*.tar"
    ),
    "load_from_tar": lambda i: (
        IterableWrapper(i.shards).open_files_by_fsspec().load_from_tar().map(read_pair)
    ),
    "on_disk_cache": lambda i: IterableWrapper(i.shards).map(file_url).on_disk_cache(i.cache_dir),
    "open_files_by_fsspec": lambda i: (
        IterableWrapper(i.shards).open_files_by_fsspec().map(read_pair)
    ),
    "pin_memory": lambda i: IterableWrapper(i.items).pin_memory(),
    "prefetch": lambda i: IterableWrapper(i.items).prefetch(2),
    "save_by_fsspec": lambda i: IterableWrapper(
        [(os.path.join(i.out_dir, f"{x}.bin"), bytes([x])) for x in i.items]
    ).save_by_fsspec(),
    "set_length": lambda i: IterableWrapper(i.items).set_length(len(i.items)),
    "sharding_by_index": lambda i: _sharding_by_index(i).map(range_fields),
    "shard_expand": lambda i: IterableWrapper(
        [f"t-{{0..{len(i.items) - 1}}}.tar"] if i.items else []
    ).shard_expand(),
    "threadpool_map": lambda i: IterableWrapper(i.items).threadpool_map(double),
    "through_nodes": _through_nodes,
    "webdataset": _samples,
}

# Stages whose position carries over between epochs by design (DESIGN.md: fixed_length
# continues where the last epoch stopped), so an epoch cut short is not "reset".
CONTINUES_ACROSS_EPOCHS = {"fixed_length"}

NAMES = list(REGISTERED)


def build(name: str, inputs: Inputs) -> Any:
    factory = FACTORIES.get(name)
    if factory is None:
        pytest.fail(
            f"{REGISTERED[name].__qualname__} registers {name!r} but tests/test_contract.py has no "
            "factory for it: add one to FACTORIES so the contract suite covers the stage"
        )
    return factory(inputs)


def _inputs(tmp_path, empty: bool) -> Inputs:
    if empty:
        return Inputs([], [], [], os.fspath(tmp_path / "out"), os.fspath(tmp_path / "cache"))
    shard_dir = tmp_path / "shards"
    shards = write_synthetic(shard_dir, shards=3, samples=[2, 3, 2], payload_bytes=16)
    return Inputs(
        list(range(10)),
        [os.fspath(shard_dir)],
        shards,
        os.fspath(tmp_path / "out"),
        os.fspath(tmp_path / "cache"),
    )


@pytest.fixture
def inputs(tmp_path) -> Inputs:
    return _inputs(tmp_path, empty=False)


@pytest.fixture
def empty_inputs(tmp_path) -> Inputs:
    return _inputs(tmp_path, empty=True)


def _len(dp: Any) -> int | None:
    try:
        return len(dp)
    except TypeError:
        return None


def test_the_registry_is_found():
    assert {"load_from_tar", "webdataset", "decode", "fixed_length"} <= set(REGISTERED)


@pytest.mark.parametrize("name", NAMES)
def test_factory_builds_a_graph_holding_the_stage(name, inputs):
    dp = build(name, inputs)
    classes = {type(p) for p in get_all_graph_pipes(traverse_dps(dp))}
    assert REGISTERED[name] in classes


@pytest.mark.parametrize("name", NAMES)
def test_pickle_before_iteration(name, inputs):
    dp = build(name, inputs)
    blob = pickle.dumps(dp)
    expected = list(dp)
    assert len(expected) >= 2
    assert list(pickle.loads(blob)) == expected


@pytest.mark.parametrize("name", NAMES)
def test_pickle_mid_iteration(name, inputs):
    expected = list(build(name, inputs))
    dp = build(name, inputs)
    it = iter(dp)
    head = [next(it) for _ in range(len(expected) // 2)]
    blob = pickle.dumps(dp)
    assert head + list(it) == expected  # pickling did not disturb the running iteration
    assert list(pickle.loads(blob)) == expected  # and the copy starts from the beginning


@pytest.mark.parametrize("name", NAMES)
def test_pickle_after_iteration(name, inputs):
    dp = build(name, inputs)
    expected = list(dp)
    copy = pickle.loads(pickle.dumps(dp))
    assert list(copy) == expected
    assert list(dp) == expected


@pytest.mark.parametrize("name", NAMES)
def test_reiteration_gives_the_same_items(name, inputs):
    dp = build(name, inputs)
    first = list(dp)
    assert first
    assert list(dp) == first


@pytest.mark.parametrize("name", NAMES)
def test_iteration_cut_short_then_restarted(name, inputs):
    dp = build(name, inputs)
    first = list(dp)
    it = iter(dp)
    k = len(first) // 2
    head = [next(it) for _ in range(k)]
    it.close()
    assert head == first[:k]
    again = list(dp)
    if name in CONTINUES_ACROSS_EPOCHS:
        assert again == first[k:] + first[:k]
    else:
        assert again == first


@pytest.mark.parametrize("name", NAMES)
def test_empty_input(name, empty_inputs):
    dp = build(name, empty_inputs)
    assert list(dp) == []
    assert _len(dp) in (None, 0)


@pytest.mark.parametrize("name", NAMES)
def test_len_matches_the_items_yielded(name, inputs):
    dp = build(name, inputs)
    before = _len(dp)
    items = list(dp)
    assert items
    assert before in (None, len(items))
    assert _len(dp) == before
