"""The main process's side of the shared-memory transport: its workers' blocks, and reading them.

In the main process a :class:`Reader` makes each item of a :class:`~.packed.Packed` when its turn
comes: it unpickles it, or copies each ``bytes`` value out of the block into a new one, and
*lends* the tensors and arrays: each is made over its bytes in the block (a tensor with a storage
of its own, exactly its bytes; same type, dtype, shape and contents), with no copy, and the block
goes back to its worker when the last of them is freed. The training loop sees exactly the items
of an in-process run. Copying a batch of 64 224x224 float images (38.5 MB) out cost the main
process about 270 us an image, in a new allocation too large for the heap to keep, faulted in
for each batch; lending costs about 10 us. The main process checks the written number again
after copying and raises rather than return torn data, should anything ever write a block early.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import weakref
from typing import Any, cast

import numpy as np

from shardpipes.dataloader2.workers.blocks import Handle, Mapping, make_block, remove_stale
from shardpipes.dataloader2.workers.messages import (
    NEW_BYTES,
    ArraySpan,
    AsIs,
    Inline,
    Pickled,
    Skeleton,
    Span,
    TensorSpan,
    Values,
)
from shardpipes.dataloader2.workers.packed import SEQ, Packed, give_back, register
from shardpipes.dataloader2.workers.values import lent, read, restore
from shardpipes.formats import placed

__all__ = ["Attachments", "Reader"]

logger = logging.getLogger(__name__)


class Attachments:
    """A loader's workers' blocks: made by :meth:`make`, mapped as used, closed at :meth:`close`.

    :meth:`make` makes the blocks (before the workers start). A block is mapped, or mapped
    again when its worker made it larger, when a message written into it is unpickled.
    Creating one runs the janitor (``blocks.remove_stale``): names of blocks whose maker died
    in the instant a name lives.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, Mapping] = {}  # by number: those a message was written into
        self.handles: list[Handle] = []  # every block made, by number
        # Tells this loader's messages apart (two loaders in one process, such as training and
        # validation, each map their own workers' blocks).
        self.owner = secrets.token_hex(4)
        self.heap_kept = 0  # the largest batch payload _keep_heap was run for
        register(self.owner, self)
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
        except (OSError, AttributeError) as exc:  # (AttributeError: no POSIX shared memory)
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

    def reader(self, packed: Packed) -> Reader:
        """Reads the items of ``packed`` one by one (:meth:`Reader.load`)."""
        packed.read = True
        block = packed.block
        if block is None and packed.name is not None:
            block = self.attach(packed.index, packed.size)  # a message never pickled (tests)
            if block is None:
                raise RuntimeError(f"shared-memory block {packed.name} is not this loader's")
        return Reader(self, packed, block)

    def unpack(self, payload: Any) -> Any:
        """The items :meth:`Ring.pack <.ring.Ring.pack>` was given (``payload`` if not packed)."""
        if type(payload) is not Packed:
            return payload
        reader = self.reader(payload)
        return [reader.load(i) for i in range(len(payload))]

    def close(self) -> None:
        """Unmap and close every block (the workers have stopped: the kernel frees them then)."""
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
        _close_handles(self.handles)
        self.handles.clear()
        placed.close_files()  # the shards this process read members from (another loader's reopen)


def _close_handles(handles: list[Handle]) -> None:
    for handle in handles:
        handle.close()


class Reader:
    """The main process's reading of one :class:`~.packed.Packed`, an item at a time, in order.

    Items are made when asked for (unpickling a bundle's batches at once kept thousands of
    objects alive together, and Python's garbage collector walked them again and again: 160
    against 75 us a batch of 64 small samples). The block goes back to its worker when every
    item has been read and every tensor and array lent from it is gone.
    """

    __slots__ = ("attached", "buf", "entries", "lease", "left", "name", "seq")

    def __init__(self, attached: Attachments, packed: Packed, block: Mapping | None) -> None:
        self.attached = attached
        self.entries: list[Any] = list(packed.entries)
        self.left = len(self.entries)
        self.name = packed.name or ""
        self.seq = packed.seq
        self.buf: memoryview | None = None
        self.lease: np.ndarray | None = None
        if block is not None:
            self.buf = buf = cast(memoryview, block.buf)  # None only after close()
            # Tensors and arrays are lent from the block and keep it; so does this reader
            # until its last item is read. When the lease is gone, the block is free again.
            self.lease = lease = np.frombuffer(buf, dtype=np.uint8)
            weakref.finalize(lease, give_back, buf, packed.seq)

    def load(self, i: int) -> Any:
        """Item ``i`` (each is read once)."""
        entry = self.entries[i]
        self.entries[i] = None
        kind = type(entry)
        if kind is AsIs:
            out = entry.item
        elif kind is Inline:
            out = pickle.loads(entry.pickled)
        else:
            buf = cast(memoryview, self.buf)
            if kind is Pickled:
                out = pickle.loads(buf[entry.at : entry.at + entry.nbytes])
            elif kind is Skeleton:
                skeleton = pickle.loads(buf[entry.at : entry.at + entry.nbytes])
                out = self._values(buf, skeleton, entry.spans)
            else:
                out = self._values(buf, cast(Values, entry).skeleton, entry.spans)
            _check_written(buf, self.name, self.seq)
        self.left -= 1
        if not self.left:
            self.lease = None  # the block is free once nothing lent from it lives
        return out

    def _values(self, buf: memoryview, skeleton: Any, spans: tuple[Span, ...]) -> Any:
        copied = sum(span.nbytes for span in spans if type(span) in NEW_BYTES)
        if copied > self.attached.heap_kept:
            _keep_heap(copied)
            self.attached.heap_kept = copied
        lease = cast(np.ndarray, self.lease)
        values = [
            read(buf, span)
            if type(span) in NEW_BYTES
            else lent(lease, cast(TensorSpan | ArraySpan, span))
            for span in spans
        ]
        return restore(skeleton, 2, values)


def _check_written(buf: memoryview, name: str, seq: int) -> None:
    """Raise if the worker wrote block ``name`` again while it was being read (never should)."""
    if SEQ.unpack_from(buf, 0)[0] != seq:
        raise RuntimeError(
            f"shared-memory block {name} was overwritten before batch {seq} was "
            "read from it; please report this"
        )


def _keep_heap(nbytes: int) -> None:
    """Let glibc keep a batch's worth of freed heap in this process instead of trimming it.

    The values of a batch are copied out into new ``bytes`` and freed a batch later. glibc
    returns freed memory at the top of its heap to the system once it exceeds its trim
    threshold (128 KiB at first), so each batch faulted its 6.4 MB (64 x 100 KB) in again:
    41 us of the main process's time per 100 KB value instead of about 20 us (measured on the
    large benchmark preset with 2 workers). glibc raises that threshold by itself, to twice the
    size of any block it had mapped for an allocation and then freed (up to 32 MiB): allocating
    and freeing one block of the batch's size takes it there. Nothing is set: unlike the
    workers' ``mallopt`` (``dataset._tune_malloc``), glibc's own adaptive behaviour stays in
    place for the training process. Elsewhere than glibc this costs one allocation.
    """
    bytearray(min(nbytes, _KEEP_HEAP_MAX))  # mapped by glibc and freed at once


_KEEP_HEAP_MAX = 32 << 20  # glibc's largest adaptive threshold (DEFAULT_MMAP_THRESHOLD_MAX)
