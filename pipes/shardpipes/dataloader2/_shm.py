"""Large values and tensors cross from worker processes through reused shared memory, not the pipe.

A batch of 64 samples of 100 KB is 6.4 MB. Pickled into a worker's result pipe it is copied
four times, and the pipe's 64 KB kernel buffer makes the two processes take turns every 64 KB.
A tensor is worse: torch's queues move every tensor of a batch into a shared-memory segment of
its own, made for it, filled (faulting fresh pages in) and passed as a file descriptor over a
socket, then mapped by the main process: about 650 us of a worker's CPU for a 224x224 float
image (docs/performance.md), more than decoding the JPEG it came from.
Instead, each worker keeps a small ring of shared-memory blocks (``multiprocessing.shared_memory``,
created once and reused, so their pages stay mapped). A worker sends its batches a few at a
time (``_bundle.py``), all in one block: :meth:`Ring.prepare` takes each batch as it is made,
pickling a batch of small values whole and taking every ``bytes`` value and numpy array of at
least :data:`MIN_BYTES`, and every plain CPU tensor, out of a batch that has them (small
placeholders in their place); :meth:`Ring.seal` writes them all into the next free block
(:class:`Bundled`). In the main process a :class:`Reader` makes each batch when its turn
comes: it unpickles it, or copies each ``bytes`` value out of the block into a new one, and
*lends* the tensors and arrays: each is made over its bytes in the block
(a tensor with a storage of its own, exactly its bytes; same type, dtype, shape and contents),
with no copy, and the block goes back to its worker when the last of them is freed. The
training loop sees exactly the items of an in-process run. Copying a batch of 64 224x224 float
images (38.5 MB) out cost the main process about 270 us an image, in a new allocation too
large for the heap to keep, faulted in for each batch; lending costs about 10 us.
A member of a local shard that no stage of the worker has read (``formats/placed.py``:
:class:`~shardpipes.formats.placed.PlacedBytes`) puts no bytes in the block: its span names
the file, offset and size, and the main process reads it from there, once.

Which tensors: of type ``torch.Tensor`` exactly, on the CPU, dense and contiguous, owning
their whole storage (not a view into a larger one, so no two values of a batch share memory
that the copies would not), not requiring grad, not already shared, not quantized, without
attributes of their own. Anything else (a subclass, a view) goes through torch's own
queues as before. Numpy arrays: ``numpy.ndarray`` exactly, C-contiguous, without Python objects.

Why a ring is safe: each block starts with two numbers, the batch last written into it (by the
worker) and the batch last given back (by the main process, once its bytes are copied out and
the values lent from it are gone). A worker writes a block only when the two are equal, that
is when the main process is done with it; it takes the next free one of its blocks, and when
none is free (more batches in flight or kept by the training loop than blocks, as when the
other workers have finished an epoch and all requests go to this one) it sends those batches
with the message, as it would without the ring. The main process checks the
written number again after copying and raises rather than return torn data, should anything
ever write a block early. ``prefetch + 2`` blocks per worker cover the usual case. A batch
larger than its block gets a larger block in its place when the old one is free (a new name,
``..._<slot>_<generation>``; the main process unmaps the old one when it sees the new).

A torch shared-memory storage per batch was tried first: passing a new storage through torch's
queues cost more than pickling the bytes (docs/performance.md).

Only the containers batches are made of are searched: lists, tuples and dicts, two levels deep.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import logging
import mmap
import pickle
import secrets
import struct
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import numpy as np
import torch

from shardpipes.dataloader2._blocks import PREFIX, Handle, Mapping, grow, make_block, remove_stale
from shardpipes.formats import placed
from shardpipes.formats.placed import PlacedBytes
from shardpipes.formats.stream import StreamBytes

__all__ = ["MIN_BYTES", "PREFIX", "Attachments", "Bundled", "Reader", "Ring"]

logger = logging.getLogger(__name__)

#: Smallest ``bytes`` value or array sent through shared memory (smaller ones are cheaper to
#: pickle). Tensors of any size go through it: torch's queues share each one on its own.
MIN_BYTES = placed.MIN_BYTES
_MIN_BLOCK = 8 << 20
_SEQ = struct.Struct("<q")  # at 0: the batch last written; at 8: the batch last copied out
_ALIGN = 64  # each value starts at a multiple of this in its block
_HEADER_SIZE = _ALIGN  # the two numbers, then the values

# What a span holds (the first number of a span). _PLACE: nothing in the block; a member the
# worker never read, read by the main process from its file (formats/placed.py).
_BYTES, _STREAM, _TENSOR, _ARRAY, _PLACE = 0, 1, 2, 3, 4
_NEW_BYTES = frozenset({_BYTES, _STREAM, _PLACE})  # made anew in the main process, not lent


class _Ref:
    """Placeholder for value ``i`` of an item's large values (a :class:`Bundled` entry)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Ref, (self.i,))


