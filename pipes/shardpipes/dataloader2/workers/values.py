"""Which values of a batch travel through a shared-memory block, and how they are written and made again.

Only the containers batches are made of are searched: lists, tuples and dicts, two levels deep.
Tensors: of type ``torch.Tensor`` exactly, on the CPU, dense and contiguous, owning their whole
storage (not a view into a larger one, so no two values of a batch share memory that the copies
would not), not requiring grad, not already shared, not quantized, without attributes of their
own. Anything else (a subclass, a view) goes through torch's own queues. Numpy arrays:
``numpy.ndarray`` exactly, C-contiguous, without Python objects, of at least :data:`MIN_BYTES`;
so are ``bytes`` values. A member no stage read (:class:`~shardpipes.formats.placed.PlacedBytes`)
takes no room: its span names its place in its file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shardpipes.dataloader2.workers.messages import (
    ArraySpan,
    BytesSpan,
    PlaceSpan,
    Ref,
    Span,
    StreamSpan,
    TensorSpan,
)
from shardpipes.formats import placed
from shardpipes.formats.placed import PlacedBytes
from shardpipes.formats.stream import StreamBytes

__all__ = [
    "ALIGN",
    "LEAVES",
    "LEAVES_NO_TENSORS",
    "MIN_BYTES",
    "aligned",
    "has_large",
    "lent",
    "nbytes",
    "read",
    "restore",
    "swap",
    "write",
]

#: Smallest ``bytes`` value or array sent through shared memory (smaller ones are cheaper to
#: pickle). Tensors of any size go through it: torch's queues share each one on its own.
MIN_BYTES = placed.MIN_BYTES
ALIGN = 64  # each value starts at a multiple of this in its block

# How a value travels (module-private: what crosses processes is a Span).
_NO, _BYTES, _STREAM, _TENSOR, _ARRAY, _PLACE = -1, 0, 1, 2, 3, 4


def _plain_tensor(x: torch.Tensor) -> bool:
    """A tensor whose contents, dtype and shape are all there is to it (see the module doc)."""
    return (
        x.device.type == "cpu"
        and x.layout is torch.strided
        and not x.requires_grad
        and not x.is_quantized
        and x.is_contiguous()
        and x.storage_offset() == 0
        and x.untyped_storage().nbytes() == x.nbytes
        and not x.is_shared()  # type: ignore[no-untyped-call]
        and not x.is_conj()
        and not x.is_neg()
        and not x.__dict__
    )


def _kind(x: Any) -> int:
    """How ``x`` travels in a block, or ``_NO`` when it is pickled."""
    kind = type(x)
    if kind is bytes:
        return _BYTES if len(x) >= MIN_BYTES else _NO
    if kind is PlacedBytes and placed.unread(x):
        return _PLACE
    if kind is StreamBytes or kind is PlacedBytes:  # (one read in the worker: its bytes)
        return _STREAM if len(x._data) >= MIN_BYTES else _NO
    if kind is torch.Tensor:
        return _TENSOR if _plain_tensor(x) else _NO
    if kind is np.ndarray:
        ok = x.nbytes >= MIN_BYTES and x.flags.c_contiguous and not x.dtype.hasobject
        return _ARRAY if ok else _NO
    return _NO


# The types a block may carry (which of their values it does carry: _kind); without tensors
# when the loader pins memory (torch's pin thread pins the tensors it receives, not ours).
LEAVES = frozenset({bytes, StreamBytes, PlacedBytes, torch.Tensor, np.ndarray})
LEAVES_NO_TENSORS = frozenset({bytes, StreamBytes, PlacedBytes, np.ndarray})


def has_large(x: Any, depth: int, leaves: frozenset[type] = LEAVES) -> bool:
    """Whether ``x`` holds anything for a block (plain loops: this runs on every batch)."""
    kind = type(x)
    if kind in leaves:
        return _kind(x) != _NO
    if not depth:
        return False
    if kind is dict:
        values: Any = x.values()
    elif kind is tuple or isinstance(x, list):
        values = x
    else:
        return False
    for v in values:
        t = type(v)
        if t in leaves:
            if _kind(v) != _NO:
                return True
        elif (
            depth > 1
            and (t is dict or t is tuple or isinstance(v, list))
            and has_large(v, depth - 1, leaves)
        ):
            return True
    return False


def swap(
    x: Any, depth: int, found: list[Any], seen: dict[int, int], leaves: frozenset[type] = LEAVES
) -> Any:
    """``x`` with a :class:`Ref` in place of each large value, which goes into ``found``."""
    kind = type(x)
    if depth and (isinstance(x, list) or kind is tuple):  # batches are often DataChunk lists
        return _keep_attrs(x, kind([swap(v, depth - 1, found, seen, leaves) for v in x]))
    if depth and kind is dict:
        return {k: swap(v, depth - 1, found, seen, leaves) for k, v in x.items()}
    if kind in leaves and _kind(x) != _NO:
        at = seen.get(id(x))  # the same object twice in a batch: one copy, the same object back
        if at is None:
            at = seen[id(x)] = len(found)
            found.append(x)
        return Ref(at)
    return x


def _keep_attrs(old: Any, new: Any) -> Any:
    # A batch's sample ids (``batch.ids``, docs/attestation.md) go with it; not its other
    # attributes (a DataChunk's ``items`` is its list of values, which were just swapped).
    ids = getattr(old, "ids", None)
    if ids is not None and hasattr(new, "__dict__"):
        new.ids = ids
    return new


def restore(x: Any, depth: int, values: list[Any]) -> Any:
    """``x`` with each :class:`Ref` replaced by its value (:func:`swap` undone)."""
    kind = type(x)
    if kind is Ref:
        return values[x.i]
    if depth and (isinstance(x, list) or kind is tuple):
        return _keep_attrs(x, kind([restore(v, depth - 1, values) for v in x]))
    if depth and kind is dict:
        return {k: restore(v, depth - 1, values) for k, v in x.items()}
    return x


def nbytes(x: Any) -> int:
    """What ``x`` takes in a block."""
    kind = type(x)
    if kind is torch.Tensor or kind is np.ndarray:
        return int(x.nbytes)
    if kind is PlacedBytes and placed.unread(x):
        return 0
    return len(x)


def aligned(n: int) -> int:
    """``n`` rounded up to :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


