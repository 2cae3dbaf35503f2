"""A worker's items as written into one of its shared-memory blocks: the message that names them.

The worker writes the items of a bundle into a free block of its ring (``ring.py``) and sends a
:class:`Packed`: the block's number and size, the batch number it wrote there, and one entry per
item (``messages.py``). The main process maps the block when it unpickles the message
(:func:`_received`, through the loader's :class:`Receiver`), so that a message dropped unread
still gives its block back.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import weakref
from typing import Any, Protocol

from shardpipes.dataloader2.workers.blocks import Mapping
from shardpipes.dataloader2.workers.messages import Entry

__all__ = ["HEADER", "SEQ", "Packed", "Receiver", "give_back", "register"]

SEQ = struct.Struct("<q")  # at 0: the batch last written; at 8: the batch last copied out
HEADER = 64  # the two numbers, then the values (aligned)


class Receiver(Protocol):
    """The main process's side of a loader's blocks (``attachments.Attachments``)."""

    def attach(self, index: int, size: int) -> Mapping | None:
        """Block ``index`` mapped for at least ``size`` bytes, ``None`` if not its own."""


# The loaders of this process by owner, for messages unpickled by torch's queue (_received).
_RECEIVERS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def register(owner: str, receiver: Receiver) -> None:
    """Have messages of ``owner``'s workers mapped by ``receiver`` as they are unpickled."""
    _RECEIVERS[owner] = receiver


class Packed:
    """A worker's items, written into shared-memory block ``index`` as its batch ``seq``.

    ``entries`` has one per item (``messages.Entry``). ``name`` is the block's (for messages),
    ``None`` when no block was free or needed: then the entries are all ``Inline`` or ``AsIs``.
    ``owner``: the loader whose workers wrote it; ``size``: the block's size when written.
    In the main process, ``block`` is the block mapped and ``read`` says whether a reader took
    the items (``None`` in the worker).
    """

    __slots__ = ("block", "entries", "index", "name", "owner", "read", "seq", "size")

    def __init__(
        self,
        name: str | None,
        seq: int,
        entries: list[Entry],
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
        self.read: bool | None = None
        self.block: Mapping | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.name, self.seq, self.entries, self.owner, self.index, self.size)
        return (_received, args)

    def with_entries(self, entries: list[Entry]) -> Packed:
        """The same message with other entries (pinned ones); the copy gives the block back."""
        other = Packed(self.name, self.seq, entries, self.owner, self.index, self.size)
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
                if buf is not None and SEQ.unpack_from(buf, 0)[0] == self.seq:
                    give_back(buf, self.seq)  # (not written again since: never should be)

    def __len__(self) -> int:
        return len(self.entries)


def _received(
    name: str | None,
    seq: int,
    entries: list[Entry],
    owner: str = "",
    index: int = -1,
    size: int = 0,
) -> Packed:
    """A :class:`Packed` as the main process unpickles it: its block mapped at once."""
    packed = Packed(name, seq, entries, owner, index, size)
    packed.read = False
    receiver = _RECEIVERS.get(owner) if name is not None else None
    if receiver is not None:
        packed.block = receiver.attach(index, size)
    return packed


def give_back(buf: memoryview | mmap.mmap, seq: int) -> None:
    """Mark a block free for its worker (the last tensor or array lent from it is gone)."""
    with contextlib.suppress(ValueError, TypeError):  # the loader has closed the block
        SEQ.pack_into(buf, 8, seq)