# What an entry of a :class:`Bundled` is (its first element): an item pickled into the block
# (offset, size); an item whose large values are in the block (its skeleton, their spans); an
# item pickled with the message (no free block); an item sent as it is (torch's queue pickles
# it, sharing its tensors).
_PICKLED, _VALUES, _INLINE, _AS_IS, _SKELETON = 0, 1, 2, 3, 4
_IN_BLOCK_PICKLED = frozenset({_PICKLED, _SKELETON})  # a pickle in the block
_WITH_VALUES = frozenset({_SKELETON, _VALUES})  # large values in the block


class Bundled:
    """A worker's items, written into shared-memory block ``name`` as its batch ``seq``.

    ``entries`` has one per item: ``(_PICKLED, offset, nbytes)``, ``(_SKELETON, offset,
    nbytes, spans)`` (the item pickled with placeholders for its large values, which are at
    ``spans``; a span is ``(kind, offset, nbytes, dtype, shape)``, ``dtype`` and ``shape``
    ``None`` for ``bytes``), ``(_VALUES, skeleton, spans)`` (the same, the skeleton with the
    message: it holds tensors for torch's queue), ``(_INLINE, pickled)`` or ``(_AS_IS, item)``. ``name`` is
    ``None`` when no block was free or needed: then there are only the last two kinds.
    ``owner``: the loader whose workers wrote it (:attr:`Attachments.owner`); ``index``: the
    block's number among the loader's blocks; ``size``: its size when it was written.
    """

    __slots__ = ("block", "entries", "index", "name", "owner", "read", "seq", "size")

    def __init__(
        self,
        name: str | None,
        seq: int,
        entries: list[tuple[Any, ...]],
        owner: str = "",
        index: int = -1,
        size: int = 0,
    ) -> None:
        self.name = name
        self.seq = seq
        self.entries = entries
        self.owner = owner
        self.index = index
        self.size = size
        # In the main process (_received): False until a Reader takes it. None: a worker's.
        self.read: bool | None = None
        self.block: Mapping | None = None  # in the main process: the block, mapped

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.name, self.seq, self.entries, self.owner, self.index, self.size)
        return (_received, args)

    def with_entries(self, entries: list[tuple[Any, ...]]) -> Bundled:
        """The same message with other entries (pinned ones); it gives the block back now."""
        other = Bundled(self.name, self.seq, entries, self.owner, self.index, self.size)
        other.block = self.block
        other.read, self.read = self.read, None
        return other

    def __del__(self) -> None:
        # A message the main process received and dropped unread (torch drains the queue
        # when a persistent pool starts its next epoch, after a loop left the last one
        # early): its block goes back to the worker, which would otherwise never reuse it
        # (after a few such epochs every batch was pickled instead).
        block = getattr(self, "block", None)
        if getattr(self, "read", None) is False and block is not None:
            with contextlib.suppress(Exception):  # in __del__ (also at interpreter exit)
                buf = block.buf
                if buf is not None and _SEQ.unpack_from(buf, 0)[0] == self.seq:
                    _give_back(buf, self.seq)  # (not written again since: never should be)

    def __len__(self) -> int:
        return len(self.entries)


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
    """What ``x`` travels as in a block, or ``-1`` when it is pickled."""
    kind = type(x)
    if kind is bytes:
        return _BYTES if len(x) >= MIN_BYTES else -1
    if kind is PlacedBytes and placed.unread(x):
        return _PLACE
    if kind is StreamBytes or kind is PlacedBytes:  # (one read in the worker: its bytes)
        return _STREAM if len(x._data) >= MIN_BYTES else -1
    if kind is torch.Tensor:
        return _TENSOR if _plain_tensor(x) else -1
    if kind is np.ndarray:
        ok = x.nbytes >= MIN_BYTES and x.flags.c_contiguous and not x.dtype.hasobject
        return _ARRAY if ok else -1
    return -1


