"""A worker's side of the shared-memory transport: its ring of reused blocks.

A worker sends its batches a few at a time (``bundles.py``), all in one block: :meth:`Ring.prepare`
takes each batch as it is made, pickling a batch of small values whole and taking the large values
(``values.py``) out of a batch that has them (small placeholders in their place); :meth:`Ring.seal`
writes them all into the next free block and returns the :class:`~.packed.Packed` message.

Why a ring is safe: each block starts with two numbers, the batch last written into it (by the
worker) and the batch last given back (by the main process, once its bytes are copied out and
the values lent from it are gone). A worker writes a block only when the two are equal, that
is when the main process is done with it; it takes the next free one of its blocks, and when
none is free (more batches in flight or kept by the training loop than blocks, as when the
other workers have finished an epoch and all requests go to this one) it sends those batches
with the message, as it would without the ring. ``prefetch + 2`` blocks per worker cover the
usual case. A batch larger than its block makes the block larger when it is free (the main
process maps it again when a message says it is larger than it has it).
"""

from __future__ import annotations

import copyreg
import io
import logging
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import torch

from shardpipes.dataloader2.workers.blocks import Handle, Mapping, grow
from shardpipes.dataloader2.workers.messages import (
    AsIs,
    Entry,
    Inline,
    Pickled,
    PlaceSpan,
    Skeleton,
    Values,
)
from shardpipes.dataloader2.workers.packed import HEADER, SEQ, Packed
from shardpipes.dataloader2.workers.values import (
    LEAVES,
    LEAVES_NO_TENSORS,
    aligned,
    has_large,
    nbytes,
    restore,
    swap,
    write,
)

__all__ = ["MIN_BLOCK", "Prepared", "Ring"]

logger = logging.getLogger(__name__)

MIN_BLOCK = 8 << 20  # a block is at least this large


class _ToPickle:
    """A batch of small values, pickled as it was made (``data``), for a block."""

    __slots__ = ("data",)

    def __init__(self, data: memoryview) -> None:
        self.data = data


class _ToWrite:
    """A batch's large values (``found``) and the rest of it (``skeleton``).

    The rest pickled (``data``), or ``None`` when it holds tensors for torch's queue.
    """

    __slots__ = ("data", "found", "skeleton")

    def __init__(self, skeleton: Any, found: list[Any], data: memoryview | None) -> None:
        self.skeleton = skeleton
        self.found = found
        self.data = data


