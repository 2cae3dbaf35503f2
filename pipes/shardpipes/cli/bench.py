"""``shardpipes bench``: read shards through the pipeline and report samples/s and MB/s."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from shardpipes.formats.stream import StreamBytes

__all__ = ["add_parser", "pipeline", "run", "sample_bytes"]


def add_parser(sub: Any) -> None:
    """Register ``bench``."""
    p = sub.add_parser(
        "bench",
        help="measure reading speed (samples/s, MB/s) with a progress bar",
        description="Streams the shards through open_files_by_fsspec -> load_from_tar -> "
        "webdataset -> batch (no decoding), in this process (--workers 0) or with DataLoader2 "
        "and MultiProcessingReadingService, and prints samples/s and MB/s of sample payload.",
    )
    p.add_argument(
        "urls",
        nargs="+",
        metavar="URL",
        help="shards (paths, URLs, brace patterns, globs, folders)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="worker processes; 0 reads in this process (default: 0)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="samples per batch, made in the workers (default: 64)",
    )
    p.add_argument("--epochs", type=int, default=1, help="passes over the data (default: 1)")
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        help="stop each epoch after this many samples (default: all)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def pipeline(urls: list[str], batch_size: int) -> Any:
    """The measured graph: shard split, open, tar, group into samples, batch."""
    from shardpipes.datapipes.iter import IterableWrapper

    return (
        IterableWrapper(urls)
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .batch(batch_size)
    )


def sample_bytes(sample: dict[str, Any]) -> int:
    """Bytes of a sample's fields (``__key__`` and ``__url__`` excluded)."""
    return sum(
        len(v)
        for k, v in sample.items()
        if not k.startswith("__") and isinstance(v, bytes | bytearray | StreamBytes)
    )


def _known_total(urls: list[str]) -> int | None:
    """The sample count from the sidecar index, if there is one that covers ``urls``."""
    from shardpipes.index import ShardIndex, find_index

    found = find_index(urls)
    if found is None:
        return None
    try:
        return ShardIndex.load(found).select(urls).num_samples
    except (KeyError, ValueError):
        return None  # an index of other shards: run without a total


def run(args: argparse.Namespace) -> int:
    """Read the data and print the throughput of each epoch."""
    from tqdm.auto import tqdm

    from shardpipes.cli.index import format_bytes, shard_urls

    if args.workers < 0 or args.batch_size < 1 or args.epochs < 1 or args.limit < 0:
        raise ValueError("--workers and --limit must be >= 0, --batch-size and --epochs >= 1")
    urls = shard_urls(args.urls)
    total = _known_total(urls)
    if args.limit:
        total = min(total, args.limit) if total is not None else args.limit
    if args.workers > len(urls):
        print(
            f"note: {args.workers} workers for {len(urls)} shards: {args.workers - len(urls)} idle",
            file=sys.stderr,
        )
    dp = pipeline(urls, args.batch_size)
    how = "in this process" if args.workers == 0 else f"DataLoader2 with {args.workers} workers"
    print(f"reading {len(urls)} shards {how}, batch size {args.batch_size}")
    with _loader(dp, args.workers) as loader:
        for epoch in range(args.epochs):
            n = nbytes = 0
            t0 = time.perf_counter()
            with tqdm(
                total=total,
                unit="sample",
                unit_scale=True,
                desc=f"epoch {epoch}",
                disable=args.no_progress,
            ) as bar:
                for batch in loader:
                    n += len(batch)
                    nbytes += sum(sample_bytes(s) for s in batch)
                    bar.update(len(batch))
                    if args.limit and n >= args.limit:
                        break
            seconds = max(time.perf_counter() - t0, 1e-9)
            startup = " (includes starting the workers)" if epoch == 0 and args.workers else ""
            print(
                f"epoch {epoch}: {n} samples, {format_bytes(nbytes)} in {seconds:.2f} s: "
                f"{n / seconds:,.0f} samples/s, {nbytes / seconds / 1e6:,.1f} MB/s{startup}"
            )
    return 0


@contextlib.contextmanager
def _loader(dp: Any, workers: int) -> Iterator[Any]:
    """The graph itself (in-process), or a DataLoader2 over ``workers`` processes."""
    if workers == 0:
        yield dp
        return
    from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService

    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers)) as dl:
        yield dl
