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
def is_even(x: int) -> bool:
    return x % 2 == 0


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


def _mix_source(i: Inputs) -> Any:
    dp = _sharding_by_index(i).open_files_by_fsspec().load_from_tar().webdataset()
    return dp.map(_sample_key)


def _sample_key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


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
    # the contract's shards hold no images: the stage passes their samples through (the image
    # path is tests/test_image.py's)
    "decode_random_resized_crop": lambda i: _samples(i).decode_random_resized_crop(32),
    "filter": lambda i: IterableWrapper(i.items).filter(is_even),
    "fixed_length": lambda i: IterableWrapper(i.items).fixed_length(len(i.items)),
    "fullsync": lambda i: IterableWrapper(i.items).fullsync(),
    "header": lambda i: IterableWrapper(i.items).header(4),
    "in_batch_shuffle": lambda i: IterableWrapper(i.items).batch(3).in_batch_shuffle().set_seed(7),
    "list_files_by_fsspec": lambda i: IterableWrapper(i.shard_dirs).list_files_by_fsspec(
        masks="*.tar"
    ),
    "map": lambda i: IterableWrapper(i.items).map(double),
    "load_from_tar": lambda i: (
        IterableWrapper(i.shards).open_files_by_fsspec().load_from_tar().map(read_pair)
    ),
    "on_disk_cache": lambda i: IterableWrapper(i.shards).map(file_url).on_disk_cache(i.cache_dir),
    "open_files_by_fsspec": lambda i: (
        IterableWrapper(i.shards).open_files_by_fsspec(mode="rb").map(read_pair)
    ),
    "pin_memory": lambda i: IterableWrapper(i.items).pin_memory(),
    "prefetch": lambda i: IterableWrapper(i.items).prefetch(2),
    "save_by_fsspec": lambda i: IterableWrapper(
        [(os.path.join(i.out_dir, f"{x}.bin"), bytes([x])) for x in i.items]
    ).save_by_fsspec(mode="wb"),
    "set_length": lambda i: IterableWrapper(i.items).set_length(len(i.items)),
    "mix": lambda i: _mix_source(i).mix(_mix_source(i), repeat=[1, 2]),
    "sharding_by_index": lambda i: _sharding_by_index(i).map(range_fields),
    "shard_expand": lambda i: IterableWrapper(
        [f"t-{{0..{len(i.items) - 1}}}.tar"] if i.items else []
    ).shard_expand(),
    "threadpool_map": lambda i: IterableWrapper(i.items).threadpool_map(double),
    "through_nodes": _through_nodes,
    "webdataset": _samples,
}


def _pairs(i: Inputs) -> Any:
    return IterableWrapper([(x, x + 100) for x in i.items])


def _text_files(i: Inputs) -> Any:
    return IterableWrapper(i.shards).open_files_by_fsspec().load_from_tar()


def _lines(i: Inputs) -> Any:
    return IterableWrapper([(f"f{x}", io.StringIO(f"a,{x}\nb,{x}\n\nc,{x}")) for x in i.items])


def _by_key(x: Any) -> Any:
    return x[0]


def _as_list(x: int) -> list[int]:
    return [x, x]


def _first(batch: list[Any]) -> list[Any]:
    return batch[:1]


async def _async_double(x: int) -> int:
    return 2 * x


def _json_files(i: Inputs) -> Any:
    return IterableWrapper([(f"{x}.json", io.StringIO(f'{{"x": {x}}}')) for x in i.items])


def _compressed(i: Inputs, suffix: str, opener: Callable[..., Any]) -> Any:
    out = []
    for x in i.items:
        path = os.path.join(i.out_dir, f"{x}.txt{suffix}")
        os.makedirs(i.out_dir, exist_ok=True)
        with opener(path, "wb") as f:
            f.write(bytes([x]) * 3)
        out.append(path)
    return IterableWrapper(out).open_files_by_fsspec()


def _read_second(pair: Any) -> Any:
    return pair[0].rsplit("/", 1)[-1], pair[1].read()


