"""Building an index: scanning shards in parallel threads, with a progress bar.

:func:`build_index` returns the index in memory; :func:`write_index` (``shardpipes index``)
streams it to disk, one sample file per shard as soon as that shard is scanned, and reuses the
sample files already there: it resumes after an interruption and adds shards to an index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from typing import IO, Any, cast

from tqdm.auto import tqdm

from shardpipes.index.document import (
    ShardIndex,
    ShardInfo,
    shard_line,
    write_descriptor,
)
from shardpipes.index.scan import CHUNK, scan_samples
from shardpipes.index.sidecar import encode, read_header, sidecar_dir, sidecar_path
from shardpipes.storage.open import filesystem, open_url
from shardpipes.storage.urls import absolute, parent
from shardpipes.storage.write import write_bytes

__all__ = ["IndexReport", "build_index", "index_shard", "write_index"]

logger = logging.getLogger(__name__)


def _compression(url: str) -> str | None:
    return "gzip" if url.endswith(".gz") else None


def index_shard(
    url: str, *, storage_options: Mapping[str, Any] | None = None, chunk_size: int = CHUNK
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
    url = absolute(url)
    stream = open_url(url, "rb", storage_options)
    counted = _Counting(stream)
    info = ShardInfo(url, 0)
    try:
        # iter_tar only calls read(n): the counting wrapper is all the IO it needs.
        for s in scan_samples(cast(IO[bytes], counted), url, chunk_size=chunk_size):
            info.keys.append(s.key)
            info.offsets.append(s.offset)
            info.sizes.append(s.size)
        while counted.read(CHUNK):  # the end-of-archive blocks and record padding
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


def build_index(
    urls: Iterable[str],
    *,
    workers: int = 8,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    chunk_size: int = CHUNK,
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
    urls = [absolute(u) for u in urls]
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


@dataclass(frozen=True)
class IndexReport:
    """What :func:`write_index` did.

    Attributes:
        url: The descriptor written.
        shards: Shards in the index.
        samples: Samples in the index.
        total_bytes: Bytes of all shards.
        scanned: Shards read in this run.
        reused: Shards whose sample files were already there (not read again).
    """

    url: str
    shards: int
    samples: int
    total_bytes: int
    scanned: int
    reused: int


def _check_workers(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers should be an int >= 1, got {workers!r}")


def write_index(
    urls: Iterable[str],
    out: str,
    *,
    workers: int = 8,
    add: bool = False,
    rebuild: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    chunk_size: int = CHUNK,
    on_scanned: Callable[[str], None] | None = None,
) -> IndexReport:
    """Scan shards ``workers`` at a time and write their version-2 index to ``out``, streaming.

    Each shard's sample file is written as soon as it is scanned, so per-sample data is held
    only for the shards being scanned; the descriptor is written (atomically, when local) once
    all are done. A shard whose sample file is already in place, for the same URL at the same
    position and the same shard size, is not read again: a run that was interrupted continues
    where it stopped, and with ``add=True`` the shards of the existing index at ``out`` are
    kept (in their order) and ``urls`` not in it are appended.

    Args:
        urls: Shard URLs (local paths or any fsspec URL).
        out: The descriptor to write; the sample files go to the folder next to it
            (``train.index.samples/`` for ``train.index.json``).
        workers: Shards scanned at once. Default: ``8``.
        add: Keep the shards of the existing index at ``out`` and add the new ones.
            Default: ``False``.
        rebuild: Read every shard again, whatever sample files exist. Default: ``False``.
        storage_options: Passed to fsspec.
        progress: Show a tqdm progress bar on stderr. Default: ``True``.
        chunk_size: Bytes read at a time. Default: ``1 MiB``.
        on_scanned: Called with each shard URL once it is scanned (progress hooks, tests).

    Returns:
        IndexReport: Counts of shards, samples, and of shards scanned and reused.

    Raises:
        ValueError: No URLs, a URL given twice, or ``workers < 1``.
        ShardReadError, ShardFormatError, SampleFormatError: A shard cannot be read or parsed;
            the shards scanned before it keep their sample files, so a new run resumes.

    Examples:
        >>> import tempfile, os
        >>> from shardpipes.synthetic import write_synthetic
        >>> d = tempfile.mkdtemp()
        >>> paths = write_synthetic(d, shards=3, samples=[2, 0, 5])
        >>> r = write_index(paths, os.path.join(d, "train.index.json"), progress=False)
        >>> (r.samples, r.scanned, r.reused)
        (7, 3, 0)
        >>> write_index(paths, r.url, progress=False).reused  # nothing to read again
        3
        >>> ShardIndex.load(r.url).counts
        [2, 0, 5]
    """
    given = [absolute(u) for u in urls]
    _check_workers(workers)
    base_dir = parent(absolute(out)) + "/"
    lines: list[str | None] = []
    order: list[str] = []
    samples = total = 0
    if add:
        try:
            old = ShardIndex.load(out, storage_options=storage_options)
        except FileNotFoundError:
            old = None
        if old is not None:
            # Kept as they are: their lines are copied, their sample files stay in place.
            for i, s in enumerate(old.shards):
                rel = _relative(s.url, base_dir)
                lines.append(shard_line(rel, s.num_samples, s.total_bytes, s.etag))
                order.append(s.url)
                samples += s.num_samples
                total += s.total_bytes
                if old._table is None:  # a version-1 index: write its sample file
                    offsets, sizes = s.spans()
                    data = encode(rel, s.total_bytes, s.keys, offsets, sizes)
                    write_bytes(sidecar_path(out, i), data, storage_options)
    kept = len(order)
    known = set(order)
    seen: set[str] = set()
    for u in given:
        if u in seen:
            raise ValueError(f"shard URL {u!r} is given more than once")
        seen.add(u)
        if u not in known:
            order.append(u)
            lines.append(None)
    if not order:
        raise ValueError("write_index got no shard URLs")
    pending = list(range(kept, len(order)))
    reused = kept
    if not rebuild and pending:
        found = _reusable(order, pending, out, base_dir, workers, storage_options)
        for i, (n, size) in found.items():
            lines[i] = shard_line(_relative(order[i], base_dir), n, size)
            samples += n
            total += size
        reused += len(found)
        pending = [i for i in pending if i not in found]
    scanned = 0
    with tqdm(
        total=len(order), initial=reused, unit="shard", desc="indexing", disable=not progress
    ) as bar:
        for i, info in _scan(order, pending, workers, storage_options, chunk_size):
            rel = _relative(info.url, base_dir)
            offsets, sizes = info.spans()
            data = encode(rel, info.total_bytes, info.keys, offsets, sizes)
            write_bytes(sidecar_path(out, i), data, storage_options)
            lines[i] = shard_line(rel, info.num_samples, info.total_bytes)
            samples += info.num_samples
            total += info.total_bytes
            scanned += 1
            if on_scanned is not None:
                on_scanned(info.url)
            bar.set_postfix(samples=samples, refresh=False)
            bar.update(1)
    header = {
        "format": "shardpipes-index",
        "version": 2,
        "num_shards": len(order),
        "num_samples": samples,
        "total_bytes": total,
        "samples": sidecar_dir(out),
    }
    write_descriptor(out, header, cast(list[str], lines), storage_options)
    logger.info("%s: %d shards, %d scanned, %d reused", out, len(order), scanned, reused)
    return IndexReport(out, len(order), samples, total, scanned, reused)


def _relative(url: str, base_dir: str) -> str:
    return url[len(base_dir) :] if url.startswith(base_dir) else url


def _reusable(
    order: list[str],
    positions: list[int],
    out: str,
    base_dir: str,
    workers: int,
    storage_options: Mapping[str, Any] | None,
) -> dict[int, tuple[int, int]]:
    """Positions whose sample file is for that URL and the shard's current size: (samples, size)."""

    def check(i: int) -> tuple[int, int] | None:
        header = read_header(sidecar_path(out, i), storage_options=storage_options)
        if header is None or header.get("url") != _relative(order[i], base_dir):
            return None
        fs, path = filesystem(order[i], storage_options)
        try:
            size = fs.size(path)
        except (FileNotFoundError, OSError):
            return None
        if size != header.get("total_bytes"):
            return None
        return int(header["num_samples"]), int(size)

    with ThreadPoolExecutor(
        min(workers, len(positions)), thread_name_prefix="shardpipes-index"
    ) as pool:
        results = pool.map(check, positions)
        return {i: r for i, r in zip(positions, results, strict=True) if r is not None}


def _scan(
    order: list[str],
    positions: list[int],
    workers: int,
    storage_options: Mapping[str, Any] | None,
    chunk_size: int,
) -> Iterator[tuple[int, ShardInfo]]:
    """``(position, info)`` of each shard as its scan finishes; at most ``2 * workers`` in flight."""
    if not positions:
        return
    todo = iter(positions)
    with ThreadPoolExecutor(
        min(workers, len(positions)), thread_name_prefix="shardpipes-index"
    ) as pool:
        running: dict[Future[ShardInfo], int] = {}

        def submit() -> None:
            for i in todo:
                running[
                    pool.submit(
                        index_shard,
                        order[i],
                        storage_options=storage_options,
                        chunk_size=chunk_size,
                    )
                ] = i
                if len(running) >= 2 * workers:
                    return

        submit()
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                # In submission order among those done, so a single worker is deterministic.
                for fut in sorted(done, key=running.__getitem__):
                    i = running.pop(fut)
                    yield i, fut.result()
                submit()
        finally:
            for fut in running:
                fut.cancel()
