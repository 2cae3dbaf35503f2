"""shard_expand, prefetch, threadpool_map, in_batch_shuffle, pin_memory, fullsync; torch's DataLoader."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterDataPipe
from torch.utils.data.graph_settings import apply_random_seed

from shardpipes.datapipes.iter import IterableWrapper, Prefetcher, ShardExpander, ThreadPoolMapper

# --- shard_expand --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("t-{000..003}.tar", ["t-000.tar", "t-001.tar", "t-002.tar", "t-003.tar"]),
        ("t-{08..11}.tar", ["t-08.tar", "t-09.tar", "t-10.tar", "t-11.tar"]),
        ("t-{9..11}.tar", ["t-9.tar", "t-10.tar", "t-11.tar"]),
        ("t-{5..5}.tar", ["t-5.tar"]),
        ("{train,val}.tar", ["train.tar", "val.tar"]),
        ("{a,b}/x-{0..1}.tar", ["a/x-0.tar", "a/x-1.tar", "b/x-0.tar", "b/x-1.tar"]),
        (
            "s3://bk/{x,y}-{00..01}-{p,q}",
            [f"s3://bk/{a}-{n}-{c}" for a in "xy" for n in ("00", "01") for c in "pq"],
        ),
        ("plain.tar", ["plain.tar"]),
    ],
    ids=[
        "zero-padded",
        "padded-crossing",
        "unpadded",
        "single",
        "list",
        "two-braces",
        "three-braces",
        "no-braces",
    ],
)
def test_shard_expand(pattern, expected):
    dp = IterableWrapper([pattern]).shard_expand()
    assert list(dp) == expected
    assert len(dp) == len(expected)


def test_shard_expand_several_patterns_in_order():
    dp = ShardExpander(IterableWrapper(["a-{0..1}", "b-{0..1}"]))
    assert list(dp) == ["a-0", "a-1", "b-0", "b-1"]
    assert list(IterableWrapper([]).shard_expand()) == []


@pytest.mark.parametrize(
    ("pattern", "match"),
    [
        ("t-{}.tar", r"brace \{\} is neither a range a\.\.b nor a list a,b"),
        ("t-{abc}.tar", r"brace \{abc\} is neither a range"),
        ("t-{3..1}.tar", r"bad range \{3\.\.1\} goes down \(3 > 1\)"),
        ("t-{1..2.tar", r"unbalanced or nested braces"),
        ("t-}{1..2}.tar", r"unbalanced or nested braces"),
        ("t-{a,{b,c}}.tar", r"unbalanced or nested braces"),
        ("t-{1..2..3}.tar", r"brace \{1\.\.2\.\.3\} is neither a range"),
    ],
    ids=["empty", "word", "descending", "unclosed", "stray-close", "nested", "step"],
)
def test_shard_expand_bad_patterns_name_the_pattern(pattern, match):
    with pytest.raises(ValueError, match=rf"^{re.escape(repr(pattern))}: {match}"):
        list(IterableWrapper([pattern]).shard_expand())


def test_shard_expand_names_existing_shards(shard_pattern):
    urls = list(IterableWrapper([shard_pattern]).shard_expand())
    assert len(urls) == 7 and all(os.path.exists(u) for u in urls)


# --- prefetch ------------------------------------------------------------------------------------


class Source(IterDataPipe):
    """``range(n)``, raising ``RuntimeError`` at ``fail_at``; records whether it was closed."""

    def __init__(self, n: int, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.n, self.fail_at, self.delay = n, fail_at, delay
        self.closed = threading.Event()

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise RuntimeError(f"source failed at item {i}")
                if self.delay:
                    time.sleep(self.delay)
                yield i
        finally:
            self.closed.set()

    def __len__(self):
        return self.n


class EagerFailure(IterDataPipe):
    """A source whose ``__iter__`` (not a generator) raises at once."""

    def __iter__(self):
        raise RuntimeError("cannot start")


def _new_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


@pytest.mark.parametrize("buffer_size", [1, 3, 1000])
def test_prefetch_keeps_order(buffer_size):
    dp = Source(200).prefetch(buffer_size)
    assert list(dp) == list(range(200))
    assert list(dp) == list(range(200))  # again
    assert len(dp) == 200


def test_prefetch_reraises_source_errors_after_the_items_before():
    got = []
    with pytest.raises(RuntimeError, match="source failed at item 5"):
        got.extend(Prefetcher(Source(10, fail_at=5), buffer_size=2))
    assert got == [0, 1, 2, 3, 4]


@pytest.mark.timeout(20)
def test_prefetch_source_that_fails_to_start_does_not_hang():
    with pytest.raises(RuntimeError, match="cannot start"):
        list(EagerFailure().prefetch())


def test_prefetch_early_break_stops_the_thread_and_closes_the_source():
    baseline, before = threading.active_count(), set(threading.enumerate())
    src = Source(10_000, delay=0.0005)
    for x in src.prefetch(4):
        if x == 3:
            assert _new_threads(before) == ["shardpipes-prefetch"]
            break
    # Leaving the loop closes the generator, which stops and joins the thread right away.
    assert _new_threads(before) == []
    assert threading.active_count() <= baseline
    assert src.closed.is_set()


def test_prefetch_bad_buffer_size():
    with pytest.raises(ValueError, match="buffer_size should be a positive integer, got 0"):
        IterableWrapper([]).prefetch(0)


# --- threadpool_map ------------------------------------------------------------------------------


def slow_square(x: int) -> int:
    time.sleep(0.002 * (7 - x % 7))  # later items often finish first
    return x * x


def fail_on_13(x: int) -> int:
    if x == 13:
        raise KeyError("item 13")
    return x


def add(a: int, b: int) -> int:
    return a + b


def negate(x: int) -> int:
    return -x


def test_threadpool_map_keeps_input_order():
    dp = IterableWrapper(range(40)).threadpool_map(slow_square, scheduled_tasks=8, max_workers=4)
    assert list(dp) == [x * x for x in range(40)]
    assert len(dp) == 40


def test_threadpool_map_raises_at_the_failing_item():
    got = []
    with pytest.raises(KeyError, match="item 13"):
        got.extend(ThreadPoolMapper(IterableWrapper(range(30)), fail_on_13, scheduled_tasks=4))
    assert got == list(range(13))


@pytest.mark.parametrize(
    ("items", "kwargs", "expected"),
    [
        ([{"a": 1, "b": 2}], {"input_col": "a"}, [{"a": -1, "b": 2}]),
        ([{"a": 1, "b": 2}], {"input_col": "a", "output_col": "c"}, [{"a": 1, "b": 2, "c": -1}]),
        ([(1, 2)], {"input_col": 1}, [(1, -2)]),
        ([(1, 2)], {"input_col": 0, "output_col": -1}, [(1, 2, -1)]),
        ([[1, 2]], {"input_col": 0, "output_col": [1]}, [[1, -1]]),
        ([(1, 2, 3)], {"fn": add, "input_col": (0, 2)}, [(4, 2)]),
        ([(1, 2, 3)], {"fn": add, "input_col": [1, 2], "output_col": -1}, [(1, 2, 3, 5)]),
    ],
    ids=[
        "dict",
        "dict-output",
        "tuple",
        "tuple-append",
        "list-output-list",
        "several-inputs",
        "several-append",
    ],
)
def test_threadpool_map_columns_like_torch_map(items, kwargs, expected):
    kwargs = {"fn": negate, **kwargs}
    assert list(IterableWrapper(items).threadpool_map(**kwargs)) == expected
    assert list(IterableWrapper(items).map(**kwargs)) == expected  # same meaning as torch's map


def test_threadpool_map_never_modifies_source_items():
    items = [[1, 2], {"a": 1}]
    list(IterableWrapper(items[:1], deepcopy=False).threadpool_map(negate, input_col=0))
    list(IterableWrapper(items[1:], deepcopy=False).threadpool_map(negate, input_col="a"))
    assert items == [[1, 2], {"a": 1}]


def test_threadpool_map_early_break_leaves_no_threads():
    baseline, before = threading.active_count(), set(threading.enumerate())
    for x in IterableWrapper(range(1000)).threadpool_map(
        slow_square, scheduled_tasks=16, max_workers=4
    ):
        if x == 4:
            assert _new_threads(before)  # the pool is running
            break
    assert _new_threads(before) == []
    assert threading.active_count() <= baseline


@pytest.mark.skipif(
    not hasattr(threading, "_shutdown_locks_lock"), reason="threading's internals of 3.9-3.12"
)
def test_threadpool_map_closed_elsewhere_never_joins_under_threading_locks():
    """An abandoned iteration closed by the garbage collector in another thread, while that
    thread holds the lock that joining a thread takes (a collection that starts inside a new
    thread's bootstrap does), ends without joining its workers: no deadlock."""
    it = iter(IterableWrapper(range(100)).threadpool_map(slow_square, max_workers=2))
    assert next(it) == 0
    closed = threading.Event()

    def close_as_the_collector_would():
        with threading._shutdown_locks_lock:  # as _maintain_shutdown_locks() holds it
            it.close()
        closed.set()

    threading.Thread(target=close_as_the_collector_would, daemon=True).start()
    assert closed.wait(60), "closing the iteration joined its workers under the lock"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"output_col": "x"}, "output_col needs input_col"),
        (
            {"input_col": 0, "output_col": [1, 2]},
            "output_col should be a single-element list or tuple",
        ),
        ({"scheduled_tasks": 0}, "scheduled_tasks should be a positive integer, got 0"),
    ],
    ids=["output-without-input", "two-outputs", "scheduled-tasks"],
)
def test_threadpool_map_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        IterableWrapper([]).threadpool_map(negate, **kwargs)