def _zip_files(i: Inputs) -> Any:
    import zipfile

    os.makedirs(i.out_dir, exist_ok=True)
    paths = []
    for x in i.items:
        path = os.path.join(i.out_dir, f"{x}.zip")
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"m{x}.bin", bytes([x]))
        paths.append(path)
    return IterableWrapper(paths).open_files_by_fsspec()


def _tfrecords(i: Inputs) -> Any:
    return IterableWrapper([]).open_files_by_fsspec()  # content covered by the conformance suite


def _to_tuple(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


import bz2 as _bz2  # noqa: E402
import io  # noqa: E402
import lzma as _lzma  # noqa: E402

from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES  # noqa: E402

from shardpipes.datapipes.map import SequenceWrapper  # noqa: E402

FACTORIES.update(
    {
        # torchdata 0.9 compatibility stages (issue 16)
        "add_index": lambda i: IterableWrapper([{"v": x} for x in i.items]).add_index(),
        "async_map_batches": lambda i: IterableWrapper(i.items).async_map_batches(_async_double, 3),
        "bucketbatch": lambda i: (
            IterableWrapper(i.items).bucketbatch(3, sort_key=sorted).map(sorted)
        ),
        "check_hash": lambda i: IterableWrapper([(f"{x}", b"x") for x in i.items]).check_hash(
            {
                f"{x}": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
                for x in i.items
            }
        ),
        "decompress": lambda i: _compressed(i, ".xz", _lzma.open).decompress().map(_read_second),
        "drop": lambda i: _pairs(i).drop(0),
        "end_caching": lambda i: _end_caching(i),
        "memory_cell": lambda i: IterableWrapper(i.items).memory_cell(),
        "enumerate": lambda i: IterableWrapper(i.items).enumerate(),
        "extract": lambda i: _compressed(i, ".bz2", _bz2.open).extract().map(_read_second),
        "flatmap": lambda i: IterableWrapper(i.items).flatmap(_as_list),
        "flatten": lambda i: IterableWrapper([(x, (x, x)) for x in i.items]).flatten(),
        "in_memory_cache": lambda i: IterableWrapper(i.items).in_memory_cache(),
        "lines_to_paragraphs": lambda i: _lines(i).readlines().lines_to_paragraphs(),
        "load_from_bz2": lambda i: (
            _compressed(i, ".bz2", _bz2.open).load_from_bz2().map(_read_second)
        ),
        "load_from_tfrecord": lambda i: _tfrecords(i).load_from_tfrecord(),
        "load_from_xz": lambda i: (
            _compressed(i, ".xz", _lzma.open).load_from_xz().map(_read_second)
        ),
        "load_from_zip": lambda i: _zip_files(i).load_from_zip().map(_read_second),
        "map_batches": lambda i: IterableWrapper(i.items).map_batches(_first, 3),
        "max_token_bucketize": lambda i: IterableWrapper(
            [[0] * (x % 4 + 1) for x in i.items]
        ).max_token_bucketize(4),
        "mux_longest": lambda i: IterableWrapper(i.items).mux_longest(IterableWrapper(i.items[:3])),
        "parse_csv": lambda i: _lines(i).parse_csv().map(_to_tuple),
        "parse_csv_as_dict": lambda i: _lines(i).parse_csv_as_dict(fieldnames=["k", "v"]),
        "parse_json_files": lambda i: _json_files(i).parse_json_files(),
        "random_split": lambda i: IterableWrapper(i.items).random_split(
            {"a": 1, "b": 1}, seed=3, target="a"
        ),
        "readlines": lambda i: _lines(i).readlines(),
        "repeat": lambda i: IterableWrapper(i.items).repeat(2),
        "round_robin_demux": lambda i: IterableWrapper(i.items).round_robin_demux(2)[0],
        "rows2columnar": lambda i: (
            IterableWrapper(i.items).batch(3).map(_rows).rows2columnar().map(dict)
        ),
        "save_to_disk": lambda i: IterableWrapper(
            [(os.path.join(i.out_dir, f"{x}.txt"), str(x)) for x in i.items]
        ).save_to_disk(),
        "sharding_round_robin_dispatch": lambda i: IterableWrapper(
            i.items
        ).sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING),
        "shuffled_flatmap": lambda i: (
            IterableWrapper(i.items).shuffled_flatmap(_as_list).set_seed(5)
        ),
        "slice": lambda i: _pairs(i).slice(1),
        "to_map_datapipe": lambda i: _pairs(i).to_map_datapipe().to_iter_datapipe(sorted(i.items)),
        "unzip": lambda i: _pairs(i).unzip(2)[1],
        "zip_longest": lambda i: IterableWrapper(i.items).zip_longest(IterableWrapper(i.items[:3])),
        "zip_with_iter": lambda i: IterableWrapper(i.items).zip_with_iter(
            IterableWrapper(list(reversed(i.items))), _identity
        ),
        "zip_with_map": lambda i: _pairs(i).zip_with_map(
            SequenceWrapper({x: -x for x in i.items}), _by_key
        ),
    }
)