# The types a block may carry (which of their values it does carry: _kind); without tensors
# when the loader pins memory (torch's pin thread pins the tensors it receives, not ours).
_LEAVES = frozenset({bytes, StreamBytes, PlacedBytes, torch.Tensor, np.ndarray})
_LEAVES_NO_TENSORS = frozenset({bytes, StreamBytes, PlacedBytes, np.ndarray})


def _large(x: Any, depth: int, leaves: frozenset[type] = _LEAVES) -> bool:
    """Whether ``x`` holds anything for a block (plain loops: this runs on every batch)."""
    kind = type(x)
    if kind in leaves:
        return _kind(x) >= 0
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
            if _kind(v) >= 0:
                return True
        elif (
            depth > 1
            and (t is dict or t is tuple or isinstance(v, list))
            and _large(v, depth - 1, leaves)
        ):
            return True
    return False


def _swap(
    x: Any, depth: int, found: list[Any], seen: dict[int, int], leaves: frozenset[type] = _LEAVES
) -> Any:
    kind = type(x)
    if depth and (isinstance(x, list) or kind is tuple):  # batches are often DataChunk lists
        return _keep_attrs(x, kind([_swap(v, depth - 1, found, seen, leaves) for v in x]))
    if depth and kind is dict:
        return {k: _swap(v, depth - 1, found, seen, leaves) for k, v in x.items()}
    if kind in leaves and _kind(x) >= 0:
        at = seen.get(id(x))  # the same object twice in a batch: one copy, the same object back
        if at is None:
            at = seen[id(x)] = len(found)
            found.append(x)
        return _Ref(at)
    return x


def _keep_attrs(old: Any, new: Any) -> Any:
    # A batch's sample ids (``batch.ids``, docs/attestation.md) go with it; not its other
    # attributes (a DataChunk's ``items`` is its list of values, which were just swapped).
    ids = getattr(old, "ids", None)
    if ids is not None and hasattr(new, "__dict__"):
        new.ids = ids
    return new


def _restore(x: Any, depth: int, values: list[Any]) -> Any:
    kind = type(x)
    if kind is _Ref:
        return values[x.i]
    if depth and (isinstance(x, list) or kind is tuple):
        return _keep_attrs(x, kind([_restore(v, depth - 1, values) for v in x]))
    if depth and kind is dict:
        return {k: _restore(v, depth - 1, values) for k, v in x.items()}
    return x


