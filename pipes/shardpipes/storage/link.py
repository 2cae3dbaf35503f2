"""What the link to a store carries: many range requests at once over the objects a reader reads.

A reader's MB/s says little alone: 200 MB/s is the whole link from one store and a fifth of
it from another. :func:`measure_link` reads byte ranges of the same objects with ``requests``
threads at once and no parsing (what plain range readers get, the way ``s3fs`` users read in
parallel), so that a reader's figure can be given as a fraction of it (``shardpipes bench
--link N``). Every range is fetched through the filesystem with the retries of the storage
layer; the object sizes are looked up before the clock starts.

Examples:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.bin")
    >>> _ = open(p, "wb").write(bytes(3000))
    >>> link = measure_link([p], requests=2, block_size=1024)
    >>> link.nbytes, link.ranges, link.object_bytes
    (3000, 3, 3000)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shardpipes.storage.remote import with_retries
from shardpipes.storage.source import ReadOptions, Source, resolve

__all__ = ["Link", "measure_link"]


@dataclass(frozen=True)
class Link:
    """One measurement of the link.

    Attributes:
        requests: Range requests in flight at once.
        block_size: Bytes per range request.
        nbytes: Bytes read (the first ``max_bytes`` of the objects, in order).
        ranges: Range requests made (retries not counted).
        seconds: From the first request to the last byte.
        object_bytes: The objects' total size.
    """

    requests: int
    block_size: int
    nbytes: int
    ranges: int
    seconds: float
    object_bytes: int

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10^6) per second."""
        return self.nbytes / max(self.seconds, 1e-9) / 1e6


def measure_link(
    urls: Sequence[str],
    *,
    requests: int = 16,
    block_size: int = 8 << 20,
    max_bytes: int | None = 1 << 30,
    storage_options: Mapping[str, Any] | None = None,
    options: ReadOptions | None = None,
) -> Link:
    """Read ``urls`` (at most ``max_bytes`` of them) in ranges, ``requests`` at once; time it.

    Raises:
        ValueError: ``requests`` or ``block_size`` below 1, or no URL.
        ShardReadError: (a subclass) as reading the objects would, naming the URL and offset.
    """
    if requests < 1 or block_size < 1 or not urls:
        raise ValueError(
            f"measure_link needs URLs, requests >= 1 and block_size >= 1 "
            f"(got {len(urls)} URLs, requests={requests}, block_size={block_size})"
        )
    retry = (options or ReadOptions()).retry
    sources = [resolve(u, storage_options) for u in urls]

    def size_of(src: Source) -> int:
        return int(with_retries(lambda: src.fs.size(src.path), src.redactor, retry, "look-up", 0))

    sizes = [size_of(s) for s in sources]
    work: list[tuple[Source, int, int]] = []
    left = sum(sizes) if max_bytes is None else max_bytes
    for src, size in zip(sources, sizes, strict=True):
        for start in range(0, size, block_size):
            if left <= 0:
                break
            end = min(size, start + block_size, start + left)
            work.append((src, start, end))
            left -= end - start

    def fetch(job: tuple[Source, int, int]) -> int:
        src, start, end = job
        data = with_retries(
            lambda: src.fs.cat_file(src.path, start=start, end=end),
            src.redactor,
            retry,
            "range read",
            start,
        )
        return len(data)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(requests, thread_name_prefix="shardpipes-link") as pool:
        got = sum(pool.map(fetch, work))
    seconds = time.perf_counter() - t0
    return Link(requests, block_size, got, len(work), seconds, sum(sizes))