def _end_caching(i: Inputs) -> Any:
    where = functools.partial(_cache_path, i.cache_dir)
    return (
        IterableWrapper([str(x) for x in i.items])
        .on_disk_cache(filepath_fn=where)
        .map(_text_pair)
        .end_caching(mode="w", filepath_fn=where, skip_read=True)
    )


def _cache_path(folder: str, name: str) -> str:
    return os.path.join(folder, name)


def _text_pair(name: str) -> tuple[str, str]:
    return name, f"content {name}"


def _identity(x: Any) -> Any:
    return x


def _rows(batch: list[int]) -> list[dict[str, int]]:
    return [{"v": x} for x in batch]


# torchdata 0.9 names whose stage needs a service (covered by tests/test_td09_readers.py) or
# fails at construction by design (tests/test_td09_unavailable.py): no contract graph.
NOT_IN_CONTRACT = {
    "list_files_by_ais", "load_files_by_ais", "list_files_by_iopath", "open_files_by_iopath",
    "save_by_iopath", "dataframe", "load_parquet_as_df", "load_from_rar",
    "read_from_http", "read_from_remote", "read_from_gdrive", "list_files_by_s3", "load_files_by_s3",
    "load_from_tfrecord",  # decoding is pinned by the conformance suite's test_tfrecord.py
    # torch's buffer shuffle without its hook (_unhooked.py): each iteration draws a new seed,
    # as torch's does, so re-iterating differs by design; test_unhooked.py holds it to torch's
    "shuffle",
}  # fmt: skip


def _building() -> dict[str, set[type]]:
    from shardpipes.datapipes.map import converter
    from shardpipes.datapipes.td09 import archives, bucket, cache, callable, combining

    return {
        "async_map_batches": {callable._AsyncBatchMapper},
        "bucketbatch": {IterDataPipe.functions["in_batch_shuffle"].args[0]},
        "end_caching": {cache.TorchdataCacheHolder},
        "extract": {archives.DecompressorIterDataPipe},
        "random_split": {bucket.SplitterIterator},
        "round_robin_demux": {combining._RoundRobinDemux},
        "to_map_datapipe": {converter.IterToMapConverterMapDataPipe},
        "unzip": {combining._UnZipper},
    }


BUILDS_A_GRAPH = _building()

# Stages whose position carries over between epochs by design (DESIGN.md: fixed_length
# continues where the last epoch stopped), so an epoch cut short is not "reset".
CONTINUES_ACROSS_EPOCHS = {"fixed_length"}

NAMES = [n for n in REGISTERED if n not in NOT_IN_CONTRACT]


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
    if name in BUILDS_A_GRAPH:  # 0.9's factory classes: __new__ returns the graph they stand for
        assert classes & BUILDS_A_GRAPH[name]
    else:
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