def _nbytes(x: Any) -> int:
    """What ``x`` takes in a block."""
    kind = type(x)
    if kind is torch.Tensor or kind is np.ndarray:
        return int(x.nbytes)
    if kind is PlacedBytes and placed.unread(x):
        return 0
    return len(x)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _write(buf: memoryview, at: int, x: Any) -> tuple[Any, ...]:
    """Copy ``x`` into ``buf`` at ``at``; return its span."""
    kind = _kind(x)
    n = _nbytes(x)
    if kind == _TENSOR:
        if n:
            dst = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=at)
            dst.copy_(x.reshape(-1).view(torch.uint8))
            del dst
        return (kind, at, n, x.dtype, tuple(x.shape))
    if kind == _ARRAY:
        if n:
            np.copyto(np.frombuffer(buf, np.uint8, n, at), x.reshape(-1).view(np.uint8))
        return (kind, at, n, x.dtype, x.shape)
    if kind == _PLACE:
        return (kind, x.offset, x.size, x.place, None)
    buf[at : at + n] = x if kind == _BYTES else x.getvalue()
    return (kind, at, n, None, None)


def _read(buf: memoryview, span: tuple[Any, ...]) -> Any:
    """A new value with the contents of ``span`` (copied: the block is reused)."""
    kind, at, n, dtype, shape = span
    if kind == _BYTES:
        return bytes(buf[at : at + n])
    if kind == _STREAM:
        return StreamBytes(buf[at : at + n])
    if kind == _PLACE:  # at: the offset in the file ``dtype`` names
        return StreamBytes(placed.read_at(dtype, at, n))
    if kind == _TENSOR:
        out = torch.empty(shape, dtype=dtype)
        if n:
            src = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=at)
            out.reshape(-1).view(torch.uint8).copy_(src)
            del src
        return out
    array = np.empty(shape, dtype=dtype)
    if n:
        np.copyto(array.reshape(-1).view(np.uint8), np.frombuffer(buf, np.uint8, n, at))
    return array


