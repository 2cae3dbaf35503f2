"""Synthetic WebDataset shards for the demo, examples, tests and benchmarks."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

from shardpipes.writer import ShardWriter

__all__ = ["write_synthetic"]


def write_synthetic(
    directory: str | os.PathLike[str],
    *,
    shards: int = 4,
    samples: int | Sequence[int] = 100,
    payload_bytes: int = 256,
    classes: int = 10,
    seed: int = 0,
    prefix: str = "train",
) -> list[str]:
    """Write ``shards`` tar shards of samples ``{".cls", ".json", ".bin"}`` and return their paths.

    Keys are globally unique (``"{shard:06d}_{index:06d}"``); ``.json`` holds
    ``{"shard": s, "index": i, "id": global id}``, so tests can check coverage and order.

    Args:
        directory: Where to write (created if missing).
        shards: Number of shards.
        samples: Samples per shard, or one count per shard (uneven shards).
        payload_bytes: Size of each ``.bin`` field (random bytes, deterministic from ``seed``).
        classes: ``.cls`` is ``id % classes``.
        seed: Seed of the payload bytes.
        prefix: File name prefix: ``{prefix}-{shard:06d}.tar``.
    """
    counts = [samples] * shards if isinstance(samples, int) else list(samples)
    if len(counts) != shards:
        raise ValueError(f"got {len(counts)} sample counts for {shards} shards")
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    gid = 0
    for s, count in enumerate(counts):
        pattern = os.path.join(os.fspath(directory).replace("%", "%%"), f"{prefix}-%06d.tar")
        path = pattern % s
        with ShardWriter(pattern, maxcount=max(count, 1), start=s) as w:
            for i in range(count):
                w.write(
                    {
                        "__key__": f"{s:06d}_{i:06d}",
                        ".cls": gid % classes,
                        ".json": {"shard": s, "index": i, "id": gid},
                        ".bin": rng.randbytes(payload_bytes),
                    }
                )
                gid += 1
            if count == 0:
                with open(path, "wb") as f:
                    f.write(bytes(1024))  # a valid empty archive: two zero blocks
        paths.append(path)
    return paths
