"""Leases and the dealer: who makes a logical reader's items, and the order the trainer yields them.

Pure bookkeeping, no Ray. A rank's ``V`` logical readers are made by a changing set of
processes (Ray actors), each under a :class:`Lease` ``(reader, from item, until item, fence)``.
The :class:`Dealer` yields items in the order of the worker pool: reader 0's next item, reader
1's, ..., a reader leaving the rotation when its epoch ends (torch's in-order round-robin,
:func:`shardpipes.plan.resume.worker_batches`). Whoever made an item, it is dealt at its
position, so the sequence never depends on the pool.

Rules that make every item dealt exactly once:

- an item is taken only from a lease that is current for its reader (the fence: a lease
  replaced after its process died is fenced, and its late items are dropped) and only when it
  is the reader's next item (any other index is a duplicate of one already taken, or a gap
  that cannot be, since a lease's items come in order);
- a move is make-before-break: the new lease starts at a switch item a few items ahead, the
  old one stays current until the switch (:meth:`LeaseTable.move`), then is dropped;
- a death re-leases the reader from its next item (:meth:`LeaseTable.replace`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Dealer", "Lease", "LeaseTable"]

NEVER = 1 << 62  # "until" of a lease that runs to the reader's end


@dataclass(frozen=True)
class Lease:
    """Logical ``reader``'s items ``[start, until)``, made by ``member``; ``fence`` is unique per lease."""

    reader: int
    start: int
    fence: int
    member: str
    until: int = NEVER

    def covers(self, index: int) -> bool:
        """Whether item ``index`` is this lease's to make."""
        return self.start <= index < self.until


class LeaseTable:
    """The current leases of a rank's logical readers (at most two per reader, during a move)."""

    def __init__(self, readers: int) -> None:
        if readers < 1:
            raise ValueError(f"readers should be >= 1, got {readers}")
        self.readers = readers
        self._fence = 0
        self._leases: list[list[Lease]] = [[] for _ in range(readers)]

    def _new(self, reader: int, start: int, member: str) -> Lease:
        self._fence += 1
        return Lease(reader, start, self._fence, member)

    def grant(self, reader: int, member: str, start: int = 0) -> Lease:
        """The reader's first lease of a run (replacing any)."""
        lease = self._new(reader, start, member)
        self._leases[reader] = [lease]
        return lease

    def leases(self, reader: int) -> list[Lease]:
        """The reader's current leases, oldest first."""
        return list(self._leases[reader])

    def all(self) -> Iterator[Lease]:
        """Every current lease."""
        for held in self._leases:
            yield from held

    def current(self, lease: Lease) -> bool:
        """Whether ``lease`` is still current (not fenced)."""
        return lease in self._leases[lease.reader]

    def maker(self, reader: int, index: int) -> Lease | None:
        """The current lease that makes item ``index`` of ``reader``."""
        return next((le for le in self._leases[reader] if le.covers(index)), None)

    def move(self, reader: int, member: str, switch: int) -> Lease:
        """Make-before-break: a new lease from ``switch`` on; the newest old one ends there."""
        held = self._leases[reader]
        if not held:
            raise ValueError(f"reader {reader} has no lease to move")
        last = held[-1]
        if switch < last.start:
            raise ValueError(f"switch {switch} is before the lease's start {last.start}")
        lease = self._new(reader, switch, member)
        held[-1] = Lease(last.reader, last.start, last.fence, last.member, switch)
        held.append(lease)
        return lease

    def retire(self, reader: int, before: int) -> list[Lease]:
        """Drop the leases that end at or before item ``before`` (their items were all taken)."""
        held = self._leases[reader]
        done = [le for le in held if le.until <= before]
        self._leases[reader] = [le for le in held if le.until > before]
        return done

    def replace(self, lease: Lease, member: str, start: int) -> Lease:
        """Fence ``lease`` (its process died) and lease its reader again from ``start`` to ``member``.

        Every current lease of the reader is replaced: the new one makes everything from
        ``start`` on (a move in progress is abandoned).
        """
        if not self.current(lease):
            raise ValueError(f"lease {lease} is not current")
        return self.grant(lease.reader, member, start)

    def on(self, member: str) -> list[Lease]:
        """The current leases made by ``member``."""
        return [le for le in self.all() if le.member == member]


