"""DataLoader2 with the in-process and multiprocessing reading services (one rank)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import torch.multiprocessing as tmp

from _graphs import id_graph, sample_id
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import ShardingWarning, WorkerError

TOTAL = 11 + 13 + 17 + 19 + 23 + 29 + 31  # samples in the shard_dir fixture
START_METHODS = tmp.get_all_start_methods()


def epochs(dp, rs, n=2, seed=None):
    with DataLoader2(dp, reading_service=rs) as dl:
        if seed is not None:
            dl.seed(seed)
        return [[list(b) for b in dl] for _ in range(n)]


def flat(batches):
    return [x for b in batches for x in b]


def no_children_left(deadline=60.0):
    """Whether every child process has exited; waits up to ``deadline`` s (slow on a loaded box)."""
    end = time.monotonic() + deadline
    while multiprocessing.active_children():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    "rs_factory",
    [
        pytest.param(lambda: None, id="default"),
        pytest.param(InProcessReadingService, id="in-process"),
        pytest.param(lambda: MultiProcessingReadingService(num_workers=0), id="mp-0-workers"),
        pytest.param(lambda: MultiProcessingReadingService(num_workers=2), id="mp-2-workers"),
        pytest.param(
            lambda: SequentialReadingService(MultiProcessingReadingService(num_workers=3)),
            id="seq-mp-3",
        ),
    ],
)
def test_every_sample_once_per_epoch_and_deterministic(shard_pattern, rs_factory):
    first = epochs(id_graph(shard_pattern), rs_factory(), seed=0)
    again = epochs(id_graph(shard_pattern), rs_factory(), seed=0)
    for batches in first:
        ids = flat(batches)
        assert sorted(ids) == list(range(TOTAL))
    assert first == again, "same seed must give the same batches run after run"
    assert first[0] != first[1], "each epoch must have a new order"
    assert no_children_left()


def test_seed_changes_order_and_restarts_epochs(shard_pattern):
    a = epochs(id_graph(shard_pattern), MultiProcessingReadingService(num_workers=2), seed=7)
    b = epochs(id_graph(shard_pattern), MultiProcessingReadingService(num_workers=2), seed=8)
    assert a != b
    assert sorted(flat(a[0])) == sorted(flat(b[0])) == list(range(TOTAL))
    with DataLoader2(id_graph(shard_pattern)) as dl:
        dl.seed(3)
        e0 = list(dl)
        list(dl)
        dl.seed(3)
        assert list(dl) == e0


@pytest.mark.parametrize("start_method", START_METHODS)
def test_batches_are_made_in_workers_and_arrive_whole(shard_pattern, start_method):
    rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context=start_method)
    batches = epochs(id_graph(shard_pattern, batch_size=5), rs, n=1)[0]
    sizes = [len(b) for b in batches]
    # Each worker batches its own samples: at most one short batch per worker.
    assert sum(1 for s in sizes if s < 5) <= 2
    assert sum(sizes) == TOTAL
    assert no_children_left()


def test_workers_split_shards_not_samples(shard_dir):
    # Without shuffles, worker w reads shards w, w+2, ... and the pool interleaves batches
    # round-robin: worker 0's first batch, worker 1's first batch, ...
    dp = (
        IterableWrapper([f"{shard_dir}/train-{{000000..000006}}.tar"])
        .shard_expand()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .batch(1000)
    )
    batches = epochs(dp, MultiProcessingReadingService(num_workers=2), n=1)[0]
    counts = [11, 13, 17, 19, 23, 29, 31]
    assert [len(b) for b in batches] == [sum(counts[0::2]), sum(counts[1::2])]


def test_break_then_next_epoch(shard_pattern):
    rs = MultiProcessingReadingService(num_workers=2)
    with DataLoader2(id_graph(shard_pattern), reading_service=rs) as dl:
        for i, _ in enumerate(dl):
            if i == 2:
                break
        full = flat(list(dl))
        assert sorted(full) == list(range(TOTAL))
        it = iter(dl)
        next(it)
        assert sorted(flat(list(dl))) == list(range(TOTAL))  # a new iter() replaces the old one
    assert no_children_left()


class Boom(ValueError):
    pass


def explode_on_13(x):
    if x == 13:
        raise Boom(f"bad sample {x}")
    return x


def test_stage_error_in_worker_is_reraised_with_its_type_and_traceback():
    dp = IterableWrapper(range(40)).sharding_filter().map(explode_on_13).batch(2)
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        with pytest.raises(Boom, match=r"(?s)Caught Boom in worker process 1.*bad sample 13"):
            list(dl)
    assert no_children_left()


def kill_self_on_7(x):
    if x == 7:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_killed_worker_gives_a_clear_error():
    dp = IterableWrapper(range(40)).sharding_filter().map(kill_self_on_7)
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        with pytest.raises(
            WorkerError, match=r"worker process died.*(killed by signal|exited unexpectedly)"
        ):
            list(dl)  # a hang instead of the error is caught by the test's time-out (pyproject)
    assert no_children_left()


def test_shutdown_stops_workers_and_is_final(shard_pattern):
    dl = DataLoader2(
        id_graph(shard_pattern), reading_service=MultiProcessingReadingService(num_workers=2)
    )
    next(iter(dl))
    assert multiprocessing.active_children()
    dl.shutdown()
    dl.shutdown()  # idempotent
    assert no_children_left()
    with pytest.raises(RuntimeError, match="shut down"):
        iter(dl)


def test_graph_without_sharding_filter_warns():
    dp = IterableWrapper(range(4))
    with pytest.warns(ShardingWarning, match="no sharding_filter"):
        with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
            assert sorted(dl) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_user_graph_is_not_modified(shard_pattern):
    dp = id_graph(shard_pattern)
    epochs(dp, MultiProcessingReadingService(num_workers=2), n=1)
    assert sorted(flat(dp)) == list(range(TOTAL))  # no sharding left on the caller's graph


def test_distributed_service_without_process_group_names_the_fix():
    dl = DataLoader2(
        IterableWrapper(range(3)).sharding_filter(), reading_service=DistributedReadingService()
    )
    with pytest.raises(RuntimeError, match="init_process_group"):
        list(dl)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_workers": -1}, "num_workers should be >= 0"),
        ({"worker_prefetch_cnt": -1}, "worker_prefetch_cnt"),
        ({"multiprocessing_context": "threads"}, "not available; must be one of"),
    ],
    ids=["negative-workers", "negative-prefetch", "bad-context"],
)
def test_multiprocessing_service_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiProcessingReadingService(**kwargs)


def test_seed_validates():
    dl = DataLoader2(IterableWrapper([1]))
    with pytest.raises(TypeError, match="seed should be an int"):
        dl.seed("1")  # type: ignore[arg-type]


def as_array(x):
    import numpy as np

    return np.full(3, x, dtype=np.int64)


@pytest.mark.parametrize("workers", [0, 2])
def test_items_keep_their_type_with_and_without_workers(workers):
    import numpy as np

    dp = IterableWrapper(range(4)).sharding_filter().map(as_array)
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers)) as dl:
        items = list(dl)
    assert all(type(x) is np.ndarray for x in items)
