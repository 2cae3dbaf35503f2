"""The shard index: a sidecar JSON listing every shard's samples and their byte ranges.

With an index the loader knows the dataset size without reading it, partitions an epoch by
sample ranges (:mod:`shardpipes.partition`), and reads a range of samples with one seek or
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

import bisect
import gzip
import io
import json
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, cast

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from tqdm.auto import tqdm

from shardpipes.datapipes.iter._remote import open_remote, with_retries
from shardpipes.datapipes.iter._retry import Redactor, RetryPolicy
from shardpipes.datapipes.iter._tarparse import BLOCK, iter_tar
from shardpipes.datapipes.iter.fsspec import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    filesystem,
    open_url,
)
from shardpipes.datapipes.iter.webdataset import split_key
from shardpipes.errors import (
    SampleFormatError,
    ShardFormatError,
    ShardpipesError,
    ShardReadError,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "IndexFormatError",
    "RangeFile",
    "SampleSpan",
    "ShardIndex",
    "ShardInfo",
    "build_index",
    "default_index_url",
    "find_index",
    "index_shard",
    "open_range",
    "scan_samples",
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


class SampleSpan(NamedTuple):
    """One sample found by :func:`scan_samples`: its key, byte range and fields.

    ``fields`` holds ``(extension, data size)`` per member, in archive order.
    """

    key: str
    offset: int
    size: int
    fields: tuple[tuple[str, int], ...]


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def scan_samples(stream: IO[bytes], url: str, *, chunk_size: int = _CHUNK) -> Iterator[SampleSpan]:
    """Group the members of the tar read from ``stream`` into samples, as ``webdataset`` does.

    Consecutive members with the same key (:func:`~shardpipes.datapipes.iter.webdataset.split_key`)
    form one sample; member data is not kept.

    Raises:
        ShardFormatError: Truncated or corrupt tar, naming ``url`` and the byte offset.
        SampleFormatError: A member without an extension, a key that comes back after other
            keys, or a sample with two members of one extension; naming ``url``, key and offset.

    Examples:
        >>> import io, tarfile
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as t:
        ...     for name in ("a.cls", "a.txt", "b.cls"):
        ...         info = tarfile.TarInfo(name); info.size = 1
        ...         t.addfile(info, io.BytesIO(b"x"))
        >>> [(s.key, s.offset, s.size) for s in scan_samples(io.BytesIO(buf.getvalue()), "t.tar")]
        [('a', 0, 2048), ('b', 2048, 1024)]
    """
    key: str | None = None
    start = end = 0
    fields: list[tuple[str, int]] = []
    seen: set[str] = set()
    for entry in iter_tar(stream, url, chunk_size=chunk_size):
        member_key, ext = split_key(entry.name)
        if not ext:
            raise SampleFormatError(
                f"{url}: member {entry.name!r} at byte offset {entry.offset} has no extension "
                "(a sample field needs one, as in 'key.jpg')",
                url=url,
                key=entry.name,
            )
        if member_key != key:
            if key is not None:
                yield SampleSpan(key, start, end - start, tuple(fields))
            if member_key in seen:
                raise SampleFormatError(
                    f"{url}: key {member_key!r} appears again at byte offset {entry.offset} after "
                    "other keys; the members of a sample must be adjacent",
                    url=url,
                    key=member_key,
                )
            seen.add(member_key)
            key, start, fields = member_key, entry.offset, []
        elif any(ext == e for e, _ in fields):
            raise SampleFormatError(
                f"{url}: sample {member_key!r} has two {ext!r} members (the second at byte "
                f"offset {entry.offset})",
                url=url,
                key=member_key,
            )
        fields.append((ext, len(entry.data)))
        end = entry.data_offset + _padded(len(entry.data))
    if key is not None:
        yield SampleSpan(key, start, end - start, tuple(fields))


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


def index_shard(
    url: str, *, storage_options: Mapping[str, Any] | None = None, chunk_size: int = _CHUNK
) -> ShardInfo:
    """Scan one shard, streaming, and return its :class:`ShardInfo` (with ``url`` made absolute).

    Raises:
        ShardReadError: The shard cannot be opened, naming the URL.
        ShardFormatError: Truncated or corrupt tar, naming the URL and byte offset.
        SampleFormatError: Members that do not form samples, naming the URL, key and offset.

    Examples:
        >>> import tempfile, os
        >>> from shardpipes.synthetic import write_synthetic
        >>> [path] = write_synthetic(tempfile.mkdtemp(), shards=1, samples=3)
        >>> info = index_shard(path)
        >>> info.keys, info.total_bytes == os.path.getsize(path)
        (['000000_000000', '000000_000001', '000000_000002'], True)
    """
    url = _absolute(url)
    stream = open_url(url, "rb", storage_options)
    counted = _Counting(stream)
    info = ShardInfo(url, 0)
    try:
        # iter_tar only calls read(n): the counting wrapper is all the IO it needs.
        for s in scan_samples(cast(IO[bytes], counted), url, chunk_size=chunk_size):
            info.keys.append(s.key)
            info.offsets.append(s.offset)
            info.sizes.append(s.size)
        while counted.read(_CHUNK):  # the end-of-archive blocks and record padding
            pass
    finally:
        stream.close()
    info.total_bytes = counted.count
    return info


class _Counting:
    """Counts the bytes read from a stream."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.count += len(data)
        return data


