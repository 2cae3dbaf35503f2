"""The shard index: a sidecar JSON listing every shard's samples and their byte ranges.

With an index the loader knows the dataset size without reading it, partitions an epoch by
sample ranges (:mod:`shardpipes.plan.partition`), and reads a range of samples with one seek or
one HTTP range request (:func:`open_range`). The file format is described in
``docs/index-format.md``; in short::

    {"format": "shardpipes-index", "version": 1, "num_shards": 2, "num_samples": 5,
     "total_bytes": 20480, "shards": [
    {"url": "train-000000.tar", "num_samples": 3, "total_bytes": 10240,
     "keys": ["a", "b", "c"], "offsets": [0, 2048, 4096], "sizes": [2048, 2048, 2048]},
    ...]}

Sample ``j`` of a shard is the run of tar members in bytes ``[offsets[j], offsets[j] +
sizes[j])``: from the first header of its first member to the end of its last member's padded
data, so that run parses on its own. Shard URLs below the index file's folder are stored
relative to it (the dataset folder can move), others absolute; in memory they are always
absolute. The default sidecar location is :func:`default_index_url`.
"""

from __future__ import annotations

import gzip
import json
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shardpipes.errors import ShardpipesError
from shardpipes.formats.tarheaders import BLOCK
from shardpipes.storage.open import filesystem
from shardpipes.storage.urls import absolute, parent, resolve

__all__ = [
    "FORMAT",
    "VERSION",
    "IndexFormatError",
    "ShardIndex",
    "ShardInfo",
    "default_index_url",
    "find_index",
]

FORMAT = "shardpipes-index"
VERSION = 1
_CHUNK = 1 << 20


class IndexFormatError(ShardpipesError, ValueError):
    """An index file is not a valid shardpipes index; the message names the file and the field.

    Attributes:
        url: The index file.
        field: The bad field, e.g. ``"shards[3].offsets[7]"``.
    """

    def __init__(self, message: str, *, url: str = "", field: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_index_error, (self.args[0], self.url, self.field))


def _rebuild_index_error(message: str, url: str, field: str) -> IndexFormatError:
    return IndexFormatError(message, url=url, field=field)


