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
        where: dict[str, int],
        samples: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.source = source
        self.base_dir = parent(absolute(source))
        self.prefix = self.base_dir.rstrip("/") + "/"
        self.rel = rel
        self.counts = counts
        self.sizes = sizes
        self.etags = etags
        self.where = where
        self.samples = samples
        self.storage_options = dict(storage_options or {})
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.rel)

    def url(self, i: int) -> str:
        """The absolute URL of shard ``i``."""
        return resolve(self.rel[i], self.base_dir)

    def position(self, url: str) -> int | None:
        """The position of shard ``url``, or ``None``."""
        if url.startswith(self.prefix):
            i = self.where.get(url[len(self.prefix) :])
            if i is not None:
                return i
        i = self.where.get(url)
        if i is None:
            full = absolute(url)
            if full != url:
                return self.position(full)
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
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


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
    where: dict[str, int] = {}

    def add(docs: list[Any]) -> None:
        nonlocal any_etag
        first = len(rel)
        r, c, s = _columns(docs, first, url)
        for k, u in enumerate(r, first):
            if where.setdefault(u, k) != k:
                raise fail(url, f"shards[{k}].url", f"{u!r} repeats shards[{where[u]}]")
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
    for name, want in (("num_shards", len(rel)), ("num_samples", int(count_arr.sum()))):
        if name in header and header[name] != want:
            raise fail(url, name, f"is {header[name]!r} but the shards hold {want}")
    return Table(
        url,
        rel,
        count_arr,
        size_arr,
        etags if any_etag else None,
        where,
        samples,
        storage_options=storage_options,
        cache_bytes=cache_bytes,
    )


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
