"""The loader's side of ``mix()``: hand each epoch's plan to the mixer, find its resume shape, bind states.

Called from one line each in ``graph.apply_epoch_plan``, ``graph.resume_shape`` and the
loader's ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Shuffler
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes.dataloader2._pool import WorkerPoolIterDataPipe
from shardpipes.datapipes.iter._index_length import source_of
from shardpipes.datapipes.iter._lean import LeanBatcherIterDataPipe, LeanShufflerIterDataPipe
from shardpipes.datapipes.iter.base import is_one_to_one
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.datapipes.iter.mix import MixerIterDataPipe, MixResume, check_sources
from shardpipes.datapipes.iter.prefetch import PinMemoryIterDataPipe, PrefetcherIterDataPipe
from shardpipes.datapipes.iter.sync import ExactLengthIterDataPipe, FullSyncIterDataPipe
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Shape

__all__ = ["apply_mix_plan", "check_mixture_state", "mixers", "mixture_shape", "mixture_state"]


def mixers(datapipe: IterDataPipe[Any]) -> list[MixerIterDataPipe]:
    """The ``mix()`` stages of the graph."""
    return [
        dp
        for dp in get_all_graph_pipes(traverse_dps(datapipe))
        if isinstance(dp, MixerIterDataPipe)
    ]


def _loader_side(dp: Any) -> bool:
    # Stages the reading services add around a reader's graph; they pass items through
    # (fullsync with every reader of a mixture at the same length changes nothing).
    return isinstance(
        dp,
        ExactLengthIterDataPipe
        | PinMemoryIterDataPipe
        | WorkerPoolIterDataPipe
        | FullSyncIterDataPipe
        | PrefetcherIterDataPipe,
    )


def mixture_shape(
    datapipe: IterDataPipe[Any], numbering: Callable[[Any], list[tuple[Any, bool]]] | None = None
) -> tuple[Shape, Any] | str | None:
    """``None`` without a ``mix()``; else ``(shape after it, sample shuffle or None)``, or why it cannot resume by seeking.

    A mixture resumes by seeking when only one-to-one stages, at most one ``shuffle()`` and
    at most one ``batch()`` after it follow the ``mix()``, and each source has no random stage
    after its ``sharding_by_index``. ``numbering`` lists the graph's random stages (to number
    the shuffle as the loader seeds it).
    """
    found = mixers(datapipe)
    if not found:
        return None
    if len(found) > 1:
        return "the graph has several mix() stages"
    node: Any = datapipe
    batch: tuple[int | None, bool] = (None, False)
    shuffler: Any = None
    while not isinstance(node, MixerIterDataPipe):
        if node is None:
            return "the mix() is not on the graph's main path"
        if isinstance(node, Batcher | LeanBatcherIterDataPipe):
            if batch[0] is not None:
                return "two batch() stages after mix()"
            if shuffler is not None:
                return "a shuffle() after the batch() draws per batch and cannot be repositioned"
            batch = (node.batch_size, node.drop_last)
        elif isinstance(node, Shuffler | LeanShufflerIterDataPipe) and shuffler is None:
            shuffler = node
        elif callable(getattr(node, "set_seed", None)):
            return (
                f"{type(node).__name__} after mix() draws per reader and cannot be repositioned "
                "yet; it resumes by replay on the same topology only"
            )
        elif not (is_one_to_one(node) or _loader_side(node)):
            return f"{type(node).__name__} after mix() may change the number of items"
        node = source_of(node)
    for name, dp in zip(node.names, node.sources, strict=True):
        drawn = [
            type(s).__name__
            for s in get_all_graph_pipes(traverse_dps(dp))
            if callable(getattr(s, "set_seed", None)) and _after_sharder(s)
        ]
        if drawn:
            return (
                f"mix() source {name!r} has a {drawn[0]} after its sharding_by_index, which "
                "cannot be repositioned yet; a mixture with a sample shuffle in a source resumes "
                "by replay on the same topology only"
            )
    if shuffler is None or not shuffler._enabled:
        return Shape(batch[0], batch[1], None, None), None
    stages = [dp for dp, _ in numbering(datapipe)] if numbering is not None else []
    number = next((i for i, dp in enumerate(stages) if dp is shuffler), 0)
    return Shape(batch[0], batch[1], shuffler.buffer_size, number), shuffler


def _after_sharder(dp: Any) -> bool:
    """Whether a ``sharding_by_index`` feeds ``dp`` (a sample-level stage, not a shard-level one)."""
    return any(
        isinstance(s, IndexSharderIterDataPipe) for s in get_all_graph_pipes(traverse_dps(dp))
    )


def apply_mix_plan(
    datapipe: IterDataPipe[Any],
    plan: EpochPlan,
    numbering: Callable[[Any], list[tuple[Any, bool]]] | None = None,
) -> bool:
    """Hand the graph's ``mix()`` the epoch's plan; ``True`` when it has one (it then handles the resume).

    A resumed epoch's sample shuffle after the mix is told where to continue by the mixer.
    """
    found = mixers(datapipe)
    if not found:
        return False
    shape, shuffler = None, None
    if plan.resume:
        got = mixture_shape(datapipe, numbering)
        if not isinstance(got, tuple):
            raise ValueError(f"this graph cannot resume an epoch by seeking: {got}")
        shape, shuffler = got
    for mixer in found:
        mixer.set_plan(plan, shape)
    if shuffler is not None and callable(getattr(shuffler, "set_resume", None)):
        assert shape is not None
        shuffler.set_resume(
            MixResume(plan.resume, shape, plan.seed, plan.epoch, plan.after, mixer=found[0])
        )
    return True


_FOUND: weakref.WeakKeyDictionary[Any, list[MixerIterDataPipe]] = weakref.WeakKeyDictionary()


def mixture_state(datapipe: IterDataPipe[Any] | None) -> list[list[Any]] | None:
    """What a state of this graph's mixture is bound to (``None`` without a ``mix()``).

    The graph is walked once per graph (a state is taken every step).
    """
    if datapipe is None:
        return None
    found = _FOUND.get(datapipe)
    if found is None:
        found = _FOUND[datapipe] = mixers(datapipe)
    return found[0].fingerprint() if found else None


def check_mixture_state(datapipe: IterDataPipe[Any] | None, saved: Any) -> None:
    """Refuse a state whose mixture sources differ from this graph's, naming the source."""
    found = mixers(datapipe) if datapipe is not None else []
    if saved is None and not found:
        return
    if saved is None or not found:
        raise ValueError(
            "the loader state was taken "
            + (
                "without a mix() stage, this graph has one"
                if found
                else "with a mix() stage, this graph has none"
            )
        )
    check_sources(found[0], saved)
