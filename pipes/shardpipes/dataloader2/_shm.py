"""Large ``bytes`` values cross from worker processes through reused shared memory, not the pipe.

A batch of 64 samples of 100 KB is 6.4 MB. Pickled into a worker's result pipe it is copied
four times, and the pipe's 64 KB kernel buffer makes the two processes take turns every 64 KB.
Instead, each worker keeps a small ring of shared-memory blocks (``multiprocessing.shared_memory``,
created once and reused, so their pages stay mapped). :meth:`Ring.pack` copies every ``bytes``
value of at least :data:`MIN_BYTES` of a batch into the next block and sends the batch with
small placeholders; :meth:`Attachments.unpack`, in the main process, copies each value out of
the block into a ``bytes`` again as soon as the batch arrives. The training loop sees exactly
the items of an in-process run.

Why a ring is safe: each block starts with two numbers, the batch last written into it (by the
worker) and the batch last copied out of it (by the main process). A worker writes a block only
when the two are equal, that is when the main process is done with it; otherwise (more batches
in flight than blocks, as when the other workers have finished an epoch and all requests go to
this one) it pickles that batch as it would without the ring. The main process checks the
written number again after copying and raises rather than return torn data, should anything
ever write a block early. ``prefetch + 2`` blocks per worker cover the usual case.

A torch shared-memory storage per batch was tried first: passing a new storage through torch's
queues cost more than pickling the bytes (docs/performance.md).

Only the containers batches are made of are searched: lists, tuples and dicts, two levels deep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import struct
from multiprocessing import resource_tracker, shared_memory
from typing import Any, cast

from shardpipes.formats.stream import StreamBytes

__all__ = ["MIN_BYTES", "Attachments", "Packed", "Ring"]

logger = logging.getLogger(__name__)

#: Smallest ``bytes`` value sent through shared memory (smaller ones are cheaper to pickle).
MIN_BYTES = 32 << 10
_MIN_BLOCK = 8 << 20
_SEQ = struct.Struct("<q")  # at 0: the batch last written; at 8: the batch last copied out
_HEADER_SIZE = 16
PREFIX = "spipe_"  # short: macOS allows 31 characters in a shared-memory name


class _Ref:
    """Placeholder for value ``i`` of a :class:`Packed` batch."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Ref, (self.i,))


class Packed:
    """A batch whose large values sit in shared-memory block ``name`` at ``spans``."""

    __slots__ = ("item", "name", "seq", "spans")

    def __init__(self, item: Any, name: str, seq: int, spans: list[tuple[int, int]]) -> None:
        self.item = item
        self.name = name
        self.seq = seq
        self.spans = spans

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self.item, self.name, self.seq, self.spans))


def _large(x: Any, depth: int) -> bool:
    kind = type(x)
    if kind is bytes or kind is StreamBytes:
        return len(x) >= MIN_BYTES
    if depth and (isinstance(x, list) or kind is tuple):
        return any(_large(v, depth - 1) for v in x)
    if depth and kind is dict:
        return any(_large(v, depth - 1) for v in x.values())
    return False


def _swap(x: Any, depth: int, found: list[bytes]) -> Any:
    kind = type(x)
    if (kind is bytes or kind is StreamBytes) and len(x) >= MIN_BYTES:
        found.append(x)
        return _Ref(len(found) - 1)
    if depth and (isinstance(x, list) or kind is tuple):  # batches are often DataChunk lists
        return _keep_attrs(x, kind([_swap(v, depth - 1, found) for v in x]))
    if depth and kind is dict:
        return {k: _swap(v, depth - 1, found) for k, v in x.items()}
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