class Dealer:
    """Takes the items the leases deliver and deals them in the worker pool's order.

    :meth:`offer` takes a bundle's items (``start`` is the index of the first); :meth:`deal`
    yields items while the next reader in the rotation has its next item, and says which
    reader it waits for otherwise. The caller takes a lease's messages only once the lease
    makes its reader's next item (:meth:`LeaseTable.maker`): the items of a lease taken
    before its start would be dropped, and its stream does not send them again.

    A bundle may carry **marks** ``(n, value)``: a value of its reader as of its first ``n``
    items (the reader's skip counters). A mark is kept only with the items it follows, so
    :attr:`seen` is each reader's latest value as of the items taken in (``wanted``), and
    :attr:`marks` as of the items dealt. The bundle that ends a reader may carry a value as of
    its end (its stages' drop totals): :attr:`at_end` keeps it, from the lease whose end was
    taken only.
    """

    def __init__(self, table: LeaseTable) -> None:
        self.table = table
        readers = table.readers
        self.taken = [0] * readers  # items of each reader dealt (yielded)
        self.ends = [-1] * readers  # each reader's item count, once its end arrived
        self._ready: list[deque[Any]] = [deque() for _ in range(readers)]
        self._pending: list[deque[tuple[int, Any]]] = [deque() for _ in range(readers)]
        self.seen: list[Any] = [None] * readers  # latest mark as of the items taken in
        self.marks: list[Any] = [None] * readers  # latest mark as of the items dealt
        self.at_end: list[Any] = [None] * readers  # each reader's value at its end, once taken
        self.rotation = deque(range(readers))
        self.dropped = 0  # items offered that were not taken (fenced, or already taken)

    def wanted(self, reader: int) -> int:
        """The index of the next item of ``reader`` not yet taken."""
        return self.taken[reader] + len(self._ready[reader])

    def ready(self, reader: int) -> int:
        """Items of ``reader`` taken in and not yet dealt."""
        return len(self._ready[reader])

    def offer(
        self,
        lease: Lease,
        start: int,
        items: list[Any],
        end: int = -1,
        marks: tuple[tuple[int, Any], ...] = (),
        at_end: Any = None,
    ) -> int:
        """Take what is new of ``items`` (indexes ``start`` ...), made under ``lease``; return how many.

        ``end`` (``>= 0``) is the reader's item count when these are its last; ``marks`` the
        bundle's ``(n, value)`` marks; ``at_end`` its value as of its end.
        """
        if not self.table.current(lease):
            self.dropped += len(items)
            return 0
        reader = lease.reader
        before = self.wanted(reader)
        got = 0
        for i, item in enumerate(items, start):
            if i == self.wanted(reader) and lease.covers(i):
                self._ready[reader].append(item)
                got += 1
            else:
                self.dropped += 1
        ends = end >= 0 and lease.start <= end <= lease.until and self.wanted(reader) == end
        for n, value in marks:
            # a mark follows the items taken in now (or, at the end, all of them)
            if before < n <= before + got or (ends and n == end):
                self._pending[reader].append((n, value))
                self.seen[reader] = value
        if ends:
            self.ends[reader] = end
            self.at_end[reader] = at_end
        self.table.retire(reader, self.wanted(reader))
        return got

    def _dealt(self, reader: int) -> None:
        pending = self._pending[reader]
        while pending and pending[0][0] <= self.taken[reader]:
            self.marks[reader] = pending.popleft()[1]

    def ended(self, reader: int) -> bool:
        """Whether every item of ``reader`` was taken and its end is known."""
        return self.ends[reader] >= 0 and self.taken[reader] == self.ends[reader]

    def deal(self) -> Iterator[Any]:
        """Yield items in order while they are here; stop when the next reader has none ready."""
        while self.rotation:
            reader = self.rotation[0]
            if self.ended(reader):
                self._dealt(reader)
                self.rotation.popleft()
                continue
            ready = self._ready[reader]
            if not ready:
                return
            item = ready.popleft()
            self.taken[reader] += 1
            if self._pending[reader]:
                self._dealt(reader)
            self.rotation.rotate(-1)
            yield item

    def waiting_for(self) -> int | None:
        """The reader whose next item the rotation waits for; ``None`` when every reader has ended."""
        while self.rotation and self.ended(self.rotation[0]):
            self._dealt(self.rotation[0])
            self.rotation.popleft()
        return self.rotation[0] if self.rotation else None
