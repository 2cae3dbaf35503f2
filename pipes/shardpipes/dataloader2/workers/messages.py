"""What crosses from a worker process to the main process: named, frozen values.

A worker sends a :class:`~shardpipes.dataloader2.workers.bundles.Bundle` (several items, with
its skip counters and its epoch's end) per message. Its items, when they travel through the
worker's shared-memory block, are a :class:`Packed`: one entry per item, each saying how the item
travels (:data:`Entry`), and for the large values taken out of an item, one span each saying
where its bytes are (:data:`Span`). Each kind is a class of its own, read by attribute and told
apart by type, never a tuple read by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from shardpipes.formats.placed import Place

__all__ = [
    "ArraySpan",
    "AsIs",
    "BytesSpan",
    "Entry",
    "Inline",
    "Pickled",
    "PlaceSpan",
    "Ref",
    "Skeleton",
    "Span",
    "StreamSpan",
    "TensorSpan",
    "Values",
]


# Spans: where one large value of an item is. Named tuples, not dataclasses: a batch of 64
# samples of 100 KB has 64 of them, made by the worker, pickled, and unpickled by the main
# process, where a frozen dataclass costs several times a tuple to unpickle.


class BytesSpan(NamedTuple):
    """A ``bytes`` value: ``nbytes`` at offset ``at`` of the block, copied out into a new one."""

    at: int
    nbytes: int


class StreamSpan(NamedTuple):
    """A :class:`~shardpipes.formats.stream.StreamBytes` value, copied out into a new one."""

    at: int
    nbytes: int


class TensorSpan(NamedTuple):
    """A plain CPU tensor, lent from the block (a storage of exactly its bytes)."""

    at: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class ArraySpan(NamedTuple):
    """A numpy array, lent from the block (a view whose base chain ends at the block)."""

    at: int
    nbytes: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


class PlaceSpan(NamedTuple):
    """A member no stage of the worker read: nothing in the block; read from its file, once.

    ``offset`` and ``size`` in the file ``place`` names (``formats/placed.py``).
    """

    place: Place
    offset: int
    size: int

    @property
    def nbytes(self) -> int:
        """Bytes the member takes once read (none of them in the block)."""
        return self.size


Span = BytesSpan | StreamSpan | TensorSpan | ArraySpan | PlaceSpan
#: Spans whose value is made anew in the main process (a copy, or a read), not lent.
NEW_BYTES = (BytesSpan, StreamSpan, PlaceSpan)


# Entries: how one item travels.


@dataclass(frozen=True, slots=True)
class Pickled:
    """An item of small values, pickled into the block: ``nbytes`` at offset ``at``."""

    at: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Skeleton:
    """An item whose large values are in the block (``spans``), and the rest of it too.

    The rest is pickled, ``nbytes`` at ``at``, a :class:`Ref` in place of each large value.
    """

    at: int
    nbytes: int
    spans: tuple[Span, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_skeleton, (self.at, self.nbytes, *_wire(self.spans)))


@dataclass(frozen=True, slots=True)
class Values:
    """An item whose large values are in the block (``spans``), the rest with the message.

    The rest (``skeleton``) holds tensors that torch's queue shares (or pins) its own way.
    """

    skeleton: Any
    spans: tuple[Span, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_values, (self.skeleton, *_wire(self.spans)))


@dataclass(frozen=True, slots=True)
class Inline:
    """An item pickled with the message (its worker had no free block)."""

    pickled: bytes


@dataclass(frozen=True, slots=True)
class AsIs:
    """An item sent as it is: torch's queue pickles it (and shares its tensors)."""

    item: Any


Entry = Pickled | Skeleton | Values | Inline | AsIs


# An entry's spans cross as their classes and their fields, in plain tuples: pickling a named
# tuple goes through copyreg and its __getnewargs__, several times the cost of a plain tuple,
# for each of a batch's values.
def _wire(spans: tuple[Span, ...]) -> tuple[tuple[type, ...], tuple[tuple[Any, ...], ...]]:
    return tuple(map(type, spans)), tuple(map(tuple, spans))


def _spans(kinds: tuple[type, ...], fields: tuple[tuple[Any, ...], ...]) -> tuple[Span, ...]:
    return tuple(map(tuple.__new__, kinds, fields))


def _skeleton(at: int, nbytes: int, kinds: Any, fields: Any) -> Skeleton:
    return Skeleton(at, nbytes, _spans(kinds, fields))


def _values(skeleton: Any, kinds: Any, fields: Any) -> Values:
    return Values(skeleton, _spans(kinds, fields))


class Ref:
    """Placeholder for value ``i`` of an item's large values (in a :class:`Skeleton`)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.i,))
