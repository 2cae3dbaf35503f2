"""Forked workers never run the finalizers of garbage their parent left uncollected.

A Ray ``ObjectRefGenerator`` caught in a reference cycle in the trainer, collected in a forked
worker, calls Ray's gRPC client there and hangs the worker (seen in the Ray cluster tests). Here
a plain finalizer stands for it: it records the process it runs in.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper


class _Marks:
    """Finalized in a cycle: writes the pid it was finalized in to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.me = self  # a cycle: only the cyclic collector frees it

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def _collect(x: int) -> int:
    gc.collect()  # as a user's stage may: collects whatever the worker holds that is garbage
    return x


def test_workers_do_not_finalize_what_the_trainer_left(tmp_path) -> None:
    marks = tmp_path / "finalized"
    before = gc.get_threshold()
    gc.set_threshold(10**6)  # no automatic collection here: the garbage is still there at fork
    try:
        _Marks(os.fspath(marks))  # garbage from the start, never collected by reference counts
        dp: Any = IterableWrapper(range(40)).sharding_filter().map(_collect)
        rs = MultiProcessingReadingService(2, multiprocessing_context="fork")
        with DataLoader2(dp, reading_service=rs) as dl:
            assert sorted(dl) == list(range(40))
    finally:
        gc.set_threshold(*before)
    gc.collect()
    pids = marks.read_text().split() if marks.exists() else []
    # Finalized once, in this process (by the loader's collection before it forks its workers).
    assert pids == [str(os.getpid())]
