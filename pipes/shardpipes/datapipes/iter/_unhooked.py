"""torch's ``shuffle``, ``map`` and ``filter``, behaving as torch's, without the per-element hook.

A graph iterated directly (``for batch in dp``, or under torch's own ``DataLoader``) runs the
stages the user built; the lean stand-ins of ``_lean.py`` only replace them in the copy a
shardpipes loader runs. torch's ``_IterDataPipeMeta`` wraps every ``next()`` of its stages in a
second generator that enters the profiler check and a validity check through several function
calls: on the README graph iterated directly, ``shuffle`` alone spent ~2 us a sample in it,
about a fifth of the whole graph's cost.

The classes here are subclasses of torch's with torch's own class names (in this module),
registered under torch's functional names: ``dp.shuffle()`` builds one, ``isinstance(dp,
torch.utils.data.datapipes.iter.Shuffler)`` still holds, and every name shown for a stage (in
errors, in a loader state's plan, in ``to_graph``) is what it was. ``from
shardpipes.datapipes.iter import Shuffler`` is torch's class itself, as torchdata 0.9 exported
it; built by that name, a stage keeps torch's hook. They yield what torch's yield, in the
same order for the same seed (the same buffer algorithm and the same draws from the same
``random.Random``; ``test_unhooked.py`` compares them with torch's), and keep the hook's
observable contract at the cost of two attribute operations per element: ``reset()`` when the
iterator starts, the count of samples yielded (``_number_of_samples_yielded``, which torch's
snapshot restoration reads), the error when a second iterator of the same stage has replaced
this one, a fast-forward iterator set by snapshot restoration, and the note torch adds to an
error raised inside the stage ("This exception is thrown by __iter__ of ..."). What they drop is the
``torch.profiler`` record of each element: under a running profiler they step aside to
torch's own hooked ``__iter__``, so profiles still show the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data.datapipes._hook_iterator import (
    _check_iterator_valid,
    _generate_input_args_string,
    _set_datapipe_valid_iterator_id,
    _SnapshotState,
)
from torch.utils.data.datapipes.iter import Filter, Mapper, Shuffler
from torch.utils.data.datapipes.utils.common import StreamWrapper

from shardpipes.datapipes.iter.base import widen

__all__ = ["FilterIterDataPipe", "MapperIterDataPipe", "ShufflerIterDataPipe", "torch_kind"]

T = TypeVar("T")


def _annotate(exc: Exception, dp: Any) -> None:
    """Add torch's note to an error raised while iterating ``dp``, in the hook's own words."""
    msg = "thrown by __iter__ of"
    full = f"{msg} {type(dp).__name__}({_generate_input_args_string(dp)})"  # type: ignore[no-untyped-call]
    if not exc.args or not isinstance(exc.args[0], str):
        exc.args = (f"\nThis exception is {full}",)
    elif (
        msg not in exc.args[0] and "single iterator per IterDataPipe constraint" not in exc.args[0]
    ):
        exc.args = (exc.args[0] + f"\nThis exception is {full}", *exc.args[1:])


def _start(dp: Any) -> tuple[Iterator[Any] | None, int]:
    """Begin an iteration as torch's hook does; return a fast-forward iterator or the id."""
    ff = dp._fast_forward_iterator
    if ff:
        dp._fast_forward_iterator = None
        dp._snapshot_state = _SnapshotState.Iterating
        return ff, -1
    return None, _set_datapipe_valid_iterator_id(dp)  # type: ignore[no-untyped-call]


class ShufflerIterDataPipe(Shuffler[T]):
    """torch's ``Shuffler`` (functional name ``shuffle``): same order, no per-element hook."""

    def _iter_unhooked(self) -> Iterator[T]:
        ff, me = _start(self)
        if ff is not None:
            yield from ff
            return
        # reset() above seeded the generator and emptied the buffer, as torch's hook does.
        buf: list[Any] = self._buffer
        size = self.buffer_size
        # randint(0, n - 1) is randrange(0, n), which is _randbelow(n): the same draws.
        below = self._rng._randbelow  # type: ignore[attr-defined]
        try:
            if not self._enabled:
                for x in self.datapipe:
                    self._number_of_samples_yielded += 1
                    yield x
                    if self._valid_iterator_id != me:
                        _check_iterator_valid(self, me)
                return
            for x in self.datapipe:
                if len(buf) == size:
                    idx = below(size)
                    val = buf[idx]
                    buf[idx] = x
                    self._number_of_samples_yielded += 1
                    yield val
                    if self._valid_iterator_id != me:
                        _check_iterator_valid(self, me)
                else:
                    buf.append(x)
            while buf:
                val = buf.pop(below(len(buf)))
                self._number_of_samples_yielded += 1
                yield val
                if self._valid_iterator_id != me:
                    _check_iterator_valid(self, me)
        except Exception as exc:
            _annotate(exc, self)
            raise


class MapperIterDataPipe(Mapper[Any]):
    """torch's ``Mapper`` (functional name ``map``): the same items, no per-element hook."""

    def _iter_unhooked(self) -> Iterator[Any]:
        ff, me = _start(self)
        if ff is not None:
            yield from ff
            return
        fn: Callable[[Any], Any] = (
            self.fn if self.input_col is None and self.output_col is None else self._apply_fn
        )
        try:
            for x in self.datapipe:
                self._number_of_samples_yielded += 1
                yield fn(x)
                if self._valid_iterator_id != me:
                    _check_iterator_valid(self, me)
        except Exception as exc:
            _annotate(exc, self)
            raise


class FilterIterDataPipe(Filter[T]):
    """torch's ``Filter`` (functional name ``filter``): the same items, no per-element hook."""

    def _iter_unhooked(self) -> Iterator[T]:
        ff, me = _start(self)
        if ff is not None:
            yield from ff
            return
        keep = self._returnIfTrue
        try:
            for x in self.datapipe:
                condition, filtered = keep(x)
                if condition:
                    self._number_of_samples_yielded += 1
                    yield filtered
                    if self._valid_iterator_id != me:
                        _check_iterator_valid(self, me)
                else:
                    StreamWrapper.close_streams(x)
        except Exception as exc:
            _annotate(exc, self)
            raise


_TORCH_KIND: dict[type, type] = {}


def torch_kind(kind: type) -> type:
    """Torch's class for one of ours here (``ShufflerIterDataPipe`` -> ``Shuffler``), else ``kind``."""
    return _TORCH_KIND.get(kind, kind)


def _unhook(cls: Any, torch_cls: Any) -> None:
    # Assigned after the class statement, so torch's metaclass does not wrap it again; under a
    # running profiler, torch's own (hooked) __iter__ runs, so the profile still has the stage.
    hooked = torch_cls.__iter__
    plain = cls._iter_unhooked

    def __iter__(self: Any) -> Iterator[Any]:
        if torch.autograd._profiler_enabled():  # type: ignore[attr-defined]
            return hooked(self)  # type: ignore[no-any-return]
        return plain(self)  # type: ignore[no-any-return]

    __iter__.__doc__ = torch_cls.__iter__.__doc__
    __iter__.__qualname__ = f"{cls.__qualname__}.__iter__"
    cls.__iter__ = __iter__


for _cls, _torch_cls, _name in (
    (ShufflerIterDataPipe, Shuffler, "shuffle"),
    (MapperIterDataPipe, Mapper, "map"),
    (FilterIterDataPipe, Filter, "filter"),
):
    _unhook(_cls, _torch_cls)
    _TORCH_KIND[_cls] = _torch_cls
    widen(_name, _cls)
