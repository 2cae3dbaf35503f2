"""A mixture as declared: weights, per-epoch proportions or a schedule, validated; each epoch's counts per source and the schedule's cumulative shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardpipes.plan.readers import check_int

__all__ = ["Mixture", "Schedule", "apportion"]

Schedule = Sequence[tuple[int, Sequence[float]]] | Callable[[int], Sequence[float]]


def apportion(shares: Sequence[float], total: int) -> list[int]:
    """``total`` split in proportion to ``shares`` (largest remainders, ties to the lower index).

    Examples:
        >>> apportion([0.5, 0.3, 0.2], 7)
        [4, 2, 1]
    """
    s = float(sum(shares))
    if s <= 0:
        raise ValueError(f"shares {list(shares)} should have a positive sum")
    exact = [total * x / s for x in shares]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def _normalized(weights: Sequence[float], n: int, what: str) -> tuple[float, ...]:
    ws = tuple(float(w) for w in weights)
    if len(ws) != n:
        raise ValueError(f"{what} has {len(ws)} weights for {n} sources")
    if any(not math.isfinite(w) or w < 0 for w in ws) or sum(ws) <= 0:
        raise ValueError(f"{what} {list(ws)} should be finite, >= 0 and not all 0")
    s = sum(ws)
    return tuple(w / s for w in ws)


@dataclass(frozen=True)
class Mixture:
    """How ``sources`` sources mix: one of weights, per-epoch proportions, or a weight schedule.

    Args:
        sources: The number of sources.
        weights: Per-sample probabilities (normalised). With ``samples_per_epoch`` (default:
            the sources' sizes summed) they give each epoch's counts.
        repeat: Per-epoch proportions: source ``i`` contributes ``round(repeat[i] * size)``
            samples (``1``: each sample once; ``2``: twice; ``0.5``: half of them, other
            ones each epoch). ``None`` entries take ``choose``.
        choose: Per-epoch proportions as counts (``choose[i]`` samples of source ``i``).
        schedule: Weights by step: ``[(0, w0), (s1, w1), ...]`` (``w0`` from step 0, ``w1``
            from step ``s1``, ...) or a function ``step -> weights`` (pure, picklable).
        samples_per_epoch: Samples of an epoch with ``weights`` or ``schedule``.
        step_samples: Samples of one step (the global batch: ranks x batch size), the unit
            of ``schedule``'s steps. Steps count from the first epoch: epoch ``e`` starts at
            step ``e * samples_per_epoch // step_samples``.
        even: Interleave without jitter: equal counts then alternate in source order (round
            robin).
        until: With ``weights``, an epoch that ends with the sources (webdataset's
            ``RandomMix``): ``"first"`` ends when the first source runs out (each source
            contributes ``w_i * min_k(size_k / w_k)``); ``"last"`` reads every source once,
            sharing a finished source's weight among the others.
    """

    sources: int
    weights: tuple[float, ...] | None = None
    repeat: tuple[float | None, ...] | None = None
    choose: tuple[int | None, ...] | None = None
    schedule: Schedule | None = None
    samples_per_epoch: int | None = None
    step_samples: int = 1
    even: bool = False
    until: str | None = None

    def __post_init__(self) -> None:
        n = check_int("sources", self.sources, 1)
        modes = [
            m
            for m, v in (
                ("weights", self.weights),
                ("repeat/choose", self.repeat or self.choose),
                ("schedule", self.schedule),
            )
            if v is not None
        ]
        if len(modes) > 1:
            raise ValueError(
                f"a mixture takes one of weights, repeat/choose, schedule; got {modes}"
            )
        if self.weights is not None:
            object.__setattr__(self, "weights", _normalized(self.weights, n, "weights"))
        for name in ("repeat", "choose"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} sources")
        for i in range(n):
            r = self.repeat[i] if self.repeat else None
            c = self.choose[i] if self.choose else None
            if r is not None and c is not None:
                raise ValueError(f"source {i} has both repeat ({r}) and choose ({c})")
            if r is not None and (not math.isfinite(r) or r < 0):
                raise ValueError(f"repeat[{i}] ({r}) should be a finite number >= 0")
            if c is not None:
                check_int(f"choose[{i}]", c, 0)
        if isinstance(self.schedule, Sequence):
            steps = [check_int("schedule step", s, 0) for s, _ in self.schedule]
            if not steps or steps[0] != 0 or steps != sorted(set(steps)):
                raise ValueError(
                    f"schedule steps {steps} should start at 0 and increase; write "
                    "[(0, weights), (step, weights), ...]"
                )
            for s, w in self.schedule:
                _normalized(w, n, f"schedule weights at step {s}")
        if self.samples_per_epoch is not None:
            check_int("samples_per_epoch", self.samples_per_epoch, 1)
        if self.until is not None:
            if self.until not in ("first", "last"):
                raise ValueError(f"until {self.until!r} should be 'first' or 'last'")
            if self.weights is None or self.samples_per_epoch is not None:
                raise ValueError("until= needs weights (and no samples_per_epoch)")
            if self.until == "last" and min(self.weights) <= 0:
                raise ValueError(f"until='last' needs positive weights, got {list(self.weights)}")
        check_int("step_samples", self.step_samples, 1)

    @property
    def mode(self) -> str:
        """``"weights"``, ``"proportions"`` or ``"schedule"``."""
        if self.schedule is not None:
            return "schedule"
        if self.weights is not None:
            return "weights"
        return "proportions"

    def exact_once(self) -> list[bool]:
        """Which sources are read exactly once per epoch (``repeat`` 1, the default)."""
        if self.mode != "proportions":
            return [False] * self.sources
        return [
            (self.choose is None or self.choose[i] is None)
            and (self.repeat is None or self.repeat[i] in (None, 1))
            for i in range(self.sources)
        ]

    def epoch_samples(self, sizes: Sequence[int]) -> int:
        """Samples of an epoch with weights or a schedule: ``samples_per_epoch`` or the sizes summed."""
        return self.samples_per_epoch if self.samples_per_epoch is not None else int(sum(sizes))

    def weights_at(self, step: int) -> tuple[float, ...]:
        """The (normalised) weights in force at ``step``."""
        sched = self.schedule
        if sched is None:
            return self.weights or tuple(1 / self.sources for _ in range(self.sources))
        if callable(sched):
            return _normalized(sched(step), self.sources, f"schedule({step})")
        current = sched[0][1]
        for s, w in sched:
            if s > step:
                break
            current = w
        return _normalized(current, self.sources, f"schedule weights at step {step}")

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, tuple[float, ...]]]:
        """Global samples ``[start, stop)`` as ``(start, stop, weights)`` stretches of constant weights."""
        unit = self.step_samples
        sched = self.schedule
        if isinstance(sched, Sequence) and not callable(sched):
            cuts = [s * unit for s, _ in sched if start < s * unit < stop]
        else:  # a function (or constant weights): every step boundary in the range
            first = start // unit + 1
            cuts = [k * unit for k in range(first, -(-stop // unit))] if callable(sched) else []
        bounds = [start, *cuts, stop]
        out: list[tuple[int, int, tuple[float, ...]]] = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b <= a:
                continue
            w = self.weights_at(a // unit)
            if out and out[-1][2] == w:
                out[-1] = (out[-1][0], b, w)
            else:
                out.append((a, b, w))
        return out

    def counts(self, sizes: Sequence[int], epoch: int) -> list[int]:
        """Samples each source contributes to epoch ``epoch``, given the sources' sizes.

        Raises:
            ValueError: A source with no samples asked for some.
        """
        if len(sizes) != self.sources:
            raise ValueError(f"{len(sizes)} sizes for {self.sources} sources")
        if self.until == "last":
            out = [int(n) for n in sizes]
        elif self.until == "first" and self.even:  # round robin, until a source has no next
            first = min(range(len(sizes)), key=lambda i: (sizes[i], i))
            out = [int(sizes[first]) + (i < first) for i in range(len(sizes))]
        elif self.until == "first":
            ws = self.weights or ()
            span = min(size / w for size, w in zip(sizes, ws, strict=True) if w > 0)
            out = [
                min(int(size), math.floor(w * span + 0.5))
                for size, w in zip(sizes, ws, strict=True)
            ]
        elif self.mode == "proportions":
            out = []
            for i, size in enumerate(sizes):
                c = self.choose[i] if self.choose else None
                r = self.repeat[i] if self.repeat else None
                out.append(c if c is not None else math.floor((1 if r is None else r) * size + 0.5))
        else:
            total = self.epoch_samples(sizes)
            g0 = epoch * total
            shares = [0.0] * self.sources
            for a, b, w in self.pieces(g0, g0 + total):
                for i, x in enumerate(w):
                    shares[i] += x * (b - a)
            out = apportion(shares, total)
        for i, (n, size) in enumerate(zip(out, sizes, strict=True)):
            if n and not size:
                raise ValueError(f"source {i} has no samples but the mixture asks {n} of it")
        return out

    def profile(
        self, start: int, span: int, counts: Sequence[int]
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Each source's cumulative share of global samples ``[start, start + span)``: ``(xs, ys)``.

        ``None`` when the weights do not change (every share is linear). A source with no
        weight in the stretch but samples to read (``counts``) is spread linearly.
        """
        if self.until == "last":
            return _depleting(self.weights or (), counts)
        if self.schedule is None or span <= 0:
            return None
        pieces = self.pieces(start, start + span)
        if len(pieces) == 1:
            return None
        xs = np.asarray([0.0] + [(b - start) / span for _, b, _ in pieces])
        out = []
        for i in range(self.sources):
            mass = np.cumsum([0.0] + [w[i] * (b - a) for a, b, w in pieces])
            if mass[-1] <= 0 or not counts[i]:
                out.append((np.asarray([0.0, 1.0]), np.asarray([0.0, 1.0])))
                continue
            ys = mass / mass[-1]
            keep = np.r_[True, np.diff(ys) > 0]  # flat stretches: no arrivals there
            out.append((xs[keep], ys[keep]))
        return out


def _depleting(
    weights: Sequence[float], counts: Sequence[int]
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Cumulative shares when each source is drawn by weight until it runs out (then the rest share it)."""
    total = sum(counts)
    live = {i for i, q in enumerate(counts) if q}
    if len(live) < 2:
        return None
    done = [0.0] * len(counts)
    t = 0.0
    points: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in counts]
    while live:
        rate = sum(weights[i] for i in live)
        dt = min((counts[i] - done[i]) * rate / weights[i] for i in live)
        t += dt
        for i in list(live):
            done[i] += weights[i] / rate * dt
            if done[i] >= counts[i] * (1 - 1e-12):
                done[i] = counts[i]
                live.discard(i)
        for i, q in enumerate(counts):
            if q:
                points[i].append((t / total, done[i] / q))
    out = []
    for i, q in enumerate(counts):
        if not q:
            out.append((np.asarray([0.0, 1.0]), np.asarray([0.0, 1.0])))
            continue
        xs = np.asarray([x for x, _ in points[i]])
        ys = np.asarray([y for _, y in points[i]])
        keep = np.r_[True, np.diff(ys) > 0]
        out.append((xs[keep], ys[keep]))
    return out
