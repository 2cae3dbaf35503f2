"""The shard index: what a dataset's shards hold, so that the loader can plan without reading them.

With an index the loader knows the dataset size without reading it, partitions an epoch by
sample ranges (:mod:`shardpipes.plan.partition`), and reads a range of samples with one seek or
one HTTP range request (:func:`open_range`). The file format is described in
``docs/index-format.md``. Version 2 (written by default) is a descriptor with one line per
shard, what planning needs::

    {"format":"shardpipes-index","version":2,"num_shards":2,"num_samples":5,
     "total_bytes":20480,"samples":"train.index.samples","shards":[
    {"url":"train-000000.tar","num_samples":3,"total_bytes":10240},
    ...]}

and, in the folder ``samples`` names, one small binary file per shard with its samples' byte
spans and keys (:mod:`shardpipes.index.sidecar`), read only by the readers of that shard, when
they first ask for a byte range. Version 1 (still read; ``save(..., version=1)`` writes it)
holds every sample's ``keys``, ``offsets`` and ``sizes`` inline.

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
from typing import Any

import numpy as np

from shardpipes.index.shard import IndexFormatError, ShardInfo, fail
from shardpipes.index.sidecar import encode, sidecar_dir, sidecar_path
from shardpipes.index.table import DEFAULT_CACHE_BYTES, ShardList, Table, read_table
from shardpipes.index.v1 import validate_v1
from shardpipes.storage.open import filesystem, open_text
from shardpipes.storage.urls import SizedUrl, absolute, parent
from shardpipes.storage.write import write_atomic, write_bytes

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
#: The version ``save`` writes; every version up to it is read.
VERSION = 2


class ShardIndex:
    """The index of a dataset: one :class:`ShardInfo` per shard, in order.

    A built index holds every shard's samples; one loaded from a version-2 file holds per
    shard only its URL, sample count and size, and loads a shard's spans when they are asked
    for (``shards[i].byte_range(...)``), keeping at most ``cache_bytes`` of them.

    Attributes:
        shards: The shards (a list, or a sequence that makes each ``ShardInfo`` when asked).
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

    def __init__(self, shards: Iterable[ShardInfo] = (), source: str | None = None) -> None:
        self._list: list[ShardInfo] | None = list(shards)
        self._table: Table | None = None
        self.source = source
        #: The format version of the file it was loaded from (``None``: built in memory).
        self.version: int | None = None
        self._where: dict[str, int] | None = None

    @classmethod
    def _of_table(cls, table: Table) -> ShardIndex:
        index = cls((), source=table.source)
        index._list, index._table, index.version = None, table, 2
        return index

    @property
    def shards(self) -> Sequence[ShardInfo]:
        """The shards, in order."""
        if self._table is not None:
            return ShardList(self._table)
        assert self._list is not None
        return self._list

    @shards.setter
    def shards(self, value: Iterable[ShardInfo]) -> None:
        self._list, self._table, self._where = list(value), None, None

    def __len__(self) -> int:
        return len(self._table) if self._table is not None else len(self._list or ())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return len(self) == len(other) and all(
            a == b for a, b in zip(self.shards, other.shards, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardIndex({len(self)} shards, {self.num_samples} samples, source={self.source!r})"

    @property
    def count_array(self) -> np.ndarray:
        """Samples per shard as an int64 array (what the epoch plan reads)."""
        if self._table is not None:
            return self._table.counts
        return np.fromiter((s.num_samples for s in self.shards), np.int64, len(self))

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return int(self.count_array.sum())

    @property
    def counts(self) -> list[int]:
        """Samples per shard: the input of :func:`shardpipes.plan.partition.partition_samples`."""
        return self.count_array.tolist()  # type: ignore[no-any-return]

    @property
    def urls(self) -> list[str]:
        """Absolute shard URLs that carry their byte size (``SizedUrl``).

        Opening them on S3 or GCS then needs no size look-up.
        """
        if self._table is not None:
            sizes = self._table.sizes.tolist()
            return [SizedUrl(self._table.url(i), sizes[i]) for i in range(len(self._table))]
        return [SizedUrl(s.url, s.total_bytes) for s in self.shards]

    @property
    def total_bytes(self) -> int:
        """Bytes in all shard files."""
        if self._table is not None:
            return int(self._table.sizes.sum())
        return sum(s.total_bytes for s in self.shards)

    def lookup(self, url: str) -> int:
        """Return the position of the shard ``url`` (relative local paths are made absolute).

        Raises:
            KeyError: No shard with that URL, naming it and the index.
        """
        return int(self.positions([url])[0])

    def positions(self, urls: Iterable[str]) -> np.ndarray:
        """The positions of the shards ``urls`` (as :meth:`lookup`), as an int64 array.

        Raises:
            KeyError: A URL not in the index, naming it and the index.
        """
        urls = list(urls)
        if self._table is not None:
            found = self._table.positions(urls)
        else:
            if self._where is None or len(self._where) != len(self):
                self._where = {s.url: i for i, s in enumerate(self.shards)}
            found = [self._where.get(u) for u in urls]
        if None not in found:
            return np.asarray(found, dtype=np.int64)
        out = np.empty(len(urls), dtype=np.int64)
        for k, i in enumerate(found):
            if i is None:  # a relative path, a file:// URL: the absolute form is what is stored
                i = self._find(urls[k])
            out[k] = i
        return out

    def _find(self, url: str) -> int:
        full = absolute(url)
        if self._table is not None:
            i = self._table.positions([full])[0]
        else:
            i = (self._where or {}).get(full)
        if i is None:
            raise KeyError(f"{url}: not in the index {self.source or '(built in memory)'}")
        return i

    def select(self, urls: Iterable[str]) -> ShardIndex:
        """Return the index of ``urls`` only, in that order.

        Raises:
            KeyError: A URL not in the index.
        """
        shards = self.shards
        return ShardIndex([shards[int(i)] for i in self.positions(urls)], source=self.source)

    def to_dict(self, base: str | None = None) -> dict[str, Any]:
        """Return the version-1 JSON document (every sample inline).

        URLs below the folder of the index file ``base`` are made relative.
        """
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
            "version": 1,
            "num_shards": len(shards),
            "num_samples": self.num_samples,
            "total_bytes": self.total_bytes,
            "shards": shards,
        }

    def save(
        self,
        url: str,
        *,
        version: int = VERSION,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the index to ``url`` (compact JSON, one line per shard; ``.gz`` compresses).

        Version 2 (the default) writes the descriptor and, in the folder next to it
        (``train.index.samples/`` for ``train.index.json``), one sample file per shard;
        version 1 writes everything into the one file. A local file is replaced atomically.
        """
        if version == 1:
            doc = self.to_dict(url)
            shards = doc.pop("shards")
            sep = (",", ":")
            lines = [json.dumps(s, separators=sep, ensure_ascii=False) for s in shards]
            write_descriptor(url, doc, lines, storage_options)
            return
        if version != 2:
            raise ValueError(f"version should be 1 or 2, got {version!r}")
        base_dir = parent(absolute(url)) + "/"
        lines = []
        for i, s in enumerate(self.shards):
            rel = s.url[len(base_dir) :] if s.url.startswith(base_dir) else s.url
            offsets, sizes = s.spans()
            write_bytes(
                sidecar_path(url, i),
                encode(rel, s.total_bytes, s.keys, offsets, sizes),
                storage_options,
            )
            lines.append(shard_line(rel, s.num_samples, s.total_bytes, s.etag))
        write_descriptor(url, self._header(url), lines, storage_options)

    def _header(self, url: str) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": 2,
            "num_shards": len(self),
            "num_samples": self.num_samples,
            "total_bytes": self.total_bytes,
            "samples": sidecar_dir(url),
        }

    @classmethod
    def load(
        cls,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> ShardIndex:
        """Read and validate the index file ``url`` (version 1 or 2); shard URLs come back absolute.

        A version-2 descriptor is read a batch of lines at a time; its shards' sample files
        are read later, each when one of its byte ranges is first asked for, and at most
        ``cache_bytes`` of their spans are kept (least recently used out first).

        Raises:
            FileNotFoundError: No such file.
            IndexFormatError: Not JSON, not an index, a newer version, or a bad field; the
                message names the file and the field.
        """
        try:
            with open_text(url, storage_options, compression=_compression(url)) as f:
                first = f.readline()
                header = _line_header(first)
                if header is not None and _version(header, url) == 2:
                    table = read_table(
                        header,
                        iter(f),
                        None,
                        url,
                        storage_options=storage_options,
                        cache_bytes=cache_bytes,
                    )
                    return cls._of_table(table)
                text = first + f.read()
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
        return cls.from_dict(doc, url, storage_options=storage_options, cache_bytes=cache_bytes)

    @classmethod
    def from_dict(
        cls,
        doc: Any,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> ShardIndex:
        """Validate the JSON document ``doc`` read from the index file ``url`` and build the index.

        Relative shard URLs are resolved against the folder of ``url`` (and, for version 2,
        so is the folder of the sample files).

        Raises:
            IndexFormatError: A bad field, naming ``url`` and the field.
        """
        if _version(doc, url) == 2:
            shards = doc.get("shards")
            if not isinstance(shards, list):
                raise fail(url, "shards", f"should be a list, got {type(shards).__name__}")
            table = read_table(
                doc, None, shards, url, storage_options=storage_options, cache_bytes=cache_bytes
            )
            return cls._of_table(table)
        index = cls(validate_v1(doc, url), source=url)
        index.version = 1
        return index


def _line_header(first: str) -> dict[str, Any] | None:
    """The header of a descriptor whose first line ends with ``"shards":[`` (as saved)."""
    line = first.rstrip()
    if not line.endswith('"shards":['):
        return None
    try:
        doc = json.loads(line + "]}")
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _version(doc: Any, url: str) -> int:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise fail(url, "format", f"should be {FORMAT!r}, got {got!r}: not a shardpipes index")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise fail(url, "version", f"should be a positive int, got {version!r}")
    if version > VERSION:
        raise fail(
            url,
            "version",
            f"is {version}; this shardpipes reads versions 1 to {VERSION}: upgrade shardpipes",
        )
    return version


def shard_line(url: str, num_samples: int, total_bytes: int, etag: str | None = None) -> str:
    """One shard's line of a version-2 descriptor."""
    entry: dict[str, Any] = {"url": url, "num_samples": num_samples, "total_bytes": total_bytes}
    if etag is not None:
        entry["etag"] = etag
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False)


def write_descriptor(
    url: str,
    header: Mapping[str, Any],
    lines: Iterable[str],
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Write a descriptor: the header, then one line per shard (atomically when local)."""
    with write_atomic(url, storage_options, mode="wt", compression=_compression(url)) as f:
        f.write(json.dumps(dict(header), separators=(",", ":"))[:-1] + ',"shards":[\n')
        sep = ""
        for line in lines:
            f.write(sep + line)
            sep = ",\n"
        f.write("\n]}\n")


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
