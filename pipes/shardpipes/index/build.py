"""Building an index: scanning shards in parallel threads, with a progress bar."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import IO, Any, cast

from tqdm.auto import tqdm

from shardpipes.index.document import ShardIndex, ShardInfo
from shardpipes.index.scan import CHUNK, scan_samples
from shardpipes.storage.open import open_url
from shardpipes.storage.urls import absolute

__all__ = ["build_index", "index_shard"]


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
