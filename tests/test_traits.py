"""Stages declare their traits and the loader reads them (issue 24): no lists of classes to join.

The bug this fixed: torchdata 0.9's ``enumerate``, ``add_index`` and ``drop`` were missing from a
central list of one-to-one stages, so after ``sharding_by_index`` they turned exact lengths and
seek-resume off without a word until ``load_state_dict``.
"""

from __future__ import annotations

import pytest
from torch.utils.data import IterDataPipe

from _graphs import resumed, sample_id, uninterrupted
from shardpipes.dataloader2 import MultiProcessingReadingService
from shardpipes.dataloader2.graph import resume_shape
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._index_length import exact_length_plan
from shardpipes.datapipes.iter.base import UNITS, is_one_to_one
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic

COUNTS = [13, 7, 22, 5]  # 47 samples, uneven shards


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("traits")
    paths = write_synthetic(folder, shards=len(COUNTS), samples=COUNTS, payload_bytes=8)
    build_index(paths, progress=False).save(default_index_url(paths))
    return f"{folder}/train-{{000000..{len(COUNTS) - 1:06d}}}.tar"


def as_dict(pair):
    return {"i": pair[0], "id": pair[1]}


def as_row(sample_id_):
    return {"id": sample_id_, "spare": 0}


def sharded(pattern):
    return (
        IterableWrapper([pattern]).shard_expand().shuffle().sharding_by_index()
        .open_files_by_fsspec().load_from_tar().webdataset().decode().map(sample_id)
        .shuffle(buffer_size=8)
    )  # fmt: skip


GRAPHS = {
    "enumerate": lambda p: sharded(p).enumerate().batch(4),
    "add_index": lambda p: sharded(p).map(as_row).add_index("i").batch(4),
    "drop": lambda p: sharded(p).map(as_row).drop("spare").batch(4),
    "drop-enumerate(5)": lambda p: sharded(p).map(as_row).drop("spare").enumerate(5).batch(4),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_09_column_stages_keep_exact_length_and_seek_resume(indexed, name):
    dp = GRAPHS[name](indexed)
    assert exact_length_plan(dp) == (4, False)
    found = resume_shape(dp)
    assert not isinstance(found, str), found
    assert found[0].batch_size == 4 and found[0].buffer_size == 8


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
@pytest.mark.parametrize("name", GRAPHS)
def test_09_column_stages_resume_batch_for_batch(indexed, name, workers):
    def rs():
        return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")

    batches, states = uninterrupted(GRAPHS[name](indexed), rs(), epochs=1)
    assert len(batches) == 12  # 47 samples in one reader; 2 workers, policy "drop": 23 + 23
    for k in (1, 5, len(batches) - 1):
        assert resumed(GRAPHS[name](indexed), rs(), states[k], len(batches) - k) == batches[k:]
    if "enumerate" in name:
        counts = sorted(i for b in batches for i, _ in b)
        start = 5 if "5" in name else 0
        per_reader = 47 if workers == 0 else 23  # each reader counts its own samples
        assert counts == sorted(list(range(start, start + per_reader)) * max(workers, 1))


def test_a_counter_where_a_resume_cannot_repeat_its_order_is_refused(indexed):
    after_batch = sharded(indexed).batch(4).enumerate()
    assert "after the batch() counts items" in resume_shape(after_batch)
    before_shuffle = (
        IterableWrapper([indexed]).shard_expand().sharding_by_index().open_files_by_fsspec()
        .load_from_tar().webdataset().enumerate().shuffle(buffer_size=8).batch(4)
    )  # fmt: skip
    assert "before the shuffle() counts items" in resume_shape(before_shuffle)


def test_a_stage_without_the_trait_still_turns_exact_lengths_off(indexed):
    # A user's own stage promises nothing: the loader must not guess.
    from shardpipes.datapipes.iter.base import StageIterDataPipe

    class Passes(StageIterDataPipe):
        def __init__(self, dp):
            self.datapipe = dp

        def __iter__(self):
            yield from self.datapipe

    class Declares(Passes):
        one_to_one = True

    assert exact_length_plan(Passes(sharded(indexed)).batch(4)) is None
    assert exact_length_plan(Declares(sharded(indexed)).batch(4)) == (4, False)


def test_declared_range_steps_use_the_known_units():
    from shardpipes.datapipes.iter.base import _STAND_INS

    stages = {fn.args[0] for fn in IterDataPipe.functions.values() if hasattr(fn, "args")}
    steps = {
        cls.__name__: cls.range_to_samples
        for cls in stages
        if getattr(cls, "range_to_samples", None) is not None
    }
    assert steps == {
        "IndexSharderIterDataPipe": ("urls", "ranges"),
        "FSSpecFileOpenerIterDataPipe": ("ranges", "streams"),
        "TarArchiveLoaderIterDataPipe": ("streams", "members"),
        "WebDatasetIterDataPipe": ("members", "samples"),
    }
    for read, yielded in steps.values():
        assert yielded in UNITS and (read in UNITS or read == "urls")
    # torch's own stages take the traits of their lean stand-ins
    from torch.utils.data.datapipes.iter import Batcher, Filter, Mapper, Shuffler

    assert set(_STAND_INS) == {Batcher, Filter, Mapper, Shuffler}
    assert is_one_to_one(IterableWrapper([1]).map(str))
    assert is_one_to_one(IterableWrapper([1]).shuffle())
    assert not is_one_to_one(IterableWrapper([1]).filter(bool))
