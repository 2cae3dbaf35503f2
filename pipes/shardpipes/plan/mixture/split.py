"""One stretch of an epoch split exactly between readers: each reader's positions of each source."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardpipes.plan.resume import Runs

__all__ = ["MixSplit"]


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
