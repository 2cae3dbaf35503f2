"""The loader asks the stages' declarations, not their classes, for the last three decisions.

A stage a user writes that declares ``counts_drops`` gets the empty-epoch check ``filter()``
gets; one that declares ``syncs_ranks`` is the graph's rank synchroniser in place of
``fullsync()`` (no ``fullsync()`` added after it, the loader's process group handed to it, its
figures in ``dl.stats()["sync"]``, refused anywhere but last); a sharding point of another
class that seeks its reads (``seeks = "reads"``, as ``sharding_by_index`` declares) gets the
state's data binding and the job's one read of its index. See ``datapipes/iter/base.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data.datapipes.iter.sharding import _ShardingIterDataPipe

from _dist import run_ranks
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
)
from shardpipes.dataloader2.telemetry import stage_name
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._lean import LeanFilterIterDataPipe
from shardpipes.datapipes.iter.base import StageIterDataPipe, traits_of
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.errors import EmptyEpochWarning
from shardpipes.index import build_index, default_index_url
from shardpipes.index.document import ShardIndex
from shardpipes.synthetic import write_synthetic


def never(x: Any) -> bool:
    return False


# --- counts_drops ------------------------------------------------------------------------------


class Rejects(StageIterDataPipe[Any]):
    """A user's filter that counts what it drops, as it declares."""

    counts_drops = True

    def __init__(self, source_datapipe: Any, keep: Callable[[Any], bool]) -> None:
        self.source_datapipe = source_datapipe
        self.keep = keep
        self.dropped = 0  # items dropped, over all iterations
        self.passing = 0  # iterations that passed an item on

    def __iter__(self) -> Iterator[Any]:
        passed = False
        for item in self.source_datapipe:
            if self.keep(item):
                if not passed:
                    self.passing, passed = self.passing + 1, True
                yield item
            else:
                self.dropped += 1


class Silent(Rejects):
    """The same stage, declaring nothing."""

    counts_drops = False


class KeepsNone(LeanFilterIterDataPipe[Any]):
    """A user's variant of the loader's lean filter: a ``filter`` by what it declares (``stands_for``)."""


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda dp: dp.filter(never), "filter"),
        (lambda dp: Rejects(dp, never), "Rejects"),
        (lambda dp: KeepsNone(dp, never), "filter"),
    ],
    ids=["filter", "user-stage", "user-filter"],
)
def test_a_stage_that_counts_drops_is_named_when_it_drops_a_whole_epoch(make, name, workers):
    dp = make(IterableWrapper(range(12)).sharding_filter())
    assert stage_name(dp) == name  # the warning names a stage as telemetry does
    rs = MultiProcessingReadingService(num_workers=workers)
    with DataLoader2(dp, reading_service=rs) as dl:
        with pytest.warns(EmptyEpochWarning, match=rf"{name} received 12 items and dropped all"):
            assert list(dl) == []


def test_a_stage_that_declares_nothing_gets_the_generic_warning():
    assert traits_of(Rejects(IterableWrapper([]), never)).counts_drops
    assert not traits_of(Silent(IterableWrapper([]), never)).counts_drops
    with DataLoader2(Silent(IterableWrapper(range(12)), never)) as dl:
        with pytest.warns(EmptyEpochWarning, match="no filter or handler dropped everything"):
            assert list(dl) == []


# --- syncs_ranks and a sharding point that seeks its reads, on 2 gloo ranks ---------------------


@dataclasses.dataclass
class Evened:
    kept: int = 0
    dropped: int = 0
    handed: bool = False  # the reading service handed it its group (None: the default one)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EvenOut(StageIterDataPipe[Any]):
    """A user's rank synchroniser: reads its rank's items, yields as many as the shortest rank has."""

    main_process = True
    syncs_ranks = True

    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe
        self.group: Any = None
        self.handed = False
        self.stats = Evened()

    def set_process_group(self, group: Any) -> EvenOut:
        self.group, self.handed = group, True
        return self

    def __iter__(self) -> Iterator[Any]:
        items = list(self.source_datapipe)
        n = torch.tensor([len(items)])
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=self.group)
        self.stats = Evened(int(n), len(items) - int(n), self.handed)
        yield from items[: int(n)]


