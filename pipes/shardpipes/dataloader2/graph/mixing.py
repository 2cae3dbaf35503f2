"""The loader's side of ``mix()``: hand each epoch's plan to the mixer, find its resume shape, bind states.

Called from one line each in ``graph.apply_epoch_plan``, ``graph.resume_shape`` and the
loader's ``state_dict``/``load_state_dict``. A mixer is the stage that declares
``plans_mixture`` (``datapipes/iter/base.py``); everything here is a query on the graph's
description.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import DescribedStage, GraphDescription, describe
from shardpipes.datapipes.iter.mix import MixResume, check_sources
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Shape

__all__ = ["apply_mix_plan", "check_mixture_state", "mixers", "mixture_shape", "mixture_state"]

Graph = IterDataPipe[Any] | GraphDescription


def _described(graph: Graph) -> GraphDescription:
    return graph if isinstance(graph, GraphDescription) else describe(graph)


def mixers(datapipe: Graph) -> list[Any]:
    """The ``mix()`` stages of the graph."""
    return _described(datapipe).mixers()


def _passes_count(node: DescribedStage) -> bool:
    # One item per item, or a stage the reading services put around a reader's graph in the
    # main process (the worker pool, pin_memory; fullsync with every reader of a mixture at
    # the same length changes nothing).
    return node.traits.one_to_one or node.traits.main_process


def mixture_shape(
    datapipe: Graph, numbering: Callable[[Any], list[tuple[Any, bool]]] | None = None
) -> tuple[Shape, Any] | str | None:
    """``None`` without a ``mix()``; else ``(shape after it, sample shuffle or None)``, or why it cannot resume by seeking.

    A mixture resumes by seeking when only one-to-one stages, at most one ``shuffle()`` and
    at most one ``batch()`` after it follow the ``mix()``, and each source has no random stage
    after its ``sharding_by_index``. ``numbering`` is not used any more (the description
    numbers the random stages); it is kept for callers that pass it.
    """
    graph = _described(datapipe)
    found = graph.mixers()
    if not found:
        return None
    if len(found) > 1:
        return "the graph has several mix() stages"
    batch: tuple[int | None, bool] = (None, False)
    shuffler: DescribedStage | None = None
    mixer: DescribedStage | None = None
    for node in graph.path():
        traits = node.traits
        if traits.plans_mixture:
            mixer = node
            break
        if traits.batches:
            if batch[0] is not None:
                return "two batch() stages after mix()"
            if shuffler is not None:
                return "a shuffle() after the batch() draws per batch and cannot be repositioned"
            batch = (node.stage.batch_size, node.stage.drop_last)
        elif traits.seeks == "buffer" and shuffler is None:
            shuffler = node
        elif traits.random:
            return (
                f"{node.name} after mix() draws per reader and cannot be repositioned "
                "yet; it resumes by replay on the same topology only"
            )
        elif not _passes_count(node):
            return f"{node.name} after mix() may change the number of items"
    if mixer is None:
        return "the mix() is not on the graph's main path"
    for name, source in zip(mixer.stage.names, mixer.stage.sources, strict=True):
        drawn = [n.name for n in graph.within(source) if n.traits.random and n.after_sharding]
        if drawn:
            return (
                f"mix() source {name!r} has a {drawn[0]} after its sharding_by_index, which "
                "cannot be repositioned yet; a mixture with a sample shuffle in a source resumes "
                "by replay on the same topology only"
            )
    buffer = None
    if shuffler is not None and getattr(shuffler.stage, "_enabled", True):
        buffer = shuffler.stage.buffer_size
    if shuffler is None or not buffer:
        return Shape(batch[0], batch[1], None, None), None
    stages = [dp for dp, _ in graph.random_stages()]
    number = next((i for i, dp in enumerate(stages) if dp is shuffler.stage), 0)
    return Shape(batch[0], batch[1], buffer, number), shuffler.stage


def apply_mix_plan(
    datapipe: Graph,
    plan: EpochPlan,
    numbering: Callable[[Any], list[tuple[Any, bool]]] | None = None,
) -> bool:
    """Hand the graph's ``mix()`` the epoch's plan; ``True`` when it has one (it then handles the resume).

    A resumed epoch's sample shuffle after the mix is told where to continue by the mixer.
    """
    graph = _described(datapipe)
    found = graph.mixers()
    if not found:
        return False
    shape, shuffler = None, None
    if plan.resume:
        got = mixture_shape(graph)
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


_FOUND: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def mixture_state(datapipe: IterDataPipe[Any] | None) -> list[list[Any]] | None:
    """What a state of this graph's mixture is bound to (``None`` without a ``mix()``).

    The graph is described once per graph (a state is taken every step).
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