def test_threadpool_map_lambda_warns():
    with pytest.warns(UserWarning, match="lambda or a local function"):
        IterableWrapper([]).threadpool_map(lambda x: x)


# --- in_batch_shuffle ----------------------------------------------------------------------------


def _shuffled(seed: int | None, n: int = 64) -> list[list[int]]:
    dp = IterableWrapper(range(n)).batch(16).in_batch_shuffle()
    if seed is not None:
        dp.set_seed(seed)
    return list(dp)


def test_in_batch_shuffle_is_a_permutation_of_each_batch():
    batches = _shuffled(1)
    assert [sorted(b) for b in batches] == [list(range(i, i + 16)) for i in range(0, 64, 16)]
    assert batches != [list(range(i, i + 16)) for i in range(0, 64, 16)]


def test_in_batch_shuffle_seeds():
    assert _shuffled(123) == _shuffled(123)
    assert _shuffled(123) != _shuffled(321)
    assert _shuffled(None) == _shuffled(None) == _shuffled(0)  # unseeded: seed 0, not random


def test_in_batch_shuffle_same_order_on_reiteration_and_new_order_after_reseed():
    dp = IterableWrapper(range(32)).batch(8).in_batch_shuffle().set_seed(5)
    first = list(dp)
    assert list(dp) == first
    dp.set_seed(6)
    assert list(dp) != first


