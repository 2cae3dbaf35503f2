"""The stage base, its traits, and registration: what every shardpipes stage is built on.

A stage declares its **traits** as class attributes, and the loader reads them (all at once
with :func:`traits_of`, into the graph's one description, ``datapipes/iter/_description.py``;
one at a time with :func:`is_one_to_one`, :func:`range_step`, :func:`in_main_process`,
:func:`is_resumable`) instead of keeping lists of classes; ``docs/writing-a-stage.md`` shows a
stage that keeps every guarantee. Torch's own stages (``map``, ``shuffle``, ...) get the traits
of the lean stage that stands in for them (``stands_for``).

Why our stages skip torch's per-element iterator hook: torch's ``_IterDataPipeMeta`` wraps each
``__iter__`` generator so every ``next()`` enters a profiler ``record_function`` and checks
iterator validity. Measured on the development machine that costs ~1.1 us per element per stage,
about as much as parsing a tar member; a seven-stage pipeline of small samples spends more time
in the hook than in the work. Our stages keep their plain generator ``__iter__`` (the hook's
only other job, calling ``reset()`` on a new iterator, is done here). Torch's ``shuffle``,
``map`` and ``filter`` run as subclasses that drop the hook too (``_unhooked.py``); its other
stages (``batch``, once per batch, ...) keep it.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes._decorator import functional_datapipe
from torch.utils.data.datapipes._hook_iterator import _SnapshotState
from torch.utils.data.datapipes.iter.sharding import _ShardingIterDataPipe

__all__ = [
    "IDS",
    "SEEKS",
    "UNITS",
    "PicklesRng",
    "SeededRng",
    "StageIterDataPipe",
    "Traits",
    "check_picklable_fn",
    "in_main_process",
    "is_one_to_one",
    "is_random",
    "is_resumable",
    "range_step",
    "register",
    "traits_of",
    "widen",
]

T = TypeVar("T")
_C = TypeVar("_C", bound=type)


#: The units of :attr:`StageIterDataPipe.range_to_samples`, from the sharder's to the samples.
UNITS = ("ranges", "streams", "members", "samples")

#: The seek protocols of :attr:`StageIterDataPipe.seeks`: how a stage continues a resumed epoch.
SEEKS = ("reads", "buffer", "count")

#: How sample ids pass a stage between the reader and ``batch()`` (:attr:`StageIterDataPipe.carries_ids`).
IDS = ("untouched", "in_step")

_STAND_INS: dict[type, type] = {}


class StageIterDataPipe(IterDataPipe[T]):
    """Base of shardpipes stages: a plain generator ``__iter__``, no per-element hook, and traits.

    Traits (class attributes, or properties for a stage that answers per instance; the defaults
    promise nothing):

    - ``one_to_one``: yields exactly one item for each item it reads, so a reader's item count
      after ``sharding_by_index`` still follows from the index (a stage that may skip an item
      under an error handler counts too: the exact-length guard then pads).
    - ``range_to_samples``: its step from the sharder's sample ranges to samples, as
      ``(what it reads, what it yields)`` among :data:`UNITS`; the steps from ``"ranges"`` to
      ``"samples"`` turn each range of k samples into k samples.
    - ``main_process``: stays in the main process when the rest of the graph moves into worker
      processes (it must see all workers' output, or the main process's memory).
    - ``resumable``: when an epoch resumes by seeking, ``set_resume(resume)`` hands it the
      epoch's :class:`~shardpipes.plan.epoch.Resume` (``None`` for a fresh epoch) and it
      continues exactly where the uninterrupted epoch was; stages that keep a position between
      items (a shuffle buffer, a counter) must be resumable to sit after ``sharding_by_index``.
    - ``seeks``: how a resumable stage continues, among :data:`SEEKS`: ``"reads"`` (it is the
      sharder and repositions what the reader reads: ``sharding_by_index``), ``"buffer"`` (a
      buffered shuffle with ``buffer_size`` that replays its draws to the position:
      ``shuffle()``), ``"count"`` (a count that continues from ``Resume.yielded()``). Default:
      ``"buffer"`` for a resumable random stage, ``"count"`` for any other resumable one.
    - ``batches``: groups items into lists of ``batch_size`` (attributes ``batch_size`` and
      ``drop_last``), like ``batch()``.
    - ``carries_ids``: how each sample's id can pass it between ``webdataset()`` and
      ``batch()``, among :data:`IDS`: ``"untouched"`` (it moves items without looking at them,
      maybe reordered: ``shuffle()``, ``prefetch()``), ``"in_step"`` (one-to-one, and it yields
      each output before it reads the next item: ``map()``, ``decode()``).
    - ``plans_mixture``: a ``mix()``: its ``sources`` (named ``names``) are read as the epoch's
      plan says (``set_plan``), and a loader state is bound to its ``fingerprint()``.
    - ``spans_epochs``: continues from one epoch into the next (``fixed_length()``).
    - ``rewrites_urls``: yields other names for the shards it reads (a cache's local paths).
    - ``syncs_ranks``: evens out the ranks' lengths as items come (``fullsync()``). It is the
      last stage of a distributed graph: ``DistributedReadingService`` adds no ``fullsync()``
      after it, hands it its process group (``set_process_group(group)``), refuses it anywhere
      but last, and ``dl.stats()["sync"]`` is its ``stats.as_dict()`` when it has ``stats``.
    - ``counts_drops``: may drop items and counts it, in the attributes ``dropped`` (items
      dropped, over all iterations) and ``passing`` (iterations that passed an item on), which
      the loader reads to warn about an epoch where it dropped everything (``filter()``).
      Read from the stage's own class: a lean stand-in's does not pass to the torch stage.
    - ``seek_refusal``: why a graph with this stage cannot resume by seeking (a message), or
      ``None``.
    - ``stands_for``: a lean stand-in's torch stage, whose traits are then this stage's.

    A stage is random because it has ``set_seed``, and a sharding point because it is torch's
    sharding kind (``apply_sharding``); neither is declared again. A stage that can send large
    members by their place through shared memory has ``enable_placed_output()``
    (``SupportsPlacedOutput``, ``formats/placed.py``), which the worker asks for.
    """

    one_to_one: ClassVar[bool] = False
    range_to_samples: ClassVar[tuple[str, str] | None] = None
    main_process: ClassVar[bool] = False
    resumable: ClassVar[bool] = False
    seeks: ClassVar[str | None] = None
    batches: ClassVar[bool] = False
    carries_ids: ClassVar[str | None] = None
    plans_mixture: ClassVar[bool] = False
    spans_epochs: ClassVar[bool] = False
    rewrites_urls: ClassVar[bool] = False
    syncs_ranks: ClassVar[bool] = False
    counts_drops: ClassVar[bool] = False
    # Not a ClassVar: a stage may set its own refusal per instance (a mixer without an index).
    seek_refusal: str | None = None
    stands_for: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        replaced = cls.__dict__.get("stands_for")
        if replaced is not None:
            _STAND_INS[replaced] = cls
        hooked = cls.__dict__.get("__iter__")
        inner = getattr(hooked, "__wrapped__", None)
        if inner is not None:
            cls.__iter__ = _plain_iter(inner)  # type: ignore[method-assign]

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")


def _declaring(dp: Any) -> type:
    """The class whose traits ``dp`` has: its own, or its lean stand-in's for a torch stage."""
    for kind in type(dp).__mro__:
        if kind in _STAND_INS:
            return _STAND_INS[kind]
    return type(dp)


def _trait(dp: Any, name: str, default: Any) -> Any:
    # A stage's own traits are read from the instance, so a stage may answer per instance (a
    # property: webdataset's RandomMix is one-to-one unless with_epoch/repeat was set); a torch
    # stage's are its lean stand-in's class attributes.
    kind = _declaring(dp)
    return getattr(dp if kind is type(dp) else kind, name, default)


def is_one_to_one(dp: Any) -> bool:
    """Whether ``dp`` yields one item per item it reads (trait ``one_to_one``)."""
    return bool(_trait(dp, "one_to_one", False))


def range_step(dp: Any) -> tuple[str, str] | None:
    """``dp``'s step from sample ranges to samples (trait ``range_to_samples``), or ``None``."""
    step: tuple[str, str] | None = _trait(dp, "range_to_samples", None)
    return step


def in_main_process(dp: Any) -> bool:
    """Whether ``dp`` stays in the main process (trait ``main_process``)."""
    return bool(_trait(dp, "main_process", False))


def is_resumable(dp: Any) -> bool:
    """Whether ``dp`` takes the epoch's ``Resume`` and continues exactly (trait ``resumable`` or ``seeks``)."""
    return bool(_trait(dp, "resumable", False)) or _trait(dp, "seeks", None) is not None


def is_random(dp: Any) -> bool:
    """Whether ``dp`` draws random numbers: it has ``set_seed``, which the loader calls."""
    return callable(getattr(dp, "set_seed", None))


@dataclass(frozen=True)
class Traits:
    """Everything a stage declares, read once (:func:`traits_of`); see :class:`StageIterDataPipe`."""

    one_to_one: bool = False
    range_to_samples: tuple[str, str] | None = None
    main_process: bool = False
    seeks: str | None = None
    batches: bool = False
    carries_ids: str | None = None
    plans_mixture: bool = False
    spans_epochs: bool = False
    rewrites_urls: bool = False
    syncs_ranks: bool = False
    counts_drops: bool = False
    seek_refusal: str | None = None
    random: bool = False
    sharding: bool = False

    @property
    def resumable(self) -> bool:
        """Whether the stage takes the epoch's ``Resume`` (it has a seek protocol)."""
        return self.seeks is not None


def _checked(name: str, value: Any, allowed: tuple[str, ...], dp: Any) -> Any:
    if value is not None and value not in allowed:
        raise ValueError(
            f"{type(dp).__name__} declares {name}={value!r}; it should be one of {allowed} or None"
        )
    return value


def traits_of(dp: Any) -> Traits:
    """All of ``dp``'s traits, as declared (or as its lean stand-in declares them for a torch stage)."""
    random_ = is_random(dp)
    seeks = _checked("seeks", _trait(dp, "seeks", None), SEEKS, dp)
    if seeks is None and _trait(dp, "resumable", False):
        seeks = "buffer" if random_ else "count"
    refusal = _trait(dp, "seek_refusal", None)
    return Traits(
        one_to_one=is_one_to_one(dp),
        range_to_samples=range_step(dp),
        main_process=in_main_process(dp),
        seeks=seeks,
        batches=bool(_trait(dp, "batches", False)),
        carries_ids=_checked("carries_ids", _trait(dp, "carries_ids", None), IDS, dp),
        plans_mixture=bool(_trait(dp, "plans_mixture", False)),
        spans_epochs=bool(_trait(dp, "spans_epochs", False)),
        rewrites_urls=bool(_trait(dp, "rewrites_urls", False)),
        syncs_ranks=bool(_trait(dp, "syncs_ranks", False)),
        # The counters are the instance's: a torch stage left in place has none.
        counts_drops=bool(getattr(dp, "counts_drops", False)),
        seek_refusal=str(refusal) if refusal else None,
        random=random_,
        # torch's own declaration of a sharding point: what its apply_sharding looks for
        sharding=isinstance(dp, _ShardingIterDataPipe),
    )


def _plain_iter(gen_fn: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    def __iter__(self: Any) -> Iterator[Any]:
        self.reset()
        return gen_fn(self)

    __iter__.__doc__ = gen_fn.__doc__
    __iter__.__qualname__ = gen_fn.__qualname__
    return __iter__


def register(name: str) -> Callable[[_C], _C]:
    """Register a stage under its functional name through torch's ``functional_datapipe``.

    Re-importing shardpipes (``importlib.reload``, a second import path) replaces our own
    earlier registration; a name held by another package is an error that says which.
    """

    def deco(cls: _C) -> _C:
        taken = IterDataPipe.functions.get(name)
        if taken is not None:
            owner = taken.args[0] if hasattr(taken, "args") and taken.args else None
            # Our own earlier registration, or an adapter's subclass that widened it (``widen``).
            same = owner is not None and any(
                f"{k.__module__}.{k.__qualname__}" == f"{cls.__module__}.{cls.__qualname__}"
                for k in getattr(owner, "__mro__", (owner,))
            )
            if not same:
                where = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else "?"
                raise RuntimeError(
                    f"functional name {name!r} is already registered by {where}; shardpipes "
                    "cannot be imported in the same process as another DataPipe library that "
                    "registers it (for example torchdata<0.10's torchdata.datapipes)"
                )
            del IterDataPipe.functions[name]
        functional_datapipe(name)(cls)
        return cls

    return deco


def widen(name: str, cls: type) -> None:
    """Let ``cls``, an adapter's subclass of the stage registered as ``name``, take the name over.

    For an adapter whose API uses one of our functional names with other arguments (torchdata
    0.9's ``on_disk_cache(filepath_fn=...)``): the subclass translates those calls and leaves
    ours to the core stage, which never learns about the adapter.
    """
    taken = IterDataPipe.functions.get(name)
    owner = taken.args[0] if taken is not None and hasattr(taken, "args") and taken.args else None
    again = owner is not None and _qualname(owner) == _qualname(cls)  # a re-imported module
    if owner is None or not (again or (isinstance(owner, type) and issubclass(cls, owner))):
        raise RuntimeError(
            f"{cls.__qualname__} can only widen a stage it subclasses; {name!r} is {owner!r}"
        )
    del IterDataPipe.functions[name]
    functional_datapipe(name)(cls)


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"


def check_picklable_fn(fn: Callable[..., Any], what: str) -> None:
    """Warn when ``fn`` cannot be pickled to worker processes (a lambda or a local function)."""
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
    qualname = getattr(fn, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        kind = "Local" if "<locals>" in qualname else "Lambda"  # torch's wording comes first
        warnings.warn(
            f"{kind} function is not supported by pickle: "
            f"{what} {qualname} is a lambda or a local function; it cannot be pickled to worker "
            "processes started with 'spawn' or 'forkserver'. Use a module-level function.",
            UserWarning,
            stacklevel=3,
        )


class PicklesRng:
    """Mixin: a stage whose ``self._rng`` (``random.Random``) pickles as its state, not the object.

    Under torch's ``getstate_hook`` (set by its serialization helpers) the state passes through
    the hook, as torch's own stages do.
    """

    _rng: random.Random

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if "_rng" in state:  # a stage that makes its generator at reset() may have none yet
            state["_rng"] = self._rng.getstate()
        if IterDataPipe.getstate_hook is not None:
            return cast(dict[str, Any], IterDataPipe.getstate_hook(state))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        rng_state = state.pop("_rng", None)
        self.__dict__.update(state)
        if rng_state is not None:
            self._rng = random.Random()
            self._rng.setstate(rng_state)


class SeededRng(PicklesRng):
    """Mixin: a random stage whose ``self._rng`` is made anew from ``self._seed`` at each ``reset()``.

    The stage's ``set_seed`` (called by the reading services) sets ``_seed``. A graph restored
    from a snapshot (torch's ``_simple_graph_snapshot_restoration``) continues with the pickled
    generator state instead of starting the epoch again.
    """

    _seed: int

    def reset(self) -> None:
        """Reseed at the start of an iteration (called by torch's iterator hook)."""
        if getattr(self, "_snapshot_state", None) == _SnapshotState.Restored:
            self._snapshot_state = _SnapshotState.Iterating
            return
        self._rng = random.Random(self._seed)
