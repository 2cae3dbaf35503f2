"""Counting what the stages of a graph skipped and dropped, wherever they ran; what fetching learnt."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import registered_names, stage_name, stages_of
from shardpipes.datapipes.iter.base import traits_of
from shardpipes.errors import EmptyEpochWarning
from shardpipes.handlers import SkipStats
from shardpipes.storage.pool import fetch_figures

__all__ = [
    "FetchChanges",
    "StageFlow",
    "check_epoch",
    "fetch_stats",
    "flow_stages",
    "flows_to_list",
    "graph_skips",
    "merge_flows",
    "merge_skips",
    "read_flows",
    "skip_counters",
    "skips_from_dict",
    "skips_to_dict",
    "source_of_graph",
]


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


# --- what the stages that can drop items dropped -----------------------------------------------
#
# An epoch of nothing must not pass silently (a map that swallows errors, a filter that
# rejects everything, a handler that skips every sample). Counting costs nothing on the hot
# path: only the stages that can drop items count, and only what they drop: ``filter``
# (dropped items, and iterations that passed anything on) and the stages with a handler
# (their ``skipped`` counters). The loader compares the totals at the start and end of each
# epoch.


@dataclasses.dataclass(frozen=True)
class StageFlow:
    """Totals of one stage that can drop items.

    ``dropped``: items (or shards) dropped; ``passing``: iterations that passed at least one
    item on (``None`` for a stage that does not count it); ``unit``: what ``dropped`` counts.
    """

    name: str
    dropped: int
    passing: int | None
    unit: str = "items"


def flow_stages(datapipe: IterDataPipe[Any]) -> list[Any]:
    """The stages of ``datapipe`` that can drop items and count it, from the output (find once)."""
    return [
        dp
        for dp in stages_of(datapipe)
        if traits_of(dp).counts_drops or isinstance(getattr(dp, "skipped", None), SkipStats)
    ]


def read_flows(stages: Iterable[Any]) -> list[StageFlow]:
    """The current totals of ``stages`` (from :func:`flow_stages`)."""
    out = []
    registered = registered_names()
    for dp in stages:
        name = stage_name(dp, registered)  # what the stage declares it is, as telemetry names it
        if traits_of(dp).counts_drops:
            out.append(StageFlow(name, dp.dropped, dp.passing))
        else:
            skipped: SkipStats = dp.skipped
            unit = "shards" if skipped.shards and not skipped.samples else "items"
            out.append(StageFlow(name, skipped.samples + skipped.shards, None, unit))
    return out


def flows_to_list(flows: Iterable[StageFlow]) -> list[list[Any]]:
    """A plain, picklable form of ``flows`` (sent from workers at the end of each epoch)."""
    return [[f.name, f.dropped, f.passing, f.unit] for f in flows]


def merge_flows(parts: Iterable[list[list[Any]]]) -> list[StageFlow]:
    """Add the totals of several copies of one graph (the workers'), stage by stage."""
    total: list[StageFlow] = []
    for part in parts:
        for i, (name, dropped, passing, unit) in enumerate(part):
            if i == len(total):
                total.append(StageFlow(name, dropped, passing, unit))
                continue
            have = total[i]
            both = None if have.passing is None or passing is None else have.passing + passing
            total[i] = StageFlow(name, have.dropped + dropped, both, unit)
    return total


def source_of_graph(datapipe: IterDataPipe[Any]) -> str:
    """The graph's source stage, with its length when it has one (for the empty-epoch warning)."""
    source = stages_of(datapipe)[-1]
    try:
        size = f" holds {len(source)} items"
    except TypeError:
        size = ""
    return f"its source {stage_name(source)}{size}"


def check_epoch(
    epoch: int,
    yielded: int,
    before: list[StageFlow],
    after: list[StageFlow],
    source: str,
    *,
    carried: bool = False,
) -> None:
    """Warn once if the epoch yielded nothing, or a stage dropped all it received this epoch.

    ``carried``: a stage of the graph (``fixed_length``) continues its source's iteration
    from one epoch into the next, so a filter's iteration spans epochs and only an epoch of
    nothing is checked.
    """
    deltas = []
    for i, end in enumerate(after):
        start = before[i] if i < len(before) and before[i].name == end.name else None
        dropped = end.dropped - (start.dropped if start is not None else 0)
        passing = end.passing
        if passing is not None and start is not None and start.passing is not None:
            passing -= start.passing
        deltas.append(StageFlow(end.name, dropped, passing, end.unit))
    # A stage dropped all it received: it dropped some and passed nothing on (for a stage that
    # does not count what it passes, only known when nothing reached the output).
    all_dropped = [
        d for d in deltas if d.dropped and (d.passing == 0 or (d.passing is None and not yielded))
    ]
    if yielded == 0:
        culprit = next((d for d in deltas if d.dropped), None)  # the nearest to the output
        if culprit is None or culprit not in all_dropped:
            why = f"no filter or handler dropped everything; {source}"
        elif culprit.passing is None:
            why = (
                f"{culprit.name} received {culprit.dropped} {culprit.unit} and skipped all of "
                "them under its handler"
            )
        else:
            why = f"{culprit.name} received {culprit.dropped} items and dropped all of them"
        message = f"epoch {epoch} yielded no items: {why}"
    elif all_dropped and not carried:
        culprit = all_dropped[0]
        message = (
            f"epoch {epoch}: {culprit.name} received {culprit.dropped} items and dropped all of "
            "them (the items after it came from another branch of the graph)"
        )
    else:
        return
    warnings.warn(message, EmptyEpochWarning, stacklevel=4)


# --- what each reader's fetching learnt ----------------------------------------------------------
#
# Each process that reads remote objects learns how many requests to keep in flight
# (storage/adapt.py); a worker's figures travel with its bundles when they changed, so
# ``DataLoader2.stats()["fetch"]`` shows each reader's, as of its latest bundle.


class FetchChanges:
    """This process's fetch figures (``storage.pool.fetch_figures``) when they changed since the last call.

    Called by a worker once per bundle it sends; ``None`` when nothing changed (or nothing
    remote was read).
    """

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any] | None:
        """The figures, if they changed; else ``None``."""
        now = fetch_figures()
        if now is None or now == self._last:
            return None
        self._last = now
        return now


def fetch_stats(readers: Mapping[int, dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``stats()["fetch"]``: each reader's figures in reader order, with ``worker``; ``None`` if none.

    ``readers``: the workers' latest figures by worker id, or ``None`` when the graph is read in
    this process (then this process's own figures, as ``worker`` ``None``).
    """
    if readers is None:
        own = fetch_figures()
        return None if own is None else [{"worker": None, **own}]
    if not readers:
        return None
    return [{"worker": w, **figures} for w, figures in sorted(readers.items())]
