"""Mixtures of sources: which source fills each position of an epoch, as pure functions of integers.

A mixture reads ``N`` sources. Each epoch:

1. Every source contributes a fixed number of samples ``counts[i]`` (:meth:`Mixture.counts`):
   per-epoch proportions (``repeat``: that many times its size, ``choose``: that many
   samples), weights (the epoch's ``samples_per_epoch`` apportioned by weight), or weights
   scheduled by step (the weights integrated over the epoch's steps). A source's samples of
   the epoch are its own epoch sequence (its shards in the epoch's order, laid end to end)
   read from the start and around again when it contributes more than it has: position
   ``p`` is sample ``p % size`` of that sequence.
2. Those positions are split between the ``readers`` exactly (:class:`MixSplit`): each reader
   gets an equal total, one contiguous stretch of every source (plus one more run for its share
   of the remainders), so it reads every source as a single stream is read. Fewer than
   ``readers`` positions of the epoch are left out to keep readers equal ("drop"), taken
   first from sources that are not read exactly once.
3. Each reader interleaves its stretches (:func:`interleave`): the ``j``-th sample of source
   ``i`` of ``q`` arrives at time ``P_i^-1((j + u) / q)``, ``u`` a counter-based draw in
   ``[0, 1)`` and ``P_i`` the source's cumulative share of the reader's time (linear for
   constant weights, the schedule's integral otherwise); the reader yields samples in arrival
   order. So every source is spread evenly over the reader's epoch, a window of ``n``
   samples holds ``n * w_i`` of source ``i`` up to the jitter, and a schedule's new weights
   take over where its step falls.

Nothing depends on what a worker drew: a reader's sequence is a function of ``(seed, epoch,
segment, reader, counts)``. The state of a mixture is the loader's (epoch and items consumed
per stretch of the epoch, :class:`~shardpipes.plan.resume.Segment`); :func:`mix_reader`
derives from it what each source has left and splits that again for any new topology.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardpipes.plan.readers import check_int
from shardpipes.plan.resume import (
    Runs,
    Segment,
    Shape,
    next_worker,
    segment_seed,
    worker_batches,
)
from shardpipes.plan.seeds import derive_seed, shuffle_position

__all__ = [
    "MixReader",
    "MixSplit",
    "Mixture",
    "apportion",
    "interleave",
    "mix_reader",
    "round_robin",
]

_MIX_TAG = 0x4D495854  # "MIXT": the mixture's seed part, apart from the stages' numbers

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


def round_robin(quotas: Sequence[int]) -> np.ndarray:
    """Sources in turn, a source leaving the turn when its quota is read (webdataset's ``round_robin_longest``).

    Examples:
        >>> round_robin([3, 1, 2]).tolist()
        [0, 1, 2, 0, 2, 0]
    """
    left = np.asarray(quotas, np.int64)
    out = []
    while (left > 0).any():
        live = np.flatnonzero(left > 0)
        rounds = int(left[live].min())
        out.append(np.tile(live.astype(np.int32), rounds))
        left[live] -= rounds
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def interleave(
    quotas: Sequence[int],
    seed: int,
    profile: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
    *,
    even: bool = False,
    first: int | None = None,
) -> np.ndarray:
    """The source of each of a reader's ``sum(quotas)`` positions, in order (``first``: only the first ones).

    With ``first``, only the arrivals before a time that holds at least ``first`` of them are
    made (every source's arrival ``j`` comes after ``j / q`` of its share of the time), so
    the cost follows ``first``, not the quotas.

    Examples:
        >>> interleave([2, 2], 0, even=True).tolist()
        [0, 1, 0, 1]
        >>> np.bincount(interleave([5, 3, 2], 7)).tolist()
        [5, 3, 2]
    """
    total = sum(quotas)
    if first is not None and first < total:
        time = min(1.0, (first + 2 * len(quotas) + 16) / max(total, 1))
        while True:
            got = _arrivals(quotas, seed, profile, even, time)
            if time >= 1.0 or len(got) >= first:
                return got[:first]
            time = min(1.0, time * 2)
    return _arrivals(quotas, seed, profile, even, None)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise (uint64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def _hash(seed: int | np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Counter-based 64-bit values: SplitMix64 of ``seed + (counter + 1) * golden`` (elementwise)."""
    with np.errstate(over="ignore"):
        base = (
            np.asarray(seed).astype(np.uint64)
            if isinstance(seed, np.ndarray)
            else np.uint64(seed & (2**64 - 1))
        )
        return _mix64(base + (counter.astype(np.uint64) + np.uint64(1)) * _GOLDEN)


def _reader_seeds(mixed: int, segment: int, readers: np.ndarray) -> np.ndarray:
    """The interleave seed of each reader of ``segment`` (uint64)."""
    return _hash(int(_hash(mixed, np.asarray([segment]))[0]), readers)


def _arrivals(
    quotas: Sequence[int],
    seed: int,
    profile: Sequence[tuple[np.ndarray, np.ndarray]] | None,
    even: bool,
    before: float | None,
) -> np.ndarray:
    """Sources of the arrivals in order; with ``before``, only those that arrive before that time.

    Arrival ``j`` of source ``i`` (of ``q``) is at share ``(j + u) / q`` of the time, ``u`` the
    top 53 bits of ``_hash(_hash(seed, i), j)`` as a fraction (0 with ``even``), through the
    source's profile when there is one.
    """
    q = np.asarray(quotas, np.int64)
    n = q.copy()
    if before is not None:  # arrival j is at or after share j / q: later ones cannot count
        if profile is None:
            share = np.full(len(q), before)
        else:
            share = np.asarray([float(np.interp(before, xs, ys)) for xs, ys in profile])
        n = np.minimum(q, np.floor(share * q).astype(np.int64) + 2)
    total = int(n.sum())
    if not total:
        return np.zeros(0, np.int32)
    src = np.repeat(np.arange(len(q), dtype=np.int32), n)
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    if even:
        y = j / q[src]
    else:
        seeds = _hash(seed, np.arange(len(q), dtype=np.uint64))
        u = (_hash(seeds[src], j) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        y = (j + u) / q[src]
    if profile is not None:
        ends = np.cumsum(n)
        for i, (xs, ys) in enumerate(profile):
            if n[i]:
                y[ends[i] - n[i] : ends[i]] = np.interp(y[ends[i] - n[i] : ends[i]], ys, xs)
    order = np.lexsort((src, y))
    if before is not None:
        order = order[y[order] < before]
    return src[order]


class MixSplit:
    """One stretch of an epoch split between ``readers``: each source's positions ``left[i]``.

    Reader ``r`` gets ``left[i][r*b_i : (r+1)*b_i]`` of every source (``b_i = len // readers``)
    and its share of the remainders, laid out source after source (``order``) and cut into
    equal pieces; what does not divide (fewer than ``readers``) is left out, from the end.
    Sources marked ``exact`` (read once per epoch) are never left out while another source
    has samples: one of those gives up a row of its shares (one sample per reader) to the
    remainders, so the end of the layout is its own.
    """

    def __init__(
        self,
        left: Sequence[Runs],
        readers: int,
        order: Sequence[int],
        exact: Sequence[bool] | None = None,
    ) -> None:
        self.left = list(left)
        self.readers = readers
        sizes = [len(r) for r in left]
        self.base = [n // readers for n in sizes]
        extras = [n - b * readers for n, b in zip(sizes, self.base, strict=True)]
        drop = sum(extras) % readers
        order = list(order)
        if exact is not None and drop:
            tail, k = 0, len(order)  # the remainders of the sources at the end of the layout
            while k and not exact[order[k - 1]]:
                k -= 1
                tail += extras[order[k]]
            donors = [i for i in order[k:] if self.base[i]] or [
                i for i in order[:k] if not exact[i] and self.base[i]
            ]
            if tail < drop and donors:
                i = donors[-1]
                self.base[i] -= 1
                extras[i] += readers
                order.remove(i)
                order.append(i)
        per = sum(extras) // readers
        self.per_reader = sum(self.base) + per
        self.extra = per
        self.dropped = sum(extras) - per * readers
        # Where each source's remainder sits in the remainders' layout.
        self._at = [0] * len(sizes)
        pos = 0
        for i in order:
            self._at[i] = pos
            pos += extras[i]
        self._extras = extras

    def _extra_run(self, readers: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Ordinals (in ``left[i]``) of the remainder run of each of ``readers``: ``(start, stop)``."""
        a0, a1 = self._at[i], self._at[i] + self._extras[i]
        x0 = np.maximum(readers * self.extra, a0)
        x1 = np.minimum((readers + 1) * self.extra, a1)
        base = self.readers * self.base[i] - a0
        return base + x0, base + np.maximum(x1, x0)

    def quotas(self, reader: int) -> list[int]:
        """Positions of each source that ``reader`` reads."""
        r = np.asarray([reader])
        out = []
        for i, b in enumerate(self.base):
            e0, e1 = self._extra_run(r, i)
            out.append(b + int(e1[0] - e0[0]))
        return out

    def quota_table(self) -> np.ndarray:
        """``quotas(r)`` of every reader, as a (readers, sources) array."""
        r = np.arange(self.readers, dtype=np.int64)
        cols = []
        for i, b in enumerate(self.base):
            e0, e1 = self._extra_run(r, i)
            cols.append(b + e1 - e0)
        return np.stack(cols, axis=1) if cols else np.zeros((self.readers, 0), np.int64)

    def unread(
        self, i: int, used: np.ndarray, held: tuple[np.ndarray, np.ndarray] | None = None
    ) -> Runs:
        """Source ``i``'s positions the readers did not read, reader after reader.

        ``used[r]``: how many of its piece reader ``r`` took (its piece's first ones);
        ``held``: ``(readers, ordinals in their pieces)`` of those taken but not yielded (they
        sat in a shuffle buffer), read again first.
        """
        r = np.arange(self.readers, dtype=np.int64)
        b = self.base[i]
        e0, e1 = self._extra_run(r, i)
        base0 = r * b + np.minimum(used, b)
        ext0 = np.minimum(e0 + np.maximum(used - b, 0), e1)
        lo = np.stack([base0, ext0], axis=1).reshape(-1)
        hi = np.stack([(r + 1) * b, e1], axis=1).reshape(-1)
        who = np.repeat(r, 2)
        kind = np.tile(np.asarray([1, 2], np.int64), self.readers)
        if held is not None and held[0].size:
            hr, t = held
            at = np.where(t < b, hr * b + t, e0[hr] + t - b)
            lo, hi = np.concatenate([lo, at]), np.concatenate([hi, at + 1])
            who = np.concatenate([who, hr])
            kind = np.concatenate([kind, np.zeros(hr.size, np.int64)])
            order = np.lexsort((lo, kind, who))
            lo, hi = lo[order], hi[order]
        return _take(self.left[i], lo, hi)

    def piece(self, reader: int) -> list[Runs]:
        """Each source's positions that ``reader`` reads, in reading order."""
        lo, hi = reader * self.extra, (reader + 1) * self.extra
        out = []
        for i, left in enumerate(self.left):
            b, n = self.base[i], self.readers * self.base[i]
            runs = left.slice(reader * b, (reader + 1) * b)
            a0, a1 = self._at[i], self._at[i] + self._extras[i]
            x0, x1 = max(lo, a0), min(hi, a1)
            if x1 > x0:
                runs = runs + left.slice(n + x0 - a0, n + x1 - a0)
            out.append(runs)
        return out


def _ranks_in_source(seq: np.ndarray, sources: int) -> np.ndarray:
    """For each position of ``seq``, how many earlier positions hold the same source."""
    out = np.zeros(len(seq), np.int64)
    for i in range(sources):
        at = np.flatnonzero(seq == i)
        out[at] = np.arange(at.size)
    return out


def _take(runs: Runs, lo: np.ndarray, hi: np.ndarray) -> Runs:
    """The positions of ``runs`` at ordinals ``[lo[k], hi[k])``, stretch after stretch."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not lo.size:
        return Runs()
    cum = runs.cum
    first = cum - (runs.stops - runs.starts)  # ordinal of each run's start
    i0 = np.searchsorted(cum, lo, side="right")
    i1 = np.searchsorted(cum, hi - 1, side="right")
    n = i1 - i0 + 1
    k = np.repeat(np.arange(lo.size), n)
    run = i0[k] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    a = np.maximum(lo[k], first[run])
    b = np.minimum(hi[k], cum[run])
    return Runs.of_arrays(runs.starts[run] + a - first[run], runs.starts[run] + b - first[run])


@dataclass(frozen=True)
class MixReader:
    """What one reader reads of a (possibly resumed) mixture epoch.

    ``pieces[i]``: source ``i``'s positions still to read, in order; ``sequence``: the source
    of each sample still to yield; ``dropped``: positions the last split left out.
    """

    pieces: list[Runs]
    sequence: np.ndarray
    dropped: int
    #: ``(seed, first draw, slots)`` where the sample shuffle after the mix continues (a
    #: resumed epoch with one), else ``None``.
    shuffle: tuple[int, int, list[int]] | None = None

    @property
    def samples(self) -> int:
        """Samples still to yield."""
        return len(self.sequence)


def _sequence(
    mix: Mixture, split: MixSplit, reader: int, seed: int, start: int, first: int | None = None
) -> tuple[list[Runs], np.ndarray]:
    pieces = split.piece(reader)
    quotas = [len(p) for p in pieces]
    if mix.even and mix.until == "last":
        return pieces, round_robin(quotas)[:first]
    span = split.per_reader * split.readers
    profile = mix.profile(start, span, quotas)
    return pieces, interleave(quotas, seed, profile, even=mix.even, first=first)


def mix_reader(
    mix: Mixture,
    counts: Sequence[int],
    *,
    seed: int,
    epoch: int,
    segments: Sequence[Segment],
    reader: int,
    shape: Shape,
    epoch_start: int = 0,
    shuffle_seed: Callable[[tuple[int, ...]], int] | None = None,
) -> MixReader:
    """What ``reader`` of the last segment reads of the epoch whose sources contribute ``counts``.

    ``segments`` are the epoch's stretches so far (one, not resumed: ``consumed == 0``);
    ``shape`` says how a reader's samples become a rank's items; ``epoch_start`` is the global
    sample where the epoch starts (for a schedule). Work: the reader's own share, plus, after
    an elastic resume, the sequences of the earlier stretches' readers up to what they yielded.

    Raises:
        ValueError: A segment says more items were consumed than its readers had.
    """
    order = sorted(range(len(counts)), key=lambda i: (mix.exact_once()[i], i))
    order.reverse()  # exact-once sources first in the remainders: the end is left out first
    left = [Runs([(0, n)]) if n else Runs() for n in counts]
    mixed = derive_seed([seed, epoch, _MIX_TAG])
    start = epoch_start
    buffer = shape.buffer_size if shuffle_seed is not None else None
    for s, seg in enumerate(segments):
        split = MixSplit(left, seg.readers, order, mix.exact_once())
        workers = max(seg.num_workers, 1)
        lengths = [split.per_reader] * seg.readers
        batches = [shape.batches(n) for n in lengths[:workers]]
        done = worker_batches(seg.consumed, batches)  # equal readers: every rank the same
        yielded = [shape.samples(b, split.per_reader) for b in done]

        def seq_of(
            r: int,
            s: int = s,
            split: MixSplit = split,
            start: int = start,
            first: int | None = None,
        ) -> tuple[list[Runs], np.ndarray]:
            return _sequence(
                mix, split, r, int(_reader_seeds(mixed, s, np.asarray([r]))[0]), start, first
            )

        def shuffled(
            r: int, o: int, s: int = s, seg: Segment = seg, split: MixSplit = split
        ) -> tuple[int, list[int], int]:
            """The shuffle after the mix of reader ``r`` that yielded ``o``: (seed, buffer, taken)."""
            assert shuffle_seed is not None and buffer is not None
            seed_r = segment_seed(shuffle_seed(seg.path(r)), s)
            if not o:
                return seed_r, [], 0
            held, taken = shuffle_position(seed_r, buffer, split.per_reader, o)
            return seed_r, held, taken

        if s == len(segments) - 1:
            rank, worker = divmod(reader, workers)
            role = rank * workers + (worker + next_worker(seg.consumed, batches)) % workers
            pieces, seq = seq_of(role)
            o = yielded[role % workers]
            if buffer is None:
                used = np.bincount(seq[:o], minlength=len(counts))
                rest = [p.slice(int(c), len(p)) for p, c in zip(pieces, used, strict=True)]
                return MixReader(rest, seq[o:], split.dropped)
            seed_r, kept, taken = shuffled(role, o)
            pairs = sorted((k, slot) for slot, k in enumerate(kept))
            ords = np.asarray([k for k, _ in pairs], np.int64)
            rank_in = _ranks_in_source(seq[:taken], len(counts))
            rest = []
            for i, p in enumerate(pieces):
                again = p.at_array(rank_in[ords[seq[ords] == i]]) if ords.size else ords
                tail = p.slice(int(np.count_nonzero(seq[:taken] == i)), len(p))
                rest.append(
                    Runs.of_arrays(
                        np.concatenate([again, tail.starts]),
                        np.concatenate([again + 1, tail.stops]),
                    )
                )
            sequence = np.concatenate([seq[ords], seq[taken:]]).astype(np.int32)
            return MixReader(rest, sequence, split.dropped, (seed_r, o, [t for _, t in pairs]))
        used = np.zeros((seg.readers, len(counts)), np.int64)
        seeds = _reader_seeds(mixed, s, np.arange(seg.readers, dtype=np.uint64))
        span = split.per_reader * split.readers
        table = split.quota_table().tolist()
        held_r: list[np.ndarray] = []
        held_s: list[np.ndarray] = []
        held_t: list[np.ndarray] = []
        for r in range(seg.readers):  # what each reader took of each source
            o = yielded[r % workers]
            held: list[int] = []
            if buffer is not None:
                _, held, o = shuffled(r, o)
            if o:
                quotas = table[r]
                if mix.even and mix.until == "last":
                    seq = round_robin(quotas)[:o]
                else:
                    profile = mix.profile(start, span, quotas)
                    seq = interleave(quotas, int(seeds[r]), profile, even=mix.even, first=o)
                used[r] = np.bincount(seq, minlength=len(counts))
                if held:
                    ords = np.asarray(held, np.int64)
                    held_r.append(np.full(ords.size, r, np.int64))
                    held_s.append(seq[ords].astype(np.int64))
                    held_t.append(_ranks_in_source(seq, len(counts))[ords])
        if held_r:
            hr, hs, ht = np.concatenate(held_r), np.concatenate(held_s), np.concatenate(held_t)
            left = [
                split.unread(i, used[:, i], (hr[hs == i], ht[hs == i])) for i in range(len(counts))
            ]
        else:
            left = [split.unread(i, used[:, i]) for i in range(len(counts))]
        start += sum(yielded) * seg.world_size
    raise ValueError("mix_reader needs at least one segment")