@dataclass
class ShardIndex:
    """The index of a dataset: one :class:`ShardInfo` per shard, in order.

    Attributes:
        shards: The shards.
        source: The file the index was loaded from, or ``None`` for a built index.

    Examples:
        >>> import tempfile, os
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
        """Samples per shard: the input of :func:`shardpipes.partition.partition_samples`."""
        return [s.num_samples for s in self.shards]

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
            i = where.get(_absolute(url))
            if i is None:
                raise KeyError(f"{url}: not in the index {self.source or '(built in memory)'}")
            out.append(i)
        return out

    def to_dict(self, base: str | None = None) -> dict[str, Any]:
        """Return the JSON document; URLs below the folder of the index file ``base`` are made relative."""
        base_dir = _parent(_absolute(base)) + "/" if base else None
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
            fs.makedirs(_parent(path), exist_ok=True)
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
    base_dir = _parent(_absolute(url))
    shards: list[ShardInfo] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(shards_doc):
        where = f"shards[{i}]."
        if not isinstance(s, dict):
            raise _fail(url, f"shards[{i}]", f"should be an object, got {type(s).__name__}")
        rel = s.get("url")
        if not isinstance(rel, str) or not rel:
            raise _fail(url, f"{where}url", f"should be a non-empty string, got {rel!r}")
        shard_url = _resolve(rel, base_dir)
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


def _absolute(url: str) -> str:
    """Local paths (and ``file://`` URLs) become absolute paths; other URLs stay as they are."""
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" in url:
        return url
    return os.path.abspath(url)


def _parent(url: str) -> str:
    """The folder of an absolute local path or URL (``/`` for a file at the root)."""
    return url.rstrip("/").rsplit("/", 1)[0] or "/"


def _resolve(stored: str, base_dir: str) -> str:
    if "://" in stored or os.path.isabs(stored):
        return _absolute(stored)
    if "://" in base_dir:
        proto, rest = base_dir.split("://", 1)
        return f"{proto}://{posixpath.normpath(posixpath.join(rest, stored))}"
    return os.path.normpath(os.path.join(base_dir, stored))


def build_index(
    urls: Iterable[str],
    *,
    workers: int = 8,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    chunk_size: int = _CHUNK,
) -> ShardIndex:
    """Scan shards, streaming and ``workers`` at a time in threads, and return their index.

    Args:
        urls: Shard URLs (local paths or any fsspec URL); relative paths are made absolute.
        workers: Shards scanned at once. Default: ``8``.
        storage_options: Passed to fsspec (endpoint, credentials, ...).
        progress: Show a tqdm progress bar on stderr. Default: ``True``.
        chunk_size: Bytes read at a time. Default: ``1 MiB``.

    Returns:
        ShardIndex: The shards in the order of ``urls``.

    Raises:
        ValueError: No URLs, a URL given twice, or ``workers < 1``.
        ShardReadError, ShardFormatError, SampleFormatError: A shard cannot be read or parsed
            (as :func:`index_shard`); the message names its URL and byte offset.

    Examples:
        >>> import tempfile
        >>> from shardpipes.synthetic import write_synthetic
        >>> paths = write_synthetic(tempfile.mkdtemp(), shards=3, samples=[2, 0, 5])
        >>> build_index(paths, workers=2, progress=False).counts
        [2, 0, 5]
    """
    urls = [_absolute(u) for u in urls]
    if not urls:
        raise ValueError("build_index got no shard URLs")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers should be an int >= 1, got {workers!r}")
    seen: set[str] = set()
    for u in urls:
        if u in seen:
            raise ValueError(f"shard URL {u!r} is given more than once")
        seen.add(u)
    results: dict[int, ShardInfo] = {}
    with ThreadPoolExecutor(min(workers, len(urls)), thread_name_prefix="shardpipes-index") as pool:
        futures = {
            pool.submit(index_shard, u, storage_options=storage_options, chunk_size=chunk_size): i
            for i, u in enumerate(urls)
        }
        with tqdm(total=len(urls), unit="shard", desc="indexing", disable=not progress) as bar:
            samples = 0
            try:
                for fut in as_completed(futures):
                    info = fut.result()
                    results[futures[fut]] = info
                    samples += info.num_samples
                    bar.set_postfix(samples=samples, refresh=False)
                    bar.update(1)
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
    return ShardIndex([results[i] for i in range(len(urls))])


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
    norm = [_absolute(u) for u in urls]
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
        >>> build_index(paths, progress=False).save(default_index_url(paths))
        >>> os.path.basename(find_index(paths))
        'train.index.json'
    """
    candidate = default_index_url(urls)
    fs, path = filesystem(candidate, storage_options)
    return candidate if fs.exists(path) else None


_SPAN_GAP = 256 << 10  # spans closer than this are fetched with one request


class _LocalSpans(io.RawIOBase):
    """The bytes of several spans of one local file, one after the other."""

    def __init__(self, path: str, spans: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        self._f = open(path, "rb")  # noqa: SIM115  # closed by close()
        self._spans = list(spans)
        self._i = 0
        self._left = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        want = sum(s for _, s in self._spans[self._i :]) + self._left if n is None or n < 0 else n
        parts = []
        while want > 0:
            if not self._left:
                if self._i == len(self._spans):
                    break
                off, self._left = self._spans[self._i]
                self._i += 1
                self._f.seek(off)
            data = self._f.read(min(want, self._left))
            if not data:
                break  # RangeFile reports the short read
            parts.append(data)
            want -= len(data)
            self._left -= len(data)
        return b"".join(parts)

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_spans(
    fs: Any,
    path: str,
    spans: Sequence[tuple[int, int]],
    redactor: Redactor,
    retry: RetryPolicy,
) -> IO[bytes]:
    if isinstance(fs, LocalFileSystem):
        return cast(IO[bytes], _LocalSpans(path, spans))
    groups: list[list[int]] = []  # [start, end] of each request
    for off, size in sorted(spans):
        if groups and off - groups[-1][1] <= _SPAN_GAP:
            groups[-1][1] = max(groups[-1][1], off + size)
        else:
            groups.append([off, off + size])
    starts = [g[0] for g in groups]

    def fetch() -> list[bytes]:
        blobs = fs.cat_ranges([path] * len(groups), starts, [g[1] for g in groups])
        for blob in blobs:
            if isinstance(blob, BaseException):  # async filesystems return errors in place
                raise blob
        return list(blobs)

    blobs = with_retries(fetch, redactor, retry, "sparse range read", starts[0])
    parts = []
    for off, size in spans:
        i = bisect.bisect_right(starts, off) - 1
        parts.append(blobs[i][off - starts[i] : off - starts[i] + size])
    return io.BytesIO(b"".join(parts))


class RangeFile(io.RawIOBase):
    """A read-only stream of bytes ``[offset, offset + size)`` of a shard, returned by :func:`open_range`.

    ``read(n)`` returns exactly ``n`` bytes until the range ends (then fewer, then ``b""``).

    Attributes:
        url: The shard.
        offset: Where the range starts in the shard.
        size: Bytes in the range.
    """

    def __init__(self, raw: IO[bytes], url: str, offset: int, size: int) -> None:
        super().__init__()
        self._raw = raw
        self.url = url
        self.offset = offset
        self.size = size
        self._pos = 0

    def readable(self) -> bool:
        """``True``."""
        return True

    def tell(self) -> int:
        """Bytes read so far, from the start of the range."""
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        """Read up to ``n`` bytes (all that is left of the range for ``n < 0``)."""
        left = self.size - self._pos
        want = left if n is None or n < 0 else min(n, left)
        parts = []
        got = 0
        while got < want:
            data = self._raw.read(want - got)
            if not data:
                at = self.offset + self._pos + got
                raise ShardFormatError(
                    f"{self.url}: the shard ends at byte offset {at}, inside the indexed range "
                    f"[{self.offset}, {self.offset + self.size}): is the index out of date?",
                    url=self.url,
                    offset=at,
                )
            parts.append(data)
            got += len(data)
        self._pos += got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readall(self) -> bytes:
        """Read the rest of the range."""
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer``; return the number of bytes read."""
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        """Close the underlying file."""
        if not self.closed:
            self._raw.close()
        super().close()


def open_range(
    url: str,
    offset: int,
    size: int,
    storage_options: Mapping[str, Any] | None = None,
    *,
    max_fetch: int = 8 << 20,
    block_size: int = 8 << 20,
    spans: Sequence[tuple[int, int]] = (),
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float | None = 60.0,
) -> RangeFile:
    """Open bytes ``[offset, offset + size)`` of a shard, e.g. a run of samples from the index.

    With ``spans`` (``(offset, size)`` pairs, ``size`` their total), the stream is those spans
    one after the other: a *sparse* range, as a resumed epoch reads the samples that sat in a
    shuffle buffer. Local files: one ``open``, a ``seek`` per span. Other filesystems: one
    ``fs.cat_ranges`` call (concurrent requests on s3fs, gcsfs and HTTP), spans closer than
    256 KiB fetched together.

    Remote reads are retried as ``open_files_by_fsspec``'s are: a fetched range is fetched again
    whole after a transient error (a connection reset, a 5xx, a time-out), a streamed one
    resumes at the byte offset it had reached; permanent errors (no such key, 403) fail at once.

    Local files: one ``open`` and one ``seek``. Other filesystems: a range of at most
    ``max_fetch`` bytes is fetched whole with one ranged request (``fs.cat_file(path, start,
    end)``); a longer one is streamed from one ``fs.open`` + ``seek``, ``block_size`` bytes per
    request. ``iter_tar(stream, url, require_end=False)`` parses the stream on its own (a range
    has no end-of-archive blocks); its offsets are then relative to ``offset``.

    Args:
        url: Shard URL.
        offset: First byte, a member header (``ShardInfo.byte_range`` gives it).
        size: Bytes to read.
        storage_options: Passed to fsspec.
        max_fetch: Largest range fetched in one request. Default: ``8 MiB``.
        block_size: Request size for longer ranges. Default: ``8 MiB``.
        spans: ``(offset, size)`` byte spans for a sparse range (then ``size`` is their total).
        retries: Retries of a transient error. Default: ``5``.
        backoff: First retry delay in seconds, doubled each time. Default: ``0.5``.
        timeout: Seconds a remote request may take. Default: ``60``.

    Raises:
        ValueError: Negative ``offset`` or ``size``.
        ShardReadError: The shard cannot be opened, naming the URL.
        ShardFormatError: (on read) the shard ends inside the range: a stale index.

    Examples:
        >>> import tempfile
        >>> from shardpipes.datapipes.iter._tarparse import iter_tar
        >>> from shardpipes.synthetic import write_synthetic
        >>> [path] = write_synthetic(tempfile.mkdtemp(), shards=1, samples=3)
        >>> shard = index_shard(path)
        >>> offset, size = shard.byte_range(1, 2)
        >>> with open_range(path, offset, size) as f:
        ...     [e.name for e in iter_tar(f, path, require_end=False)]
        ['000000_000001.cls', '000000_000001.json', '000000_000001.bin']
    """
    for name, value in (("offset", offset), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} should be an int >= 0, got {value!r}")
    fs, path = filesystem(url, storage_options)
    raw: IO[bytes]
    local = isinstance(fs, LocalFileSystem)
    retry = RetryPolicy(retries=retries, backoff=backoff, timeout=timeout)
    redactor = Redactor(url, storage_options)
    try:
        if spans:
            raw = _open_spans(fs, path, spans, redactor, retry)
        elif local:
            raw = open(path, "rb")  # noqa: SIM115  # closed by RangeFile.close
            raw.seek(offset)
        elif size <= max_fetch:
            data = with_retries(
                lambda: fs.cat_file(path, start=offset, end=offset + size), redactor, retry,
                "range read", offset,
            )  # fmt: skip
            raw = io.BytesIO(data)
        else:
            stream = open_remote(
                url, fs, path, block_size=block_size, readahead=2, retry=retry,
                storage_options=storage_options, start=offset,
            )  # fmt: skip
            raw = cast(IO[bytes], stream)
    except ShardReadError:
        raise  # already names the URL (without credentials) and the offset
    except FileNotFoundError as exc:
        raise MissingShardError(f"{url}: no such file", url=url, offset=offset) from exc
    except PermissionError as exc:
        raise ForbiddenShardError(f"{url}: permission denied", url=url, offset=offset) from exc
    except IsADirectoryError as exc:
        raise NotAFileError(f"{url}: is a directory, not a file", url=url, offset=offset) from exc
    return RangeFile(raw, url, offset, size)
