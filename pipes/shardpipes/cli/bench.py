"""``shardpipes bench``: read shards through the pipeline and report samples/s and MB/s."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from shardpipes.cli._command import NO_PROGRESS, Command, arg, flag
from shardpipes.formats.stream import StreamBytes
from shardpipes.storage.link import Link, measure_link
from shardpipes.storage.pool import START_REQUESTS, ProcessPool, process_pool

__all__ = [
    "COMMAND",
    "fetch_line",
    "format_size",
    "link_line",
    "pipeline",
    "print_profile",
    "run",
    "sample_bytes",
    "stage_profile",
]

COMMAND = Command(
    "bench",
    help="measure reading speed (samples/s, MB/s) with a progress bar",
    description="Streams the shards through open_files_by_fsspec -> load_from_tar -> "
    "webdataset -> batch (no decoding), in this process (--workers 0) or with DataLoader2 "
    "and MultiProcessingReadingService, and prints samples/s and MB/s of sample payload.",
    args=(
        arg(
            "urls",
            nargs="+",
            metavar="URL",
            help="shards (paths, URLs, brace patterns, globs, folders)",
        ),
        arg(
            "--workers",
            type=int,
            default=0,
            help="worker processes; 0 reads in this process (default: 0)",
        ),
        arg(
            "--batch-size",
            type=int,
            default=64,
            help="samples per batch, made in the workers (default: 64)",
        ),
        arg("--epochs", type=int, default=1, help="passes over the data (default: 1)"),
        arg(
            "--limit",
            type=int,
            default=0,
            help="stop each epoch after this many samples (default: all)",
        ),
        NO_PROGRESS,
        arg(
            "--shuffle-buffer",
            type=int,
            default=0,
            metavar="N",
            help="add the sample shuffle, shuffle(buffer_size=N), before the batch (default: none)",
        ),
        flag("--decode", help="add decode() after webdataset()"),
        flag(
            "--index",
            help="split by samples with the shard index (sharding_by_index) instead of "
            "sharding_filter (build it first with `shardpipes index`)",
        ),
        arg(
            "--link",
            type=int,
            default=0,
            metavar="N",
            help="first measure the link: N range requests of 8 MiB at once over the same "
            "shards (the first GiB), no parsing; then give each epoch's MB/s of shard bytes as "
            "a fraction of it (default: 0, not measured)",
        ),
        flag(
            "--profile",
            help="print where the time goes: the CPU cost per sample of each stage of the "
            "pipeline, in this process (each stage measured as the pipeline up to it, run as "
            "DataLoader2 runs it, minus the pipeline before it)",
        ),
    ),
)


def pipeline(
    urls: list[str],
    batch_size: int,
    *,
    shuffle_buffer: int = 0,
    decode: bool = False,
    index: bool = False,
) -> Any:
    """The measured graph: shard split, open, tar, group into samples, [decode, shuffle,] batch."""
    from shardpipes.datapipes.iter import IterableWrapper

    dp: Any = IterableWrapper(urls)
    dp = dp.sharding_by_index() if index else dp.sharding_filter()
    dp = dp.open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    if decode:
        dp = dp.decode()
    if shuffle_buffer:
        dp = dp.shuffle(buffer_size=shuffle_buffer)
    return dp.batch(batch_size)


def stage_profile(dp: Any, *, rounds: int = 3) -> list[tuple[str, float, float]]:
    """``(stage, cumulative, own)`` CPU microseconds per sample for each stage of a linear graph.

    The pipeline up to each stage is copied, made lean as ``DataLoader2`` makes it, and read to
    the end in this process (best of ``rounds``, CPU time); a stage's own cost is its
    pipeline's less the one before it. Stages before the first that yields samples (shard
    lists, openers) are counted together with it. The sample count is that of the whole
    pipeline's output (batches counted by their samples).
    """
    import copy

    from shardpipes.dataloader2.graph import lean_graph
    from shardpipes.dataloader2.telemetry.names import stage_labels
    from shardpipes.datapipes.iter._index_length import source_of

    chain = []
    node = dp
    while node is not None:
        chain.append(node)
        node = source_of(node)
    chain.reverse()

    def cost(stage: Any) -> tuple[float, int]:
        best, count = float("inf"), 0
        for _ in range(rounds):
            graph = lean_graph(copy.deepcopy(stage))
            t0 = time.process_time()
            count = sum(len(x) if isinstance(x, list) else 1 for x in graph)
            best = min(best, time.process_time() - t0)
        return best, count

    labels = stage_labels(dp)  # the names telemetry gives the stages of a running loader
    names = [labels[id(stage)] for stage in chain]
    total, samples = cost(chain[-1])
    rows: list[tuple[str, float, float]] = []
    before = 0.0
    first = next((i for i, n in enumerate(names) if n == "load_from_tar"), 0)
    if names[first + 1 : first + 2] == ["webdataset"]:
        first += 1  # webdataset() takes members straight from the tar parser: one stage
    for i in range(first, len(chain)):
        seconds = total if i == len(chain) - 1 else cost(chain[i])[0]
        cum = 1e6 * seconds / max(samples, 1)
        label = " + ".join(names[: i + 1]) if i == first else names[i]
        rows.append((label, cum, cum - before))
        before = cum
    return rows


def print_profile(dp: Any) -> None:
    """Print :func:`stage_profile` of ``dp`` as a table."""
    rows = stage_profile(dp)
    print("stage | CPU us per sample (cumulative) | own")
    shown = 0.0
    for label, cum, _own in rows:
        # own is the difference of the cumulative figures as printed, so the column adds up
        # to the total a reader sees (rounding each own cost on its own could miss it by 0.2)
        own = round(cum, 1) - shown
        shown = round(cum, 1)
        print(f"{label} | {cum:.1f} | {own:+.1f}")
    if rows:
        print(
            f"total: {rows[-1][1]:.1f} us per sample = {1e6 / rows[-1][1]:,.0f} samples per CPU-second"
        )


def link_line(link: Link, seconds: float, *, whole: bool) -> str:
    """An epoch's MB/s of shard bytes against the measured link (``whole``: every shard read)."""
    if not whole:
        return "of the link: not compared (--limit stops the epoch before the shards end)"
    mbps = link.object_bytes / max(seconds, 1e-9) / 1e6
    return (
        f"of the link: {mbps:,.1f} MB/s of shard bytes = {mbps / link.mb_per_s:.0%} of "
        f"{link.mb_per_s:,.1f} MB/s ({link.requests} range requests at once)"
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
    dp = pipeline(
        urls,
        args.batch_size,
        shuffle_buffer=args.shuffle_buffer,
        decode=args.decode,
        index=args.index,
    )
    if args.profile:
        print(f"profile of {len(urls)} shards in this process, batch size {args.batch_size}")
        print_profile(dp)
        return 0
    link = None
    if args.link:
        link = measure_link(urls, requests=args.link)
        print(
            f"link: {link.mb_per_s:,.1f} MB/s with {link.requests} range requests of "
            f"{format_bytes(link.block_size)} at once ({format_bytes(link.nbytes)} in "
            f"{link.seconds:.2f} s)"
        )
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
            if link is not None:
                print("  " + link_line(link, seconds, whole=not args.limit))
                figures = loader.stats().get("fetch") if args.workers else None
                print("  " + fetch_line(process_pool(), args.workers, figures))
    return 0


def fetch_line(pool: ProcessPool, workers: int, figures: list[dict[str, Any]] | None = None) -> str:
    """What the fetch pool learnt and held: this process's, or each worker's (``figures``).

    ``figures``: ``DataLoader2.stats()["fetch"]`` when ``workers`` read (each has its own pool).
    """
    if workers:
        if not figures:
            return (
                f"requests in flight: learnt in each of the {workers} worker processes, "
                f"each within its own {format_size(pool.budget)} read-ahead budget"
            )
        each = ", ".join(f"{f['requests']} in worker {f['worker']}" for f in figures)
        held = max(f["peak_readahead_mb"] for f in figures)
        return (
            f"requests in flight: {each} learnt (started at {START_REQUESTS}); read-ahead "
            f"held at most {held:g} MiB of each worker's {format_size(pool.budget)} budget"
        )
    return (
        f"requests in flight: {pool.concurrency.requests} learnt (started at "
        f"{START_REQUESTS}, at most {pool.limits.threads}); read-ahead held at most "
        f"{format_size(pool.peak_held)} of the {format_size(pool.budget)} budget"
    )


def format_size(n: int) -> str:
    """``n`` bytes in MiB, as the budget is given (``SHARDPIPES_READAHEAD_BYTES=56M``).

    Examples:
        >>> format_size(56 << 20), format_size(3 << 19)
        ('56 MiB', '1.5 MiB')
    """
    mib = n / (1 << 20)
    return f"{mib:.0f} MiB" if mib == int(mib) else f"{mib:.1f} MiB"


@contextlib.contextmanager
def _loader(dp: Any, workers: int) -> Iterator[Any]:
    """The graph itself (in-process), or a DataLoader2 over ``workers`` processes."""
    if workers == 0:
        yield dp
        return
    from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService

    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers)) as dl:
        yield dl
