"""An epoch of ``DataLoader2``: its seed, its start (graph made once, services told), its run.

Functions of the loader object (``DataLoader2`` keeps the attributes; this module is where an
epoch begins and ends). Everything a service is asked goes through its protocol
(:mod:`shardpipes.dataloader2.protocol`).
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Generator, Iterator
from typing import Any

import torch
import torch.distributed as dist

from shardpipes.dataloader2._stats import check_epoch, fetch_stats
from shardpipes.dataloader2.graph import carries_across_epochs, lean_graph, refuse_unsupported
from shardpipes.dataloader2.graph.identity import carry_ids
from shardpipes.dataloader2.random.seed_generator import SeedGenerator, int64_seed
from shardpipes.dataloader2.reading_service import handed
from shardpipes.dataloader2.workers.graph_copy import copy_graph
from shardpipes.datapipes.iter.base import traits_of
from shardpipes.errors import AttestationWarning, ShardingWarning
from shardpipes.handlers import SkipStats
from shardpipes.plan.epoch import EpochPlan

__all__ = ["make_graph", "next_seed", "run", "skipped_total", "start", "stats", "warn_unsplit"]

logger = logging.getLogger("shardpipes.dataloader2.dataloader2")


def skipped_total(rs: Any) -> int:
    """Samples and shards the service's stages skipped so far."""
    found = rs.skipped()
    return found.samples + found.shards if found is not None else 0


def warn_unsplit(rs: Any) -> None:
    """Warn when several ranks run and the service does not split the data by rank."""
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if ranks > 1 and not rs.topology().distributed:
        warnings.warn(
            f"torch.distributed is initialised with {ranks} ranks but the reading service has "
            "no DistributedReadingService: every rank reads the same data",
            ShardingWarning,
            stacklevel=3,
        )


def stats(dl: Any) -> dict[str, Any]:
    """``DataLoader2.stats()``: this rank's counters so far."""
    skipped = dl.reading_service.skipped() or SkipStats()
    out: dict[str, Any] = {
        "epoch": dl._epochs_run - 1,
        "yielded": dl._consumed,
        "skipped_samples": skipped.samples,
        "skipped_shards": skipped.shards,
        "skipped_examples": list(skipped.examples),
    }
    fetch = fetch_stats(getattr(dl.reading_service, "fetch_figures", lambda: None)())
    if fetch is not None:  # requests in flight each reader learnt (storage/adapt.py)
        out["fetch"] = fetch
    sync = getattr(dl._graph, "stats", None) if traits_of(dl._graph).syncs_ranks else None
    if sync is not None:  # the last stage evens out the ranks (fullsync(), or the user's own)
        out["sync"] = sync.as_dict()
    return out


def make_graph(dl: Any) -> Any:
    """The graph the loader iterates, made on its first epoch from its copy of the user's."""
    refuse_unsupported(dl.datapipe)  # before any reader starts
    graph = lean_graph(copy_graph(dl.datapipe))
    if dl._attest.wants_ids:  # ids beside the samples, to their batches (batch.ids)
        graph, note = carry_ids(graph)
        if note is not None:
            warnings.warn(note, AttestationWarning, stacklevel=3)
    rs = dl.reading_service
    if dl.reading_service_state is not None:
        if not rs.checkpointable:
            raise TypeError("Cannot restore from non-checkpointable reading service")
        return rs.restore(graph, dl.reading_service_state)
    return rs.initialize(graph)


def next_seed(dl: Any) -> tuple[int, int]:
    """The (seed, epoch) of the epoch that starts now."""
    if dl._pending is not None:
        found: tuple[int, int] = dl._pending
        dl._pending = None
        return found
    if dl._seed is not None:
        dl._epoch += 1
        return dl._seed, dl._epoch - 1
    # No seed(): torch's default generator decides (moved on, so each epoch differs); the
    # service makes every rank use the same draw.
    drawn = int(torch.randint(0, 2**63 - 1, ()).item())
    return dl.reading_service.share_seed(drawn), 0


