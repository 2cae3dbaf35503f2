"""Telemetry's worker figures of a rank's logical readers, from the reports of their leases.

A worker process reports running totals since it started (``dataloader2/telemetry/reporter.py``);
under the Ray pool each lease of a logical reader reports its own, from zero, and a reader has
a lease per epoch, more after a move or a loss. :class:`ReaderFigures` adds up, for each logical
reader, the latest report of each of its leases, so that telemetry sees one worker per logical
reader with running totals, as it sees the worker pool's. Pure bookkeeping, no Ray.
"""

from __future__ import annotations

import copy
from typing import Any

from shardpipes.dataloader2.telemetry.reporter import add_storage

__all__ = ["ReaderFigures", "add_figures"]

_SUMMED = ("wall", "busy", "cpu", "items", "ticks", "sampler_cpu")


def add_figures(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add the report ``more`` into ``into`` (times, items, CPU per stage, storage)."""
    for key in _SUMMED:
        into[key] += more[key]
    stages = into["stages"]
    for name, cpu in more["stages"].items():
        stages[name] = stages.get(name, 0.0) + cpu
    add_storage(into["storage"], more["storage"])


class ReaderFigures:
    """Running totals of each logical reader over its leases.

    ``wall`` is the time its leases ran (two at once during a move), ``busy`` the part spent
    making items; the items a move makes twice count twice: they are work the pool did.
    """

    def __init__(self) -> None:
        self._done: dict[int, dict[str, Any]] = {}  # reader -> its ended leases' totals
        self._open: dict[int, tuple[int, dict[str, Any]]] = {}  # fence -> (reader, latest)

    def take(self, reader: int, fence: int, figures: dict[str, Any]) -> dict[str, Any]:
        """The latest report of lease ``fence`` of ``reader``; return the reader's totals."""
        self._open[fence] = (reader, figures)
        return self.of(reader)

    def of(self, reader: int) -> dict[str, Any]:
        """``reader``'s totals over its leases, as of their latest reports."""
        total = copy.deepcopy(self._done.get(reader)) or _zero()
        for owner, figures in self._open.values():
            if owner == reader:
                add_figures(total, figures)
        return total

    def close(self) -> None:
        """The leases ended (the epoch did): their latest reports join their readers' totals."""
        for reader, figures in self._open.values():
            add_figures(self._done.setdefault(reader, _zero()), figures)
        self._open.clear()


def _zero() -> dict[str, Any]:
    return {
        **dict.fromkeys(_SUMMED, 0),
        "stages": {},
        "storage": {"bytes_read": 0, "opened": 0, "closed": 0, "retries": {}},
    }
