"""Forked workers never run the finalizers of garbage their parent left uncollected.

A Ray ``ObjectRefGenerator`` caught in a reference cycle in the trainer, collected in a forked
worker, calls Ray's gRPC client there and hangs the worker (seen in the Ray cluster tests). Here
a plain finalizer stands for it: it records the process it runs in. Every way shardpipes code
runs in forked processes is checked (shardpipes/_fork.py's hooks cover each fork), with the
trainer's garbage young (generations 0 and 1) and old (generation 2, which the parent does not
collect before it forks).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.nodes import Loader, ParallelMapper

import shardpipes.webdataset as wds
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.nodes import as_node

ITEMS = list(range(40))


class _Marks:
    """Finalized in a cycle: writes ``tag pid`` (the process it was finalized in) to ``path``."""

    def __init__(self, path: str, tag: str = "") -> None:
        self.path = path
        self.tag = tag
        self.me = self  # a cycle: only the cyclic collector frees it

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{self.tag} {os.getpid()}\n")


def _collect(x: int) -> int:
    gc.collect()  # as a user's stage may: collects whatever the worker holds that is garbage
    return x


def _graph() -> Any:
    return IterableWrapper(ITEMS).sharding_filter().map(_collect)


def _pool() -> list[int]:
    rs = MultiProcessingReadingService(2, multiprocessing_context="fork")
    with DataLoader2(_graph(), reading_service=rs) as dl:
        return list(dl)


def _webloader() -> list[int]:
    loader = wds.WebLoader(
        _graph(), batch_size=None, num_workers=2, multiprocessing_context="fork", collate_fn=int
    )
    return list(loader)


def _torch_loader() -> list[int]:
    # torch's own DataLoader over a shardpipes graph, as webdataset's users write it
    loader = torch.utils.data.DataLoader(
        _graph(), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    return [int(x) for x in loader]


def _process_mapper(source: Any) -> Any:
    return ParallelMapper(
        source, _collect, num_workers=2, method="process", multiprocessing_context="fork"
    )


def _through_nodes() -> list[int]:
    # the stage runs a torchdata.nodes mapper whose workers are processes forked by the stage
    return list(IterableWrapper(ITEMS).through_nodes(_process_mapper))


def _as_node() -> list[int]:
    # torchdata.nodes forks the workers of a mapper over our node
    return list(Loader(_process_mapper(as_node(IterableWrapper(ITEMS)))))


PATHS: dict[str, Callable[[], list[int]]] = {
    "worker pool": _pool,
    "WebLoader": _webloader,
    "torch DataLoader": _torch_loader,
    "through_nodes": _through_nodes,
    "as_node": _as_node,
}


def _finalized_in(run: Callable[[], list[int]], tmp_path: Path) -> list[str]:
    """Run ``run`` with two finalizable cycles left uncollected, one young, one in the oldest
    generation; return ``tag pid`` for each finalization, in order."""
    marks = os.fspath(tmp_path / "finalized")
    before = gc.get_threshold()
    gc.collect()
    gc.set_threshold(10**6)  # no automatic collection here: the garbage is still there at fork
    try:
        old = _Marks(marks, "old")
        gc.collect()  # still alive: it survives into generation 2, and becomes garbage there
        del old
        _Marks(marks, "young")  # garbage at once, in generation 0
        assert not os.path.exists(marks)
        assert sorted(run()) == ITEMS
    finally:
        gc.set_threshold(*before)
    gc.collect()
    with open(marks) as f:
        return f.read().splitlines()


@pytest.mark.parametrize("path", list(PATHS))
def test_workers_do_not_finalize_what_the_trainer_left(path: str, tmp_path) -> None:
    # Each finalized once, in this process: the young garbage by the collection just before
    # each fork, the old garbage by the collection above, after the workers ended. Without the
    # at-fork hooks the workers' gc.collect() finalized both there too (3 times each, with 2
    # workers).
    me = os.getpid()
    assert _finalized_in(PATHS[path], tmp_path) == [f"young {me}", f"old {me}"]


def _fork_and_collect() -> int:
    pid = os.fork()
    if pid == 0:  # the child: collects everything it can, then leaves without cleaning up
        gc.collect()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_plain_fork_is_covered_too(tmp_path) -> None:
    # The hooks sit on os.fork itself: a child forked by any code leaves the garbage alone.
    me = os.getpid()
    finalized = _finalized_in(lambda: ITEMS if _fork_and_collect() == 0 else [], tmp_path)
    assert finalized == [f"young {me}", f"old {me}"]


def test_the_child_collects_its_own_garbage(tmp_path) -> None:
    # Frozen is only what the child inherited: a cycle the child makes is collected there.
    marks = tmp_path / "finalized"
    pid = os.fork()
    if pid == 0:
        try:
            _Marks(os.fspath(marks), "own")
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert marks.read_text().splitlines() == [f"own {pid}"]


def _dropped_pool_workers() -> list[Any]:
    """Iterate a worker pool, then drop it without shutdown(); return its worker processes."""
    rs = MultiProcessingReadingService(2, multiprocessing_context="fork")
    dl = DataLoader2(_graph(), reading_service=rs)
    assert sorted(dl) == ITEMS
    return list(rs._loader._iterator._workers)


def test_a_dropped_pool_stops_its_workers_when_it_is_collected() -> None:
    # The service is left in a reference cycle: the cyclic collector frees it. Its workers get
    # their stop message and end by themselves (exit code 0). Torch's own __del__ ran after the
    # collector had finalized the queues' feeder threads: no stop message, a 5 s wait for each
    # worker, then SIGTERM (exit code -15).
    workers = _dropped_pool_workers()
    assert all(w.exitcode is None for w in workers)  # still running: nothing freed them yet
    gc.collect()
    assert [w.exitcode for w in workers] == [0, 0]