def start(dl: Any) -> Generator[Any, None, None]:
    """Begin an epoch: seed it, tell the service, check the ranks agree; return its items."""
    rs = dl.reading_service
    seed, epoch = next_seed(dl)
    dl._seeded_epoch = dl._seed is not None
    plan = EpochPlan(int64_seed(seed), epoch, resume=dl._resume_segments)
    dl._epoch_seed = seed
    dl._epochs_run += 1
    skip, dl._skip, dl._resume_segments = dl._skip, 0, ()
    # Set now, not when the generator starts: a state taken after iter() but before the
    # first item must point at this epoch.
    dl._current = plan
    dl._consumed = plan.resume[-1].consumed if plan.resume else skip
    dl._skipped_at_start = skipped_total(rs)
    dl._open_iteration = True
    try:
        found = rs.initialize_iteration(handed(rs, plan))
        if callable(found) and not isinstance(found, SeedGenerator | EpochPlan):
            dl._graph = found(dl._graph)  # a 0.9 service's iter_reset_fn
        _start_attest(dl, seed, plan.epoch)
        fresh = not skip and not plan.resume  # a whole epoch: check it yields something
        before = rs.flows() if fresh else None
        dl._datapipe_iter = iter(dl._graph)
    except BaseException:
        dl._end_iteration()
        raise
    return run(dl, dl._datapipe_iter, plan, skip, before)


def _start_attest(dl: Any, seed: int, epoch: int) -> None:
    """The ranks' first check of the epoch, on the collectives the service offers."""
    dl._describe()
    rs = dl.reading_service
    found = rs.collectives()
    dl._attest.source = dl.datapipe
    dl._attest.start_epoch(
        found.group if found is not None else None,
        found is not None,
        seed,
        epoch,
        dl._consumed,
        found.timeout if found is not None else 1800.0,
        rs.topology().readers,
    )


def run(
    dl: Any, it: Iterator[Any], plan: EpochPlan, skip: int, before: Any
) -> Generator[Any, None, None]:
    """Yield the epoch's items, counting them; at its end check and log it."""
    yielded = 0
    try:
        # Replay: the epoch is deterministic, so the items after the first `skip` are
        # exactly those the interrupted run would have yielded next.
        if skip and sum(1 for _ in itertools.islice(it, skip)) < skip:
            raise ValueError(
                f"the restored state says {skip} items of epoch {plan.epoch} were "
                "consumed, but this epoch has fewer: is it the same graph and data?"
            )
        attest = dl._attest.yielded
        tel = dl.telemetry  # dl.watch(): the wait for each item handed out (docs/telemetry.md)
        for item in tel.batches(it, dl._graph) if tel is not None else it:
            dl._consumed += 1
            yielded += 1
            attest(item, dl._consumed)
            yield item
        dl._attest.end_epoch(dl._epoch_seed, plan.epoch, dl._consumed)
        dl._current = None  # the epoch is complete
        _log_epoch(dl, dl._epochs_run - 1)
        after = dl.reading_service.flows() if before is not None else None
        if before is not None and after is not None:
            carried = dl.datapipe is not None and carries_across_epochs(dl.datapipe)
            check_epoch(plan.epoch, yielded, before[0], after[0], after[1], carried=carried)
    finally:
        dl._end_iteration()


def _log_epoch(dl: Any, epoch: int) -> None:
    stats = dl.stats()
    skipped = stats["skipped_samples"] + stats["skipped_shards"]
    log = logger.warning if skipped else logger.info
    log(
        "epoch %d: %d items; skipped so far: %d samples, %d shards%s",
        epoch,
        stats["yielded"],
        stats["skipped_samples"],
        stats["skipped_shards"],
        f" (first: {stats['skipped_examples'][0][0]}: {stats['skipped_examples'][0][1]})"
        if skipped
        else "",
    )