#: What :meth:`Ring.prepare` makes of an item (in the worker, until :meth:`Ring.seal`).
Prepared = _ToPickle | _ToWrite | AsIs


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
    """A worker's blocks, written round-robin, one message per block.

    ``handles``: the worker's blocks, made by the main process
    (:meth:`~.attachments.Attachments.make`); they have no name anyone can find
    (``blocks.py``), and the kernel frees them with the last process that maps them. ``owner``:
    the loader they belong to. Where no block can be had (a full tmpfs, no memory), batches are
    pickled as they would be without the ring: all of them if the worker has no block yet, else
    those that find no free block. ``tensors=False`` (``pin_memory``): tensors are left to
    torch's queues, whose pin thread pins what it receives.
    """

    def __init__(self, handles: list[Handle], owner: str, *, tensors: bool = True) -> None:
        self.handles = handles
        self.slots = slots = len(handles)
        self.leaves = LEAVES if tensors else LEAVES_NO_TENSORS
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
        """The block of ``slot`` if it is free and holds ``size`` bytes (made larger if need be)."""
        block = self.blocks[slot]
        if block is not None:
            buf = cast(memoryview, block.buf)  # None only after close()
            if SEQ.unpack_from(buf, 0) != SEQ.unpack_from(buf, 8):
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
        grown = max(size * 3 // 2, MIN_BLOCK)  # room for half as much again as this batch
        try:
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

    def prepare(self, item: Any) -> Prepared:
        """What ``item`` becomes in a block: an entry for :meth:`seal`.

        Called on each item as it is made: a batch of small values is pickled at once (and can
        be freed), a batch's large values are taken out (``values.swap``).
        """
        if self.broken:
            return AsIs(item)
        if not has_large(item, 2, self.leaves):
            # A batch of small samples: pickled here, into a block, rather than by torch's
            # queue into its pipe (about 140 KB for 64 samples of 2 KB: the main process read
            # it 64 KB at a time, taking turns with the worker's feeder thread). Unless torch's
            # pin thread must see the tensors it may hold (pin_memory: whole=False).
            if not self.whole or not isinstance(item, list):
                return AsIs(item)
            data = self._dumps(item)
            # torch's queue shares the tensors of an item that has some, as it always did
            return AsIs(item) if data is None else _ToPickle(data)
        found: list[Any] = []
        skeleton = swap(item, 2, found, {}, self.leaves)
        # The rest of the item goes into the block too, pickled (through torch's queue, 16
        # skeletons of 64 samples filled its 64 KB pipe, and were all unpickled at once).
        data = self._dumps(skeleton) if self.whole else None
        return _ToWrite(skeleton, found, data)

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

    def seal(self, prepared: list[Prepared]) -> Packed:
        """The :meth:`prepare` d items, written into the next free block.

        :attr:`packed_bytes` is then what they take in a block (placed members take nothing),
        or ``-1`` if an item holds large values sent another way (torch's queue).
        """
        need = sum(_block_bytes(p) for p in prepared)
        # An item sent as it is takes nothing here, unless it holds values for a block (tensors
        # under pin_memory): their size is not counted, so it is said to be unknown.
        unknown = any(type(p) is AsIs and has_large(p.item, 2, LEAVES) for p in prepared)
        self.packed_bytes = -1 if unknown else need
        if all(type(p) is AsIs for p in prepared):
            return Packed(None, 0, cast(list[Entry], prepared))
        block = self._free_block(HEADER + need)
        if block is None:  # every block is still in use: the items go with the message
            return Packed(None, 0, [_inline(p) for p in prepared])
        buf = cast(memoryview, block.buf)  # None only after close()
        self.seq += 1
        SEQ.pack_into(buf, 0, self.seq)
        at = HEADER
        written: list[Entry] = []
        held: list[Any] = []
        for p in prepared:
            kind = type(p)
            if kind is AsIs:
                written.append(cast(AsIs, p))
                continue
            data = cast(_ToPickle | _ToWrite, p).data
            if data is not None:
                where = at
                buf[at : at + len(data)] = data
                at += aligned(len(data))
            if kind is _ToPickle:
                written.append(Pickled(where, len(data)))  # type: ignore[arg-type]
                continue
            spans = []
            for x in cast(_ToWrite, p).found:
                span = write(buf, at, x)
                spans.append(span)
                at += aligned(nbytes(x))
                if type(span) is PlaceSpan:
                    held.append(x.held)
            if data is None:
                written.append(Values(cast(_ToWrite, p).skeleton, tuple(spans)))
            else:
                written.append(Skeleton(where, len(data), tuple(spans)))
        self.held[block.name] = held
        index = self.handles[self.blocks.index(block)].index
        return Packed(block.name, self.seq, written, self.owner, index, block.size)

    def pack(self, items: list[Any]) -> Packed:
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


def _block_bytes(p: Prepared) -> int:
    """Exactly what a prepared item takes in a block, each part aligned as it is written.

    A placed member takes nothing: the main process reads it from its shard when its item's
    turn comes, not when the block arrives.
    """
    if type(p) is AsIs:
        return 0
    data = cast(_ToPickle | _ToWrite, p).data
    n = aligned(len(data)) if data is not None else 0
    if type(p) is _ToWrite:
        n += sum(aligned(nbytes(x)) for x in p.found)
    return n


def _inline(p: Prepared) -> Entry:
    """A prepared item sent with the message instead (no block was free)."""
    if type(p) is _ToPickle:
        return Inline(bytes(p.data))
    if type(p) is _ToWrite:
        skeleton = p.skeleton if p.data is None else pickle.loads(p.data)
        return AsIs(restore(skeleton, 2, p.found))
    return cast(AsIs, p)
