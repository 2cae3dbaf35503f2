"""How many reader actors the pool should have, from how long the trainer waited for them.

Pure: :meth:`SizingPolicy.next_size` is a function of the pool's size and the share of the
trainer's time spent waiting for readers over the last window. ``RayReadingService(sizing=...)``
measures that share on one trainer (rank 0) and applies the answer with ``scale()``, asking Ray's
autoscaler for the machines first (``ray.autoscaler.sdk.request_resources``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SizingPolicy", "WaitWindow"]


@dataclass(frozen=True)
class SizingPolicy:
    """Grow the pool while the trainer waits, shrink it while it does not.

    Args:
        min_readers: Fewest reader actors. Default: ``1``.
        max_readers: Most reader actors. Default: ``64``.
        grow_above: Share of the trainer's time waiting above which the pool doubles. Default: ``0.1``.
        shrink_below: Share below which one reader leaves. Default: ``0.01``.
        window: Items the trainer yields between two decisions. Default: ``256``.

    Examples:
        >>> policy = SizingPolicy(min_readers=2, max_readers=16)
        >>> policy.next_size(4, waited=0.3), policy.next_size(4, waited=0.05), policy.next_size(4, waited=0.0)
        (8, 4, 3)
    """

    min_readers: int = 1
    max_readers: int = 64
    grow_above: float = 0.1
    shrink_below: float = 0.01
    window: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.min_readers <= self.max_readers:
            raise ValueError(
                f"min_readers ({self.min_readers}) should be >= 1 and <= max_readers "
                f"({self.max_readers})"
            )
        if not 0 <= self.shrink_below < self.grow_above <= 1 or self.window < 1:
            raise ValueError(
                f"shrink_below ({self.shrink_below}) should be < grow_above ({self.grow_above}), "
                f"both in [0, 1], and window ({self.window}) >= 1"
            )

    def next_size(self, current: int, *, waited: float) -> int:
        """The pool size after a window in which the trainer waited ``waited`` of its time."""
        if waited > self.grow_above:
            want = current * 2
        elif waited < self.shrink_below:
            want = current - 1
        else:
            want = current
        return max(self.min_readers, min(self.max_readers, want))


@dataclass
class WaitWindow:
    """The share of the trainer's time spent waiting for readers, over windows of ``size`` items.

    :meth:`add` is given the clock, the trainer's total wait so far and its items so far after
    each item; it answers the share of the window's time that was waiting when a window of
    ``size`` items is complete (what :meth:`SizingPolicy.next_size` reads), else ``None``.

    Examples:
        >>> w = WaitWindow(2)
        >>> [w.add(t, waited, items) for t, waited, items in [(0, 0, 0), (1, 0.1, 1), (2, 0.5, 2)]]
        [None, None, 0.25]
    """

    size: int
    _start: tuple[float, float, int] | None = field(default=None, repr=False)

    def add(self, now: float, waited: float, items: int) -> float | None:
        """After an item: the last window's share of time waited, when the window is complete."""
        if self._start is None:
            self._start = (now, waited, items)
            return None
        start, waited0, items0 = self._start
        if items - items0 < self.size:
            return None
        self._start = (now, waited, items)
        return (waited - waited0) / max(now - start, 1e-9)