# A sharding point of another class than sharding_by_index's, with its code and declarations
# (seeks = "reads"): only its traits can tell the loader what it is.
ByIndex = type(
    "ByIndex",
    (_ShardingIterDataPipe,),
    {
        **{
            k: v
            for k, v in vars(IndexSharderIterDataPipe).items()
            if k not in ("__dict__", "__weakref__", "__getstate__", "__doc__")
        },
        "__iter__": IndexSharderIterDataPipe.__iter__.__wrapped__,  # torch hooks it once more
        "__module__": __name__,
        "__qualname__": "ByIndex",
    },
)


def _ranks(rank: int, world: int, paths: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for make in (EvenOut, lambda dp: dp.fullsync()):  # 13 items: rank 0 has 7, rank 1 has 6
        dl = DataLoader2(
            make(IterableWrapper(range(13)).sharding_filter()),
            reading_service=DistributedReadingService(),
        )
        with dl:
            out.setdefault("items", []).append(list(dl))
            out.setdefault("sync", []).append(dl.stats().get("sync"))
    try:
        with DataLoader2(
            EvenOut(IterableWrapper(range(13)).sharding_filter()).map(str),
            reading_service=DistributedReadingService(),
        ) as dl:
            list(dl)
    except ValueError as exc:
        out["inner"] = str(exc)
    sharders = []
    for kind in (ByIndex, IndexSharderIterDataPipe):
        sharder = kind(IterableWrapper(paths))  # the index next to the shards: not loaded yet
        DistributedReadingService().initialize(sharder.map(len))
        sharders.append([isinstance(sharder.index, ShardIndex), list(sharder)])
    out["sharders"] = sharders
    return out


@pytest.mark.distributed
def test_a_user_rank_synchroniser_and_index_sharder_get_what_fullsync_and_sharding_by_index_get(
    tmp_path,
):
    paths = write_synthetic(tmp_path, shards=3, samples=[5, 7, 4], payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))  # next to the shards
    results = run_ranks(_ranks, 2, paths)
    for rank, out in enumerate(results):
        user, builtin = out["items"]
        assert user == builtin == list(range(rank, 12, 2))  # 6 each: the 7th of rank 0 dropped
        # No fullsync() after the user's stage: its own figures, and it had the loader's group.
        assert out["sync"][0] == {"kept": 6, "dropped": 1 - rank, "handed": True}
        assert set(out["sync"][1]) != set(out["sync"][0])  # fullsync()'s own figures
        assert out["inner"].startswith("EvenOut() may only be the last stage of the graph")
        (user_loaded, user_ranges), (builtin_loaded, builtin_ranges) = out["sharders"]
        assert user_loaded and builtin_loaded  # rank 0's read of the index, shared
        assert user_ranges == builtin_ranges
    assert results[0]["sharders"][0][1] != results[1]["sharders"][0][1]  # split by rank


def _read(sharder: Any) -> Any:
    return sharder.open_files_by_fsspec().load_from_tar().webdataset().batch(4)


def test_a_user_index_sharder_binds_the_state_to_its_data(tmp_path):
    paths = write_synthetic(tmp_path, shards=3, samples=[5, 7, 4], payload_bytes=16)
    index = build_index(paths, progress=False)
    bindings = []
    for kind in (ByIndex, IndexSharderIterDataPipe):
        with DataLoader2(_read(kind(IterableWrapper(paths), index))) as dl:
            assert sum(len(b) for b in dl) == 16
            bindings.append(dl.state_dict()["binding"]["data"])
    assert bindings[0] == bindings[1]
    assert bindings[0] is not None and bindings[0]["samples"] == 16
