"""A version-2 index in memory: per-shard columns, and the shards' spans loaded on demand.

At a million shards a list of objects per shard would cost more than the data: the table
keeps the URLs as stored (relative to the descriptor's folder), the sample counts and sizes
as int64 arrays, one dictionary from URL to position, and a bounded cache of the per-shard
spans that a reader has asked for (:mod:`shardpipes.index.sidecar`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, overload

import numpy as np

from shardpipes.index.shard import ShardInfo, check_layout, fail
from shardpipes.index.sidecar import read_keys, read_spans, sidecar_path
from shardpipes.storage.urls import absolute, parent, resolve

__all__ = ["DEFAULT_CACHE_BYTES", "ShardList", "Table", "read_table"]

#: Bytes of per-shard spans a loaded index keeps (least recently used first out).
DEFAULT_CACHE_BYTES = 64 << 20
_BATCH = 8192


class Table:
    """The shards of a version-2 descriptor: columns, a URL dictionary, the spans cache."""

    def __init__(
        self,
        source: str,
        rel: list[str],
        counts: np.ndarray,
        sizes: np.ndarray,
        etags: list[str | None] | None,
        samples: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.source = source
        self.base_dir = parent(absolute(source))
        self.prefix = self.base_dir.rstrip("/") + "/"
        # The URLs as stored, end to end in one string (a million str objects would be
        # ~70 MB); a shard is found by the hash of its absolute URL (sorted, with positions).
        self.text = "".join(rel)
        self.starts = np.zeros(len(rel) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, rel), np.int64, len(rel)), out=self.starts[1:])
        hashes = np.fromiter((hash(self._absolute(u)) for u in rel), np.int64, len(rel))
        #: Stored relative to the descriptor's folder in the plain form (prefix + rel).
        self.simple = np.fromiter((self._plain(u) for u in rel), bool, len(rel))
        self.by_hash = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.by_hash]
        self.counts = counts
        self.sizes = sizes
        self.etags = etags
        self.samples = samples
        self.storage_options = dict(storage_options or {})
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.starts) - 1

    @staticmethod
    def _plain(rel: str) -> bool:
        return not ("://" in rel or rel.startswith("/") or "./" in rel or "\\" in rel)

    def _absolute(self, rel: str) -> str:
        if self._plain(rel):
            return self.prefix + rel  # the common case, without os.path calls
        return resolve(rel, self.base_dir)

    def rel(self, i: int) -> str:
        """Shard ``i``'s URL as the descriptor stores it."""
        return self.text[self.starts[i] : self.starts[i + 1]]

    def url(self, i: int) -> str:
        """The absolute URL of shard ``i``."""
        return self._absolute(self.rel(i))

    def positions(self, urls: Sequence[str]) -> list[int | None]:
        """The position of each of ``urls`` (absolute), ``None`` for those not in the index.

        Vectorized: hashes, a bisection, then a byte-for-byte check of the candidates (one
        numpy comparison for all); only URLs stored in another form are checked one by one.
        """
        n = len(urls)
        if not n or not len(self):
            return [None] * n
        h = np.fromiter(map(hash, urls), np.int64, n)
        # Bisection of the sorted hashes, the queries sorted first: in order, the probes stay
        # in cache (about three times faster at a million shards than in the epoch's order).
        by = np.argsort(h)
        at = np.empty(n, dtype=np.int64)
        at[by] = np.searchsorted(self.hashes, h[by])
        np.minimum(at, len(self.hashes) - 1, out=at)
        ok = self.hashes[at] == h
        cand = self.by_hash[at]
        # Equal hash: check the URL is prefix + the stored string, in place (no copies).
        p, prefix, text = len(self.prefix), self.prefix, self.text
        start, stop = self.starts[cand], self.starts[cand + 1]
        fast = ok & self.simple[cand]
        fast &= np.fromiter(map(len, urls), np.int64, n) - p == stop - start
        same = [
            f and u.startswith(prefix) and text.startswith(u[p:], s)
            for u, s, f in zip(urls, start.tolist(), fast.tolist(), strict=True)
        ]
        fast &= np.asarray(same, dtype=bool)
        out: list[int | None] = cand.tolist()
        for k in np.flatnonzero(~fast).tolist():
            out[k] = self._slow(urls[k]) if ok[k] else None
        return out

    def _slow(self, u: str) -> int | None:
        h = hash(u)
        k = int(np.searchsorted(self.hashes, h))
        while k < len(self.hashes) and self.hashes[k] == h:
            i = int(self.by_hash[k])
            if self.url(i) == u:
                return i
            k += 1
        return None

    def position(self, url: str) -> int | None:
        """The position of shard ``url``, or ``None``."""
        i = self.positions([url])[0]
        if i is None:
            full = absolute(url)
            if full != url:
                return self.positions([full])[0]
        return i

    def info(self, i: int) -> ShardInfo:
        """A lazy :class:`ShardInfo` of shard ``i``."""
        return ShardInfo(
            self.url(i),
            int(self.sizes[i]),
            num_samples=int(self.counts[i]),
            etag=self.etags[i] if self.etags else None,
            source=(self, i),
        )

    def sidecar(self, i: int) -> str:
        """The sample file of shard ``i``."""
        return sidecar_path(self.source, i, self.samples)

    def spans(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, sizes)`` of shard ``i``: from the cache, or read, checked and cached."""
        with self._lock:
            hit = self._cache.get(i)
            if hit is not None:
                self._cache.move_to_end(i)
                return hit
        url = self.sidecar(i)
        total = int(self.sizes[i])
        offsets, sizes = read_spans(
            url, int(self.counts[i]), total, storage_options=self.storage_options
        )
        check_layout(offsets, sizes, total, url, "")
        nbytes = offsets.nbytes + sizes.nbytes
        with self._lock:
            if i not in self._cache:
                self._cache[i] = (offsets, sizes)
                self._held += nbytes
            while self._held > self.cache_bytes and len(self._cache) > 1:
                _, (o, s) = self._cache.popitem(last=False)
                self._held -= o.nbytes + s.nbytes
        return offsets, sizes

    def keys(self, i: int) -> list[str]:
        """The keys of shard ``i`` (read from its sample file)."""
        return read_keys(self.sidecar(i), storage_options=self.storage_options)

    def held(self, i: int) -> int:
        """Bytes of shard ``i``'s spans in the cache."""
        with self._lock:
            hit = self._cache.get(i)
        return hit[0].nbytes + hit[1].nbytes if hit is not None else 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"], state["_held"], state["_lock"] = OrderedDict(), 0, None
        # The hash order is per process (str hashes are salted): rebuilt on arrival.
        state["hashes"] = state["by_hash"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._hash()

    def _hash(self) -> None:
        hashes = np.fromiter((hash(self.url(i)) for i in range(len(self))), np.int64, len(self))
        self.by_hash = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.by_hash]


