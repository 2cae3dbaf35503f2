"""A forked child never collects what it inherited, so it never finalizes its parent's garbage.

A process forked without ``exec`` starts with a copy of every object of its parent, the garbage
the parent had not collected yet included. Collected in the child, that garbage's finalizers run
there: a Ray ``ObjectRefGenerator`` left in a reference cycle (an exception's traceback, say)
called Ray's gRPC client in a loader worker, whose threads do not survive a fork, and the worker
hung. Whoever forks (our worker pool, a ``torchdata.nodes`` mapper in processes, torch's
``DataLoader`` over a ``WebDataset``), the same two hooks run around ``os.fork()``:

- in the parent, just before the fork: its young garbage (generations 0 and 1) is collected
  there, where its finalizers belong. This also sets the collector's allocation count to zero,
  so no collection can start in the child before the next hook (one needs 700 allocations of
  tracked objects; the at-fork hooks between make a few);
- in the child, first among our hooks: ``gc.freeze()`` moves every inherited object, the
  parent's older garbage included, out of the collector's reach for good, as Python's
  documentation suggests around ``fork()``. The child's own objects are collected as usual.

A full collection before each fork would also finalize the parent's older garbage, but costs
0.3 s over 2 million objects; frozen in the child, that garbage is finalized by the parent alone,
whenever its own collector gets to it. A parent that disabled the collector (``gc.disable()``)
is not collected. ``spawn`` and ``forkserver`` children start from a fresh interpreter and
inherit nothing. The hooks are installed once, when ``shardpipes`` is imported.
"""

from __future__ import annotations

import gc
import os

__all__: list[str] = []


def _collect_young_before_fork() -> None:
    if gc.isenabled():
        gc.collect(1)


def _freeze_inherited_in_child() -> None:
    gc.freeze()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_collect_young_before_fork, after_in_child=_freeze_inherited_in_child
    )