def _lent(lease: np.ndarray, span: tuple[Any, ...]) -> Any:
    """A tensor or array over ``span`` of the block ``lease`` maps, with no copy.

    A tensor gets a storage of its own, exactly its bytes (as one made in the worker had), that
    keeps ``lease`` alive until the storage is freed; an array is a view whose base chain ends
    at ``lease``. Empty values are new (a zero-length buffer cannot be lent).
    """
    kind, at, n, dtype, shape = span
    if kind == _TENSOR:
        if not n:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(lease, dtype=dtype, count=n // dtype.itemsize, offset=at)
        out = torch.empty((0,), dtype=dtype)
        return out.set_(flat.untyped_storage(), 0, shape)  # type: ignore[call-overload]
    if not n:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(lease, dtype=dtype, count=n // dtype.itemsize, offset=at).reshape(shape)


def _received(
    name: str | None,
    seq: int,
    entries: list[tuple[Any, ...]],
    owner: str = "",
    index: int = -1,
    size: int = 0,
) -> Bundled:
    """A :class:`Bundled` as the main process unpickles it: its block mapped at once.

    At once, so that a message dropped unread still gives its block back.
    """
    bundled = Bundled(name, seq, entries, owner, index, size)
    bundled.read = False
    attached = _LOADERS.get(owner) if name is not None else None
    if attached is not None:
        bundled.block = attached.attach(index, size)
    return bundled


def _check_written(buf: memoryview, name: str, seq: int) -> None:
    """Raise if the worker wrote block ``name`` again while it was being read (never should)."""
    if _SEQ.unpack_from(buf, 0)[0] != seq:
        raise RuntimeError(
            f"shared-memory block {name} was overwritten before batch {seq} was "
            "read from it; please report this"
        )


def _give_back(buf: memoryview | mmap.mmap, seq: int) -> None:
    """Mark a block free for its worker (the last tensor or array lent from it is gone)."""
    with contextlib.suppress(ValueError, TypeError):  # the loader has closed the block
        _SEQ.pack_into(buf, 8, seq)


class _HoldsTensors(Exception):
    """Raised while pickling a batch that holds a tensor or a storage (see _no_tensors_table)."""


def _refuse(obj: Any) -> Any:
    raise _HoldsTensors


def _no_tensors_table() -> dict[Any, Any]:
    """The reducers of torch's queues (``ForkingPickler``), with torch's own refused.

    A batch pickled with it is pickled as torch's queue would pickle it, or raises
    :class:`_HoldsTensors` on its first tensor or storage, which torch's queue moves into
    shared memory of its own: such a batch goes through the queue as before.
    """
    table = dict(copyreg.dispatch_table)
    for kind, reduce in ForkingPickler._extra_reducers.items():  # type: ignore[attr-defined]
        torchs = getattr(reduce, "__module__", "").startswith("torch")
        table[kind] = _refuse if torchs else reduce
    for kind in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage):
        table[kind] = _refuse
    return table


class Ring:
    """A worker's blocks (``slots`` of them), written round-robin, one message per block.

    ``handles``: the worker's blocks, made by the main process (:meth:`Attachments.make`);
    they have no name anyone can find (``_blocks.py``), and the kernel frees them with the last
    process that maps them. ``owner`` is :attr:`Attachments.owner` of the loader they belong to.
    Where no block can be made (a full tmpfs, no memory), batches are pickled as they would be
    without the ring: all of them if the worker has no block yet, else those that find no free
    block.
    """

    def __init__(self, handles: list[Handle], owner: str, *, tensors: bool = True) -> None:
        self.handles = handles
        self.slots = slots = len(handles)
        self.leaves = _LEAVES if tensors else _LEAVES_NO_TENSORS
        # Whole batches of small values go through the blocks too, unless torch's pin thread
        # must see the tensors they may hold (pin_memory: tensors=False).
        self.whole = tensors
        self._table = _no_tensors_table()
        self.owner = owner
        self.blocks: list[Mapping | None] = [None] * slots  # each as large as it was made
        self.seq = 0
        self.broken = not slots  # no block can be had, and there is none: pickle everything
        self.full = False  # a block could not be made larger: no more are tried
        # The files of the members a block's batch sent by their place, held open until the
        # main process gives the block back (it has read them then): formats/placed.py.
        self.held: dict[str, list[Any]] = {}
        self.packed_bytes = -1  # of the last seal()

    def _block(self, slot: int, size: int) -> Mapping | None:
        """The block of ``slot`` if it is free and holds ``size`` bytes (a new one if need be)."""
        block = self.blocks[slot]
        if block is not None:
            buf = cast(memoryview, block.buf)  # None only after close()
            if _SEQ.unpack_from(buf, 0) != _SEQ.unpack_from(buf, 8):
                return None  # the main process has not copied this block's batch out yet
            if block.size >= size:
                return block
            # Too small, and free: made larger. The main process maps it again when a batch
            # says it is larger than it has it.
            self.blocks[slot] = None
            self.held.pop(block.name, None)
            block.close()
        if self.full:
            return None
        handle = self.handles[slot]
        # Room for half as much again as this batch.
        try:
            grown = max(size * 3 // 2, _MIN_BLOCK)
            fd = handle.fd()
            grow(fd, grown, named=handle.named)
            block = Mapping(fd, handle.name, grown)
        except OSError as exc:
            self.full = True
            self.broken = not any(self.blocks)
            logger.warning(
                "no shared memory for large payloads (%s); %s",
                exc,
                "pickling them" if self.broken else "pickling those that find no free block",
            )
            return None
        self.blocks[slot] = block
        return block

    def prepare(self, item: Any) -> tuple[Any, ...]:
        """What ``item`` becomes in a block: an entry for :meth:`seal`.

        Called on each item as it is made: a batch of small values is pickled at once (and can
        be freed), a batch's large values are taken out (:func:`_swap`).
        """
        if self.broken:
            return (_AS_IS, item)
        if not _large(item, 2, self.leaves):
            # A batch of small samples: pickled here, into a block, rather than by torch's
            # queue into its pipe (about 140 KB for 64 samples of 2 KB: the main process read
            # it 64 KB at a time, taking turns with the worker's feeder thread). Unless torch's
            # pin thread must see the tensors it may hold (pin_memory: whole=False).
            if not self.whole or not isinstance(item, list):
                return (_AS_IS, item)
            data = self._dumps(item)
            # torch's queue shares the tensors of an item that has some, as it always did
            return (_AS_IS, item) if data is None else (_PICKLED, data)
        found: list[Any] = []
        skeleton = _swap(item, 2, found, {}, self.leaves)
        # The rest of the item goes into the block too, pickled (through torch's queue, 16
        # skeletons of 64 samples filled its 64 KB pipe, and were all unpickled at once).
        data = self._dumps(skeleton) if self.whole else None
        return (_VALUES, skeleton, found) if data is None else (_SKELETON, data, found)

    def _dumps(self, obj: Any) -> memoryview | None:
        """``obj`` pickled as torch's queue would, or ``None`` if it holds a tensor."""
        out = io.BytesIO()
        pickler = pickle.Pickler(out)
        pickler.dispatch_table = self._table
        try:
            pickler.dump(obj)
        except _HoldsTensors:
            return None
        return out.getbuffer()

    def seal(self, entries: list[tuple[Any, ...]]) -> Bundled:
        """The :meth:`prepare` d items, written into the next free block.

        :attr:`packed_bytes` is then what they take in a block (placed members take nothing),
        or ``-1`` if an item holds large values sent another way (torch's queue).
        """
        need = sum(_block_bytes(e) for e in entries)
        # An item sent as it is takes nothing here, unless it holds values for a block (tensors
        # under pin_memory): their size is not counted, so it is said to be unknown.
        unknown = any(e[0] == _AS_IS and _large(e[1], 2, _LEAVES) for e in entries)
        self.packed_bytes = -1 if unknown else need
        if all(e[0] == _AS_IS for e in entries):
            return Bundled(None, 0, entries)
        block = self._free_block(_HEADER_SIZE + need)
        if block is None:  # every block is still in use: the items go with the message
            return Bundled(None, 0, [_inline(e) for e in entries])
        buf = cast(memoryview, block.buf)  # None only after close()
        self.seq += 1
        _SEQ.pack_into(buf, 0, self.seq)
        at = _HEADER_SIZE
        written: list[tuple[Any, ...]] = []
        held: list[Any] = []
        for entry in entries:
            kind = entry[0]
            if kind in _IN_BLOCK_PICKLED:
                data = entry[1]
                buf[at : at + len(data)] = data
                where = (at, len(data))
                at += _aligned(len(data))
            if kind in _WITH_VALUES:
                spans = []
                for x in entry[2]:
                    span = _write(buf, at, x)
                    spans.append(span)
                    at += _aligned(_nbytes(x))
                    if span[0] == _PLACE:
                        held.append(x.held)
            if kind == _PICKLED:
                written.append((_PICKLED, *where))
            elif kind == _SKELETON:
                written.append((_SKELETON, *where, spans))
            elif kind == _VALUES:
                written.append((_VALUES, entry[1], spans))
            else:
                written.append(entry)
        self.held[block.name] = held
        index = self.handles[self.blocks.index(block)].index
        return Bundled(block.name, self.seq, written, self.owner, index, block.size)

    def pack(self, items: list[Any]) -> Bundled:
        """``items`` in the next free block (:meth:`prepare` each, then :meth:`seal`)."""
        return self.seal([self.prepare(x) for x in items])

    def _free_block(self, size: int) -> Mapping | None:
        # The next slot, or the first free one after it: the main process lends the tensors
        # and arrays of a batch straight from its block and frees it when they are gone.
        for step in range(self.slots):
            block = self._block((self.seq + 1 + step) % self.slots, size)
            if block is not None or self.broken:
                return block
        return None

    def close(self) -> None:
        """Let go of the blocks (the main process may still map them: they live on there)."""
        for block in self.blocks:
            if block is not None:
                block.close()
        for handle in self.handles:
            handle.close()
        self.blocks = [None] * self.slots
        self.held.clear()


def _block_bytes(entry: tuple[Any, ...]) -> int:
    """Exactly what a prepared entry takes in a block, each part aligned as it is written.

    A placed member takes nothing: the main process reads it from its shard when its item's
    turn comes, not when the block arrives.
    """
    kind = entry[0]
    n = _aligned(len(entry[1])) if kind in _IN_BLOCK_PICKLED else 0
    if kind in _WITH_VALUES:
        n += sum(_aligned(_nbytes(x)) for x in entry[2])
    return n


def _inline(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A prepared entry sent with the message instead (no block was free)."""
    kind = entry[0]
    if kind == _PICKLED:
        return (_INLINE, bytes(entry[1]))
    if kind == _VALUES:
        return (_AS_IS, _restore(entry[1], 2, entry[2]))
    if kind == _SKELETON:
        return (_AS_IS, _restore(pickle.loads(entry[1]), 2, entry[2]))
    return entry


def _keep_heap(nbytes: int) -> None:
    """Let glibc keep a batch's worth of freed heap in this process instead of trimming it.

    The values of a batch are copied out into new ``bytes`` and freed a batch later. glibc
    returns freed memory at the top of its heap to the system once it exceeds its trim
    threshold (128 KiB at first), so each batch faulted its 6.4 MB (64 x 100 KB) in again:
    41 us of the main process's time per 100 KB value instead of about 20 us (measured on the
    large benchmark preset with 2 workers). glibc raises that threshold by itself, to twice the
    size of any block it had mapped for an allocation and then freed (up to 32 MiB): allocating
    and freeing one block of the batch's size takes it there. Nothing is set: unlike the
    workers' ``mallopt`` (``_worker._tune_malloc``), glibc's own adaptive behaviour stays in
    place for the training process. Elsewhere than glibc this costs one allocation.
    """
    bytearray(min(nbytes, _KEEP_HEAP_MAX))  # mapped by glibc and freed at once


_KEEP_HEAP_MAX = 32 << 20  # glibc's largest adaptive threshold (DEFAULT_MMAP_THRESHOLD_MAX)


class Attachments:
    """The main process's side: its workers' blocks; what of them is mapped; unmapped at :meth:`close`.

    :meth:`make` makes the blocks (before the workers start). A block is mapped, or mapped
    again when its worker made it larger, when a message written into it is unpickled.
    Creating one runs the janitor (``_blocks.remove_stale``): names of blocks whose maker died
    in the instant a name lives.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, Mapping] = {}  # by number: those a message was written into
        self.handles: list[Handle] = []  # every block made, by number
        # Tells this loader's messages apart (two loaders in one process, such as training and
        # validation, each map their own workers' blocks).
        self.owner = secrets.token_hex(4)
        self.heap_kept = 0  # the largest batch payload _keep_heap was run for
        _LOADERS[self.owner] = self
        # A loader dropped without shutdown() closes its descriptors when it is collected.
        weakref.finalize(self, _close_handles, self.handles)
        remove_stale()

    def make(self, workers: int, slots: int) -> list[list[Handle]]:
        """``slots`` new, empty blocks for each of ``workers`` workers (none if none can be had)."""
        made: list[list[Handle]] = []
        try:
            for _ in range(workers):
                row = []
                for _ in range(slots):
                    fd, name, named = make_block()
                    handle = Handle(len(self.handles), name, fd, named)
                    self.handles.append(handle)
                    row.append(handle)
                made.append(row)
        except OSError as exc:
            logger.warning("no shared memory for large payloads (%s); pickling them", exc)
            return [[] for _ in range(workers)]
        return made

    def attach(self, index: int, size: int) -> Mapping | None:
        """Block ``index``, mapped for at least ``size`` bytes (``None``: not this loader's)."""
        block = self.blocks.get(index)
        if block is not None and block.size >= size:
            return block
        if not 0 <= index < len(self.handles):
            return None
        handle = self.handles[index]
        fresh = self.blocks[index] = Mapping(handle.fd(), handle.name, size)
        if block is not None:
            block.close()  # its worker made it larger (values lent from it keep their map)
        return fresh

    def reader(self, bundled: Bundled) -> Reader:
        """Reads the items of ``bundled`` one by one (:meth:`Reader.load`)."""
        bundled.read = True
        block = bundled.block
        if block is None and bundled.name is not None:
            block = self.attach(bundled.index, bundled.size)  # a message never pickled (tests)
            if block is None:
                raise RuntimeError(f"shared-memory block {bundled.name} is not this loader's")
        return Reader(self, bundled, block)

    def unpack(self, payload: Any) -> Any:
        """The items :meth:`Ring.pack` was given (``payload`` as it is if not a bundle)."""
        if type(payload) is not Bundled:
            return payload
        reader = self.reader(payload)
        return [reader.load(i) for i in range(len(payload))]

    def close(self) -> None:
        """Unmap and close every block (the workers have stopped: the kernel frees them then)."""
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
        for handle in self.handles:
            handle.close()
        self.handles.clear()
        placed.close_files()  # the shards this process read members from (another loader's reopen)


def _close_handles(handles: list[Handle]) -> None:
    for handle in handles:
        handle.close()


# The loaders of this process by owner, for messages unpickled by torch's queue (_received).
_LOADERS: weakref.WeakValueDictionary[str, Attachments] = weakref.WeakValueDictionary()


class Reader:
    """The main process's reading of one :class:`Bundled`, an item at a time, in order.

    Items are made when asked for (unpickling a bundle's batches at once kept thousands of
    objects alive together, and Python's garbage collector walked them again and again: 160
    against 75 us a batch of 64 small samples). The block goes back to its worker when every
    item has been read and every tensor and array lent from it is gone.
    """

    __slots__ = ("attached", "buf", "entries", "lease", "left", "name", "seq")

    def __init__(self, attached: Attachments, bundled: Bundled, block: Mapping | None) -> None:
        self.attached = attached
        self.entries = list(bundled.entries)
        self.left = len(self.entries)
        self.name = bundled.name or ""
        self.seq = bundled.seq
        self.buf: memoryview | None = None
        self.lease: np.ndarray | None = None
        if block is not None:
            self.buf = buf = cast(memoryview, block.buf)  # None only after close()
            # Tensors and arrays are lent from the block and keep it; so does this reader
            # until its last item is read. When the lease is gone, the block is free again.
            self.lease = lease = np.frombuffer(buf, dtype=np.uint8)
            weakref.finalize(lease, _give_back, buf, bundled.seq)

    def load(self, i: int) -> Any:
        """Item ``i`` (each is read once)."""
        entry = self.entries[i]
        self.entries[i] = ()
        kind = entry[0]
        if kind == _AS_IS:
            out = entry[1]
        elif kind == _INLINE:
            out = pickle.loads(entry[1])
        else:
            buf = cast(memoryview, self.buf)
            if kind == _PICKLED:
                out = pickle.loads(buf[entry[1] : entry[1] + entry[2]])
            elif kind == _SKELETON:
                skeleton = pickle.loads(buf[entry[1] : entry[1] + entry[2]])
                out = self._values(buf, skeleton, entry[3])
            else:
                out = self._values(buf, entry[1], entry[2])
            _check_written(buf, self.name, self.seq)
        self.left -= 1
        if not self.left:
            self.lease = None  # the block is free once nothing lent from it lives
        return out

    def _values(self, buf: memoryview, skeleton: Any, spans: list[tuple[Any, ...]]) -> Any:
        copied = sum(span[2] for span in spans if span[0] in _NEW_BYTES)
        if copied > self.attached.heap_kept:
            _keep_heap(copied)
            self.attached.heap_kept = copied
        values = [
            _read(buf, span) if span[0] in _NEW_BYTES else _lent(cast(np.ndarray, self.lease), span)
            for span in spans
        ]
        return _restore(skeleton, 2, values)