class ShardList(Sequence[ShardInfo]):
    """``index.shards`` of a table: a :class:`ShardInfo` made when asked for."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...

    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self.table.info(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"shard {i} of an index of {n} shards")
        return self.table.info(i % n)

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self.table.info(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} shards of {self.table.source}>"


def _columns(docs: list[Any], first: int, url: str) -> tuple[list[Any], list[Any], list[Any]]:
    """URLs, counts and sizes of shard entries ``docs`` (numbered from ``first``), checked."""
    try:
        rel = [d["url"] for d in docs]
        counts = [d["num_samples"] for d in docs]
        sizes = [d["total_bytes"] for d in docs]
        ok = (
            all(type(u) is str and u for u in rel)
            and all(type(c) is int and c >= 0 for c in counts)
            and all(type(s) is int and s >= 0 for s in sizes)
        )
    except (TypeError, KeyError):
        ok = False
    if ok:
        return rel, counts, sizes
    # Find the first bad field, and name it.
    for k, d in enumerate(docs):
        where = f"shards[{first + k}]"
        if not isinstance(d, dict):
            raise fail(url, where, f"should be an object, got {type(d).__name__}")
        u = d.get("url")
        if not isinstance(u, str) or not u:
            raise fail(url, f"{where}.url", f"should be a non-empty string, got {u!r}")
        for name in ("num_samples", "total_bytes"):
            v = d.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise fail(url, f"{where}.{name}", f"should be an int >= 0, got {v!r}")
    raise AssertionError("unreachable")  # pragma: no cover


def read_table(
    header: Mapping[str, Any],
    lines: Iterator[str] | None,
    shards_doc: list[Any] | None,
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> Table:
    """Build the table of a version-2 descriptor from its shard lines (or its parsed list).

    ``lines`` are the lines after the header line of a descriptor as ``save`` writes it (one
    shard a line, then ``]}``), parsed a batch at a time so that the shard objects of the whole
    file never exist at once; ``shards_doc`` is the ``shards`` list of a parsed document.

    Raises:
        IndexFormatError: A bad field, a repeated URL, or totals that do not match.
    """
    samples = header.get("samples")
    if not isinstance(samples, str) or not samples:
        raise fail(url, "samples", f"should be the sample files' folder, got {samples!r}")
    rel: list[str] = []
    counts: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    etags: list[str | None] = []
    any_etag = False

    def add(docs: list[Any]) -> None:
        nonlocal any_etag
        first = len(rel)
        r, c, s = _columns(docs, first, url)
        rel.extend(r)
        counts.append(np.asarray(c, dtype=np.int64))
        sizes.append(np.asarray(s, dtype=np.int64))
        tags = [d.get("etag") for d in docs]
        any_etag = any_etag or any(t is not None for t in tags)
        etags.extend(tags)

    if shards_doc is not None:
        for k in range(0, len(shards_doc), _BATCH):
            add(shards_doc[k : k + _BATCH])
    else:
        assert lines is not None
        batch: list[str] = []
        for line in lines:
            text = line.strip()
            if text.startswith("]"):
                break
            if text:
                batch.append(text.rstrip(","))
            if len(batch) == _BATCH:
                add(_parse(batch, url, len(rel)))
                batch = []
        if batch:
            add(_parse(batch, url, len(rel)))
    count_arr = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    size_arr = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    table = Table(
        url,
        rel,
        count_arr,
        size_arr,
        etags if any_etag else None,
        samples,
        storage_options=storage_options,
        cache_bytes=cache_bytes,
    )
    rel.clear()  # the strings live on in the table's one string
    _check_unique(table, url)
    for name, want in (("num_shards", len(table)), ("num_samples", int(count_arr.sum()))):
        if name in header and header[name] != want:
            raise fail(url, name, f"is {header[name]!r} but the shards hold {want}")
    return table


def _check_unique(table: Table, url: str) -> None:
    """No URL twice: equal hashes are compared (and only they)."""
    same = np.flatnonzero(table.hashes[1:] == table.hashes[:-1])
    if not same.size:
        return
    repeats = []
    for k in same.tolist():
        a, b = sorted((int(table.by_hash[k]), int(table.by_hash[k + 1])))
        if table.url(a) == table.url(b):
            repeats.append((b, a))
    if repeats:
        b, a = min(repeats)
        raise fail(url, f"shards[{b}].url", f"{table.rel(b)!r} repeats shards[{a}]")


def _parse(batch: list[str], url: str, first: int) -> list[Any]:
    try:
        return json.loads("[" + ",".join(batch) + "]")  # type: ignore[no-any-return]
    except json.JSONDecodeError as exc:
        raise fail(
            url, f"shards[{first}..{first + len(batch) - 1}]", f"are not JSON ({exc})"
        ) from exc


def iter_lines(f: IO[str]) -> Iterator[str]:
    """The lines of ``f`` (a helper so the loader can hand over an open text file)."""
    yield from f