@dataclass
class ShardInfo:
    """The index of one shard.

    Attributes:
        url: Absolute shard URL (a local path, or ``scheme://...``).
        total_bytes: Size of the shard file in bytes.
        keys: Sample keys, in archive order.
        offsets: Byte offset of each sample's first member header.
        sizes: Bytes from that offset to the end of the sample's last member's padded data.

    Examples:
        >>> s = ShardInfo("/d/a.tar", 10240, ["x", "y"], [0, 2048], [2048, 1024])
        >>> s.num_samples, s.byte_range(0, 2)
        (2, (0, 3072))
    """

    url: str
    total_bytes: int
    keys: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        """Samples in the shard."""
        return len(self.keys)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Return ``(offset, size)`` of samples ``start`` to ``stop`` (exclusive): one read.

        The bytes parse on their own with ``iter_tar(..., require_end=False)`` (members only,
        no end-of-archive blocks).

        Raises:
            ValueError: An empty or out-of-bounds sample range, naming it and the shard.
        """
        if not 0 <= start < stop <= self.num_samples:
            raise ValueError(
                f"{self.url}: sample range [{start}, {stop}) is empty or outside [0, {self.num_samples})"
            )
        offset = self.offsets[start]
        return offset, self.offsets[stop - 1] + self.sizes[stop - 1] - offset


@dataclass
class ShardIndex:
    """The index of a dataset: one :class:`ShardInfo` per shard, in order.

    Attributes:
        shards: The shards.
        source: The file the index was loaded from, or ``None`` for a built index.

    Examples:
        >>> import tempfile, os
        >>> from shardpipes.index import build_index
        >>> from shardpipes.synthetic import write_synthetic
        >>> d = tempfile.mkdtemp()
        >>> index = build_index(write_synthetic(d, shards=2, samples=[3, 4]), progress=False)
        >>> index.save(os.path.join(d, "train.index.json"))
        >>> loaded = ShardIndex.load(os.path.join(d, "train.index.json"))
        >>> loaded.counts, loaded.num_samples, loaded.shards == index.shards
        ([3, 4], 7, True)
    """

    shards: list[ShardInfo]
    source: str | None = field(default=None, compare=False)

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return sum(s.num_samples for s in self.shards)

    @property
    def counts(self) -> list[int]:
        """Samples per shard: the input of :func:`shardpipes.plan.partition.partition_samples`."""
        return [s.num_samples for s in self.shards]

    @property
    def count_array(self) -> np.ndarray:
        """Samples per shard as an int64 array (what the epoch plan reads)."""
        return np.fromiter((s.num_samples for s in self.shards), np.int64, len(self.shards))

    def positions(self, urls: Iterable[str]) -> np.ndarray:
        """The positions of the shards ``urls`` (as :meth:`lookup`), one dictionary for all.

        Raises:
            KeyError: A URL not in the index, naming it and the index.
        """
        return np.asarray(self._positions(urls), dtype=np.int64)

    @property
    def urls(self) -> list[str]:
        """Absolute shard URLs."""
        return [s.url for s in self.shards]

    @property
    def total_bytes(self) -> int:
        """Bytes in all shard files."""
        return sum(s.total_bytes for s in self.shards)

    def lookup(self, url: str) -> int:
        """Return the position of the shard ``url`` (relative local paths are made absolute).

        Raises:
            KeyError: No shard with that URL, naming it and the index.
        """
        return self._positions([url])[0]

    def select(self, urls: Iterable[str]) -> ShardIndex:
        """Return the index of ``urls`` only, in that order.

        Raises:
            KeyError: A URL not in the index.
        """
        return ShardIndex([self.shards[i] for i in self._positions(urls)], source=self.source)

    def _positions(self, urls: Iterable[str]) -> list[int]:
        where = {s.url: i for i, s in enumerate(self.shards)}
        out = []
        for url in urls:
            i = where.get(absolute(url))
            if i is None:
                raise KeyError(f"{url}: not in the index {self.source or '(built in memory)'}")
            out.append(i)
        return out

    def to_dict(self, base: str | None = None) -> dict[str, Any]:
        """Return the JSON document; URLs below the folder of the index file ``base`` are made relative."""
        base_dir = parent(absolute(base)) + "/" if base else None
        shards = []
        for s in self.shards:
            url = s.url[len(base_dir) :] if base_dir and s.url.startswith(base_dir) else s.url
            shards.append(
                {
                    "url": url,
                    "num_samples": s.num_samples,
                    "total_bytes": s.total_bytes,
                    "keys": s.keys,
                    "offsets": s.offsets,
                    "sizes": s.sizes,
                }
            )
        return {
            "format": FORMAT,
            "version": VERSION,
            "num_shards": len(shards),
            "num_samples": self.num_samples,
            "total_bytes": self.total_bytes,
            "shards": shards,
        }

    def save(self, url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
        """Write the index to ``url`` (compact JSON, one line per shard; ``.gz`` compresses).

        A local file is replaced atomically.
        """
        doc = self.to_dict(url)
        shards = doc.pop("shards")
        sep = (",", ":")
        lines = ",\n".join(json.dumps(s, separators=sep, ensure_ascii=False) for s in shards)
        text = json.dumps(doc, separators=sep)[:-1] + ',"shards":[\n' + lines + "\n]}\n"
        fs, path = filesystem(url, storage_options)
        local = isinstance(fs, LocalFileSystem)
        target = f"{path}.tmp-{os.getpid()}" if local else url
        if local:
            fs.makedirs(parent(path), exist_ok=True)
        try:
            with fsspec.open(
                target,
                "wt",
                encoding="utf-8",
                compression=_compression(url),
                **dict(storage_options or {}),
            ) as f:
                f.write(text)
            if local:
                os.replace(target, path)
        finally:
            if local and os.path.exists(target):
                os.remove(target)  # only left when writing failed

    @classmethod
    def load(cls, url: str, *, storage_options: Mapping[str, Any] | None = None) -> ShardIndex:
        """Read and validate the index file ``url``; shard URLs come back absolute.

        Raises:
            FileNotFoundError: No such file.
            IndexFormatError: Not JSON, not an index, a newer version, or a bad field; the
                message names the file and the field.
        """
        try:
            with fsspec.open(
                url,
                "rt",
                encoding="utf-8",
                compression=_compression(url),
                **dict(storage_options or {}),
            ) as f:
                text = f.read()
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{url}: no such index file") from exc
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
            raise IndexFormatError(
                f"{url}: not a text index file ({exc})", url=url, field=""
            ) from exc
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise IndexFormatError(
                f"{url}: not a JSON index file ({exc})", url=url, field=""
            ) from exc
        return cls.from_dict(doc, url)

    @classmethod
    def from_dict(cls, doc: Any, url: str) -> ShardIndex:
        """Validate the JSON document ``doc`` read from the index file ``url`` and build the index.

        Relative shard URLs are resolved against the folder of ``url``.

        Raises:
            IndexFormatError: A bad field, naming ``url`` and the field.
        """
        return _validate(doc, url)


def _fail(url: str, fld: str, what: str) -> IndexFormatError:
    return IndexFormatError(f"{url}: {fld} {what}", url=url, field=fld)


def _int(doc: Mapping[str, Any], name: str, url: str, where: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(url, f"{where}{name}", f"should be an int >= 0, got {value!r}")
    return value


def _int_array(doc: Mapping[str, Any], name: str, n: int, url: str, where: str) -> np.ndarray:
    value = doc.get(name)
    fld = f"{where}{name}"
    if not isinstance(value, list) or len(value) != n:
        got = f"a list of {len(value)}" if isinstance(value, list) else repr(type(value).__name__)
        raise _fail(url, fld, f"should be a list of {n} ints (num_samples), got {got}")
    for j, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
            raise _fail(url, f"{fld}[{j}]", f"should be an int >= 0, got {v!r}")
    return np.asarray(value, dtype=np.int64)


def _validate(doc: Any, url: str) -> ShardIndex:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _fail(url, "format", f"should be {FORMAT!r}, got {got!r}: not a shardpipes index")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _fail(url, "version", f"should be a positive int, got {version!r}")
    if version > VERSION:
        raise _fail(
            url,
            "version",
            f"is {version}; this shardpipes reads version {VERSION}: upgrade shardpipes",
        )
    shards_doc = doc.get("shards")
    if not isinstance(shards_doc, list):
        raise _fail(url, "shards", f"should be a list, got {type(shards_doc).__name__}")
    base_dir = parent(absolute(url))
    shards: list[ShardInfo] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(shards_doc):
        where = f"shards[{i}]."
        if not isinstance(s, dict):
            raise _fail(url, f"shards[{i}]", f"should be an object, got {type(s).__name__}")
        rel = s.get("url")
        if not isinstance(rel, str) or not rel:
            raise _fail(url, f"{where}url", f"should be a non-empty string, got {rel!r}")
        shard_url = resolve(rel, base_dir)
        if shard_url in seen:
            raise _fail(url, f"{where}url", f"{rel!r} repeats shards[{seen[shard_url]}]")
        seen[shard_url] = i
        n = _int(s, "num_samples", url, where)
        total = _int(s, "total_bytes", url, where)
        keys = s.get("keys")
        if not isinstance(keys, list) or len(keys) != n:
            got = f"a list of {len(keys)}" if isinstance(keys, list) else repr(type(keys).__name__)
            raise _fail(
                url, f"{where}keys", f"should be a list of {n} strings (num_samples), got {got}"
            )
        for j, k in enumerate(keys):
            if not isinstance(k, str) or not k:
                raise _fail(url, f"{where}keys[{j}]", f"should be a non-empty string, got {k!r}")
        if len(set(keys)) != n:
            first: dict[str, int] = {}
            j = next(j for j, k in enumerate(keys) if first.setdefault(k, j) != j)
            raise _fail(
                url, f"{where}keys[{j}]", f"{keys[j]!r} repeats an earlier key of the shard"
            )
        offsets = _int_array(s, "offsets", n, url, where)
        sizes = _int_array(s, "sizes", n, url, where)
        _check_layout(offsets, sizes, total, url, where)
        shards.append(ShardInfo(shard_url, total, keys, offsets.tolist(), sizes.tolist()))
    for name, want in (
        ("num_shards", len(shards)),
        ("num_samples", sum(x.num_samples for x in shards)),
    ):
        if name in doc and doc[name] != want:
            raise _fail(url, name, f"is {doc[name]!r} but the shards hold {want}")
    return ShardIndex(shards, source=url)


def _check_layout(offsets: np.ndarray, sizes: np.ndarray, total: int, url: str, where: str) -> None:
    """Offsets and sizes are block-aligned, positive, in order, non-overlapping, inside the file."""
    checks: list[tuple[str, np.ndarray, str]] = [
        (
            "offsets",
            (offsets < 0) | (offsets % BLOCK != 0),
            f"should be a multiple of {BLOCK} >= 0",
        ),
        ("sizes", (sizes <= 0) | (sizes % BLOCK != 0), f"should be a positive multiple of {BLOCK}"),
        (
            "offsets",
            np.r_[False, offsets[1:] < offsets[:-1] + sizes[:-1]],
            "overlaps the previous sample",
        ),
        ("sizes", offsets + sizes > total, f"runs past total_bytes ({total})"),
    ]
    for name, bad, what in checks:
        hits = np.flatnonzero(bad)
        if hits.size:
            j = int(hits[0])
            value = int(offsets[j] if name == "offsets" else sizes[j])
            raise _fail(url, f"{where}{name}[{j}]", f"= {value} {what}")


def _compression(url: str) -> str | None:
    return "gzip" if url.endswith(".gz") else None


def default_index_url(urls: Sequence[str]) -> str:
    """Return the conventional sidecar location of the index of ``urls``.

    The folder is the shards' common folder; the name is the common prefix of the shard names
    (before their first dot) with trailing digits and ``-_.`` removed when there are several
    names, plus ``.index.json``; ``index.json`` when nothing is left.

    Raises:
        ValueError: No URLs, or shards on different filesystems (choose a location yourself).

    Examples:
        >>> default_index_url(["/d/train-000000.tar", "/d/train-000001.tar"])
        '/d/train.index.json'
        >>> default_index_url(["s3://b/x/val-0003.tar"])
        's3://b/x/val-0003.index.json'
        >>> default_index_url(["/d/a/0.tar", "/d/b/1.tar"])
        '/d/index.json'
    """
    if not urls:
        raise ValueError("default_index_url got no shard URLs")
    norm = [absolute(u) for u in urls]
    protos = {u.split("://", 1)[0] if "://" in u else "" for u in norm}
    if len(protos) > 1:
        raise ValueError(
            f"shards on different filesystems ({', '.join(sorted(protos))}): choose the index location"
        )
    proto = protos.pop()
    paths = [u.split("://", 1)[1] if proto else u for u in norm]
    folder = posixpath.commonpath([posixpath.dirname(p) or "." for p in paths])
    stems = sorted({posixpath.basename(p).split(".", 1)[0] for p in paths})
    stem = (
        stems[0]
        if len(stems) == 1
        else os.path.commonprefix(stems).rstrip("0123456789").rstrip("-_.")
    )
    name = f"{stem}.index.json" if stem else "index.json"
    path = posixpath.join(folder, name)
    return f"{proto}://{path}" if proto else path


def find_index(
    urls: Sequence[str], *, storage_options: Mapping[str, Any] | None = None
) -> str | None:
    """Return :func:`default_index_url` of ``urls`` if that file exists, else ``None``.

    Examples:
        >>> import tempfile, os
        >>> from shardpipes.synthetic import write_synthetic
        >>> paths = write_synthetic(tempfile.mkdtemp(), shards=2, samples=1)
        >>> find_index(paths) is None
        True
        >>> from shardpipes.index import build_index
        >>> build_index(paths, progress=False).save(default_index_url(paths))
        >>> os.path.basename(find_index(paths))
        'train.index.json'
    """
    candidate = default_index_url(urls)
    fs, path = filesystem(candidate, storage_options)
    return candidate if fs.exists(path) else None
