"""``shardpipes index``: scan shards and write their sample index next to them.

Also holds the helpers the other subcommands share: :func:`shard_urls` and
:func:`format_bytes`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from shardpipes.cli._command import NO_PROGRESS, Command, arg, flag

__all__ = ["COMMAND", "format_bytes", "run", "shard_urls"]

_GLOB_CHARS = frozenset("*?[")

COMMAND = Command(
    "index",
    help="scan shards and write their sample index (a sidecar JSON and sample files)",
    description="Scans the shards (streaming, several at a time) and writes their index: a "
    "JSON descriptor with one line per shard (URL, sample count, size) and, in the folder "
    "next to it, one small file per shard with its samples' keys and byte ranges, written "
    "as each shard is scanned. Shards whose sample file is already there (same URL, same "
    "size) are not read again: an interrupted run continues, and --add adds shards to an "
    "existing index. With it the loader knows the dataset size, splits epochs exactly by "
    "sample ranges and reads ranges with one seek or range request. See "
    "docs/index-format.md.",
    args=(
        arg(
            "urls",
            nargs="+",
            metavar="URL",
            help="shards: paths or fsspec URLs, brace patterns (train-{000000..000099}.tar), "
            "globs, or folders (their .tar files)",
        ),
        arg(
            "-o",
            "--output",
            metavar="OUT",
            help="index file to write; '.gz' compresses (default: <shard folder>/<name prefix>.index.json)",
        ),
        arg("--workers", type=int, default=8, help="shards scanned at once (default: 8)"),
        NO_PROGRESS,
        flag(
            "--add",
            help="keep the shards of the existing index OUT and add the given shards not in it",
        ),
        flag("--rebuild", help="read every shard again, whatever is on disk"),
    ),
)


def run(args: argparse.Namespace) -> int:
    """Build the index and save it."""
    from shardpipes.index import default_index_url, write_index

    urls = shard_urls(args.urls)
    out = args.output or default_index_url(urls)
    r = write_index(
        urls,
        out,
        workers=args.workers,
        add=args.add,
        rebuild=args.rebuild,
        progress=not args.no_progress,
    )
    print(
        f"indexed {r.shards} shards: {r.samples} samples, {format_bytes(r.total_bytes)} "
        f"({r.scanned} scanned, {r.reused} already indexed)"
    )
    print(f"wrote {out}")
    return 0


def shard_urls(patterns: Iterable[str]) -> list[str]:
    """Expand shard patterns: braces as given, globs, folders (their ``.tar`` files); others as is.

    Raises:
        FileNotFoundError: A glob that matches nothing, or a folder without ``.tar`` files.
        ValueError: A malformed brace pattern, or no pattern at all.
    """
    from shardpipes.datapipes.iter.expand import expand_braces
    from shardpipes.datapipes.iter.fsspec import filesystem

    out: list[str] = []
    for pattern in patterns:
        expanded = expand_braces(pattern)
        if expanded != [pattern]:
            out.extend(expanded)  # brace patterns name shards; no listing request per shard
            continue
        fs, path = filesystem(pattern, None)
        if _GLOB_CHARS & set(path):
            found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
            if not found:
                raise FileNotFoundError(f"{pattern}: the glob pattern matches no file")
        elif fs.isdir(path):
            found = sorted(
                e["name"]
                for e in fs.ls(path, detail=True)
                if e["type"] != "directory" and e["name"].endswith(".tar")
            )
            if not found:
                raise FileNotFoundError(f"{pattern}: the folder holds no .tar file")
        else:
            out.append(pattern)
            continue
        out.extend(str(fs.unstrip_protocol(p)) if "://" in pattern else p for p in found)
    if not out:
        raise ValueError("no shard URL given")
    return out


def format_bytes(n: float) -> str:
    """Format a byte count with decimal units, as ``MB/s`` is reported.

    Examples:
        >>> format_bytes(999), format_bytes(1_536_000), format_bytes(2e12)
        ('999 B', '1.5 MB', '2.0 TB')
    """
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"