_new: Callable[[type[Span], tuple[Any, ...]], Span] = tuple.__new__  # (faster than Span(...))


def write(buf: memoryview, at: int, x: Any) -> Span:
    """Copy ``x`` into ``buf`` at ``at``; return its span."""
    kind = _kind(x)
    n = nbytes(x)
    if kind == _TENSOR:
        if n:
            dst = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=at)
            dst.copy_(x.reshape(-1).view(torch.uint8))
            del dst
        return _new(TensorSpan, (at, n, x.dtype, tuple(x.shape)))
    if kind == _ARRAY:
        if n:
            np.copyto(np.frombuffer(buf, np.uint8, n, at), x.reshape(-1).view(np.uint8))
        return _new(ArraySpan, (at, n, x.dtype, x.shape))
    if kind == _PLACE:
        return _new(PlaceSpan, (x.place, x.offset, x.size))
    if kind == _BYTES:
        buf[at : at + n] = x
        return _new(BytesSpan, (at, n))
    buf[at : at + n] = x.getvalue()
    return _new(StreamSpan, (at, n))


def read(buf: memoryview, span: Span) -> Any:
    """A new value with the contents of ``span`` (copied: the block is reused)."""
    if isinstance(span, BytesSpan):
        return bytes(buf[span.at : span.at + span.nbytes])
    if isinstance(span, StreamSpan):
        return StreamBytes(buf[span.at : span.at + span.nbytes])
    if isinstance(span, PlaceSpan):
        return StreamBytes(placed.read_at(span.place, span.offset, span.size))
    if isinstance(span, TensorSpan):
        out = torch.empty(span.shape, dtype=span.dtype)
        if span.nbytes:
            src = torch.frombuffer(buf, dtype=torch.uint8, count=span.nbytes, offset=span.at)
            out.reshape(-1).view(torch.uint8).copy_(src)
            del src
        return out
    array = np.empty(span.shape, dtype=span.dtype)
    if span.nbytes:
        src8 = np.frombuffer(buf, np.uint8, span.nbytes, span.at)
        np.copyto(array.reshape(-1).view(np.uint8), src8)
    return array


def lent(lease: np.ndarray, span: TensorSpan | ArraySpan) -> Any:
    """A tensor or array over ``span`` of the block ``lease`` maps, with no copy.

    A tensor gets a storage of its own, exactly its bytes (as one made in the worker had), that
    keeps ``lease`` alive until the storage is freed; an array is a view whose base chain ends
    at ``lease``. Empty values are new (a zero-length buffer cannot be lent).
    """
    n, shape = span.nbytes, span.shape
    if isinstance(span, TensorSpan):
        dtype = span.dtype
        if not n:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(lease, dtype=dtype, count=n // dtype.itemsize, offset=span.at)
        out = torch.empty((0,), dtype=dtype)
        return out.set_(flat.untyped_storage(), 0, shape)  # type: ignore[call-overload]
    if not n:
        return np.empty(shape, dtype=span.dtype)
    count = n // span.dtype.itemsize
    return np.frombuffer(lease, dtype=span.dtype, count=count, offset=span.at).reshape(shape)
