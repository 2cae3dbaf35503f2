"""Counting what the stages of a graph skipped, wherever they ran."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import stages_of
from shardpipes.handlers import SkipStats

__all__ = ["graph_skips", "merge_skips", "skip_counters", "skips_from_dict", "skips_to_dict"]


def skip_counters(datapipe: IterDataPipe[Any]) -> list[SkipStats]:
    """The ``skipped`` counters of the stages of ``datapipe`` (a graph walk: find them once)."""
    found = (getattr(dp, "skipped", None) for dp in stages_of(datapipe))
    return [stats for stats in found if isinstance(stats, SkipStats)]


def graph_skips(datapipe: IterDataPipe[Any]) -> SkipStats:
    """Sum the ``skipped`` counters of every stage of ``datapipe``."""
    return merge_skips(skip_counters(datapipe))


def skips_to_dict(stats: SkipStats) -> dict[str, Any]:
    """A plain, picklable form of ``stats`` (sent from workers with their snapshots)."""
    return dataclasses.asdict(stats)


def skips_from_dict(state: Mapping[str, Any]) -> SkipStats:
    """Inverse of :func:`skips_to_dict`."""
    return SkipStats(
        samples=int(state["samples"]),
        shards=int(state["shards"]),
        examples=[tuple(e) for e in state["examples"]],
    )


def merge_skips(parts: Iterable[SkipStats]) -> SkipStats:
    """Add several counters together."""
    total = SkipStats()
    for part in parts:
        total.merge(part)
    return total