def test_in_batch_shuffle_is_seeded_by_torch_graph_settings():
    def run(seed: int) -> list[list[int]]:
        dp = IterableWrapper(range(32)).batch(8).in_batch_shuffle()
        apply_random_seed(dp, torch.Generator().manual_seed(seed))
        return list(dp)

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_in_batch_shuffle_can_be_turned_off():
    dp = IterableWrapper(range(8)).batch(4).in_batch_shuffle().set_seed(9).set_shuffle(False)
    assert list(dp) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(dp) == 2


# --- pin_memory ----------------------------------------------------------------------------------


def test_pin_memory_without_accelerator_passes_through_with_a_warning():
    assert not torch.accelerator.is_available()
    items = [torch.arange(3), {"x": torch.ones(2)}]
    dp = IterableWrapper(items, deepcopy=False).pin_memory()
    with pytest.warns(UserWarning, match=r"pin_memory\(\) found no accelerator"):
        got = list(dp)
    assert got[0] is items[0] and got[1] is items[1]
    assert len(dp) == 2


def tag(item, device):
    return (item, device)


def test_pin_memory_custom_function_is_applied():
    assert list(IterableWrapper([1, 2]).pin_memory(device="cpu", pin_memory_fn=tag)) == [
        (1, "cpu"),
        (2, "cpu"),
    ]


# --- fullsync ------------------------------------------------------------------------------------


def test_fullsync_outside_distributed_passes_through():
    assert not dist.is_initialized()
    dp = IterableWrapper(range(5)).fullsync()
    assert list(dp) == [0, 1, 2, 3, 4]
    assert list(dp) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policy": "wait"}, "policy 'wait' is not known"),
        ({"sync_every": 0}, "sync_every"),
        ({"timeout": 0}, "timeout"),
    ],
    ids=["policy", "sync_every", "timeout"],
)
def test_fullsync_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        IterableWrapper([]).fullsync(**kwargs)


# --- torch's own DataLoader ----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_torch_dataloader_with_workers_yields_every_sample_once(shard_pattern):
    dp = (
        IterableWrapper([shard_pattern])
        .shard_expand()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
    )
    loader = DataLoader(dp, batch_size=None, num_workers=2)
    ids = [s[".json"]["id"] for s in loader]
    assert sorted(ids) == list(range(11 + 13 + 17 + 19 + 23 + 29 + 31))


class CountingSource(IterDataPipe):
    """``range(n)`` that counts how many items were read from it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def __iter__(self):
        for i in range(self.n):
            self.reads += 1
            yield i


def test_prefetch_pause_stops_reading_until_resume():
    # torchdata 0.9's pause(): once it returns, the source is not read until resume().
    src = CountingSource(50)
    dp = src.prefetch(3)
    it = iter(dp)
    assert next(it) == 0
    dp.pause()
    reads = src.reads
    time.sleep(0.3)  # a producer that ignored pause() would read on (and fill the buffer)
    assert src.reads == reads
    dp.resume()
    assert [0, *list(it)] == list(range(50))


def test_prefetch_a_new_iteration_after_pause_starts_unpaused():
    dp = CountingSource(5).prefetch(2)
    it = iter(dp)
    next(it)
    dp.pause()
    assert list(iter(dp)) == [0, 1, 2, 3, 4]  # 0.9's reset after pause
    del it


def test_fullsync_has_09s_pause_resume_shutdown():
    dp = IterableWrapper(range(3)).fullsync()
    it = iter(dp)
    assert next(it) == 0
    dp.pause()
    dp.resume()
    dp.shutdown()
    assert list(it) == [1, 2]
