"""How many requests a process keeps in flight, from what its finished requests measured.

An object store answers each request after a first-byte latency ``L`` and serves each
connection at some rate ``c``, so ``n`` requests of ``b`` bytes carry about
``n * b / (L + b / c)`` bytes per second until something else is the limit (the host's
link, the server, the CPU, the reader). Neither ``L``, ``c`` nor that limit is known in
advance, and all change with the store and the machine; so :class:`Concurrency` climbs: it
starts at a few requests, measures throughput over a window of finished requests (after one
window to settle whenever the count changed), and doubles the count while throughput rises
with it; when a raise brings no gain, it goes back to the count before and stays, trying one
raise again every ``settle`` windows (so a store that gets slower later gets more requests).

A window in which the requests were not in flight as often as allowed (the reader was slow,
or the memory budget was full of blocks not yet read) says nothing about the link: it
changes nothing, except that a raise it followed is undone (it could not be used).
Pure: the caller passes the times in; no clock, no threads, no I/O.

Examples:
    >>> c = Concurrency(cap=32, start=4)
    >>> t = 0.0
    >>> for _ in range(6):  # a link where each request takes 0.2 s whatever the count
    ...     n = c.requests
    ...     for _ in range(n):
    ...         c.started(t)
    ...     for _ in range(n):
    ...         c.finished(t + 0.2, 1 << 20)
    ...     t += 0.2
    >>> c.requests > 4
    True
"""

from __future__ import annotations

import math

__all__ = ["Concurrency"]


class Concurrency:
    """Requests in flight, raised while throughput rises with them (see the module).

    Args:
        cap: The most requests in flight (the process's fetch threads).
        start: Requests at first. Default: ``4``.
        grow: Factor of a raise. Default: ``2``.
        gain: Throughput must rise by this factor for a raise to be kept (a quarter of what a
            doubling gives where each request adds its own connection's rate). Default: ``1.25``.
        busy: A window counts only when the requests were in flight this fraction of the
            count allowed on average. Default: ``0.7``.
        settle: Windows at a kept count before one raise is tried again. Default: ``8``.

    Attributes:
        requests: Requests in flight allowed now.
        windows: Windows measured (``counted`` of them said something about the link).
        last_rate: Bytes per second of the last window; ``last_in_flight`` its mean requests
            in flight.
        raises: Raises made; ``kept`` of them were kept.

    Raises:
        ValueError: ``cap`` or ``start`` below 1, or ``start`` above ``cap``.
    """

    def __init__(
        self,
        *,
        cap: int,
        start: int = 4,
        grow: float = 2.0,
        gain: float = 1.25,
        busy: float = 0.7,
        settle: int = 8,
    ) -> None:
        if cap < 1 or start < 1:
            raise ValueError(f"cap ({cap}) and start ({start}) should be >= 1")
        self.cap = cap
        self.requests = min(start, cap)
        self.grow, self.gain, self.busy, self.settle = grow, gain, busy, settle
        self.windows = self.counted = self.raises = self.kept = 0
        self.last_rate = self.last_in_flight = 0.0
        self._open: float | None = None  # start of the window
        self._bytes = 0
        self._done = 0
        self._area = 0.0  # request-seconds in flight inside the window
        self._running = 0  # requests started and not finished
        self._last: float | None = None  # time of the last event
        self._before: tuple[int, float] | None = None  # (requests, throughput) before a raise
        self._calm = 0  # windows at a kept count
        self._warming = False  # the count just changed: the next window is not measured

    def set_cap(self, cap: int) -> None:
        """Change the most requests allowed (the count comes down to it at once)."""
        self.cap = max(1, cap)
        self.requests = min(self.requests, self.cap)

    def started(self, now: float) -> None:
        """A request started at ``now`` (seconds)."""
        self._advance(now)
        self._running += 1
        if self._open is None:
            self._open = now

    def finished(self, now: float, nbytes: int) -> None:
        """A request that carried ``nbytes`` (``0``: it failed) finished at ``now`` (seconds)."""
        self._advance(now)
        self._running = max(0, self._running - 1)
        self._bytes += nbytes
        self._done += 1
        if self._open is not None and self._done >= max(self.requests, 2) and now > self._open:
            self._decide(now, now - self._open)

    def _advance(self, now: float) -> None:
        # The time integral of the requests in flight (events from several threads may come a
        # little out of order: time never runs back here).
        if self._last is not None and now > self._last:
            self._area += self._running * (now - self._last)
        if self._last is None or now > self._last:
            self._last = now

    def _decide(self, now: float, span: float) -> None:
        rate = self._bytes / span
        in_flight = self._area / span  # mean requests in flight over the window
        self.windows += 1
        self.last_rate, self.last_in_flight = rate, in_flight
        self._open, self._bytes, self._done, self._area = now, 0, 0, 0.0
        if self._warming:
            # The first window after a change still runs partly at the count before it
            # (requests started before, new ones not finished): measure the next one.
            self._warming = False
            return
        if in_flight < self.busy * self.requests:
            if self._before is not None:  # a raise that could not be used: undone
                self.requests, self._before, self._calm = self._before[0], None, 0
                self._warming = True
            return  # limited elsewhere: nothing learnt about the link
        self.counted += 1
        if self._before is not None:  # the window after a raise
            n0, rate0 = self._before
            self._before = None
            if rate >= rate0 * self.gain:
                self.kept += 1
                self._raise(rate)  # still rising: go on
            else:
                self.requests = n0  # no gain: back, and stay
                self._calm = 0
                self._warming = True
            return
        self._calm += 1
        if self.raises == 0 or self._calm >= self.settle:
            self._calm = 0
            self._raise(rate)

    def _raise(self, rate: float) -> None:
        if self.requests >= self.cap:
            return
        self._before = (self.requests, rate)
        self.raises += 1
        self.requests = min(self.cap, max(self.requests + 1, math.ceil(self.requests * self.grow)))
        self._warming = True