class Ring:
    """A worker's blocks (``slots`` of them), written round-robin, one batch per block.

    Blocks are named ``spipe_<owner>_<worker pid>_<slot>`` and removed by the main process
    (:meth:`Attachments.close`, which also removes any a dead worker left behind); ``owner``
    is :attr:`Attachments.owner` of the loader they belong to. Where shared memory cannot be
    made (no ``/dev/shm``, a full one), batches are pickled as they would be without the ring.
    """

    def __init__(self, slots: int, owner: str) -> None:
        self.slots = slots
        self.owner = owner
        self.blocks: list[shared_memory.SharedMemory | None] = [None] * slots
        self.seq = 0
        self.broken = False

    def _block(self, slot: int, size: int) -> shared_memory.SharedMemory | None:
        block = self.blocks[slot]
        if block is None:
            name = f"{PREFIX}{self.owner}_{os.getpid()}_{slot}"
            # Room for half as much again as the first batch; a larger one is pickled.
            try:
                block = shared_memory.SharedMemory(
                    name, create=True, size=max(size * 3 // 2, _MIN_BLOCK)
                )
            except OSError as exc:
                logger.warning("no shared memory for large payloads (%s); pickling them", exc)
                self.broken = True
                return None
            # The main process removes it; without this, this worker's resource tracker would
            # call it leaked (and try to remove it again) when the worker exits.
            resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
            self.blocks[slot] = block
        return block if block.size >= size else None

    def pack(self, item: Any) -> Any:
        """``item``, or a :class:`Packed` copy with its large values in the next block."""
        if self.broken or not _large(item, 2):
            return item
        found: list[bytes] = []
        skeleton = _swap(item, 2, found)
        block = self._block((self.seq + 1) % self.slots, _HEADER_SIZE + sum(len(b) for b in found))
        if block is None:
            return item
        buf = cast(memoryview, block.buf)  # None only after close()
        if _SEQ.unpack_from(buf, 0) != _SEQ.unpack_from(buf, 8):
            return item  # the main process has not copied this block's batch out yet
        self.seq += 1
        _SEQ.pack_into(buf, 0, self.seq)
        spans, at = [], _HEADER_SIZE
        for b in found:
            buf[at : at + len(b)] = b if type(b) is bytes else b.getvalue()  # type: ignore[attr-defined]
            # A StreamBytes's span is stored with its offset negated (offsets are > 0).
            spans.append((at if type(b) is bytes else -at, len(b)))
            at += len(b)
        return Packed(skeleton, block.name, self.seq, spans)


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
    """The main process's side: blocks it has mapped, by name; unlinks them at :meth:`close`."""

    def __init__(self) -> None:
        self.blocks: dict[str, shared_memory.SharedMemory] = {}
        # Names this loader's blocks (two loaders in one process, such as training and
        # validation, must not remove each other's blocks).
        self.owner = secrets.token_hex(4)
        self.heap_kept = 0  # the largest batch payload _keep_heap was run for

    def unpack(self, item: Any) -> Any:
        """The batch :meth:`Ring.pack` was given."""
        if type(item) is not Packed:
            return item
        block = self.blocks.get(item.name)
        if block is None:
            block = self.blocks[item.name] = shared_memory.SharedMemory(item.name)
        buf = cast(memoryview, block.buf)  # None only after close()
        total = sum(n for _, n in item.spans)
        if total > self.heap_kept:
            _keep_heap(total)
            self.heap_kept = total
        values = [
            bytes(buf[at : at + n]) if at > 0 else StreamBytes(buf[-at : -at + n])
            for at, n in item.spans
        ]
        if _SEQ.unpack_from(buf, 0)[0] != item.seq:
            raise RuntimeError(
                f"shared-memory block {item.name} was overwritten before batch {item.seq} was "
                "read from it; please report this"
            )
        _SEQ.pack_into(buf, 8, item.seq)  # the block is free for the worker again
        return _restore(item.item, 2, values)

    def close(self) -> None:
        """Unmap and remove every block seen (the workers have stopped)."""
        for block in self.blocks.values():
            block.close()
            try:
                block.unlink()  # also tells the resource tracker it is gone
            except FileNotFoundError:
                resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
        self.blocks.clear()
        # Blocks a worker made but never sent (it died first): remove them by name.
        shm = "/dev/shm"
        if os.path.isdir(shm):
            for name in os.listdir(shm):
                if name.startswith(f"{PREFIX}{self.owner}_"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(shm, name))
