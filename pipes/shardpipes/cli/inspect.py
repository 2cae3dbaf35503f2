"""``shardpipes inspect``: the first samples of a shard (keys, fields, sizes), or an index file."""

from __future__ import annotations

import argparse

from shardpipes.cli._command import Command, arg

__all__ = ["COMMAND", "run"]

COMMAND = Command(
    "inspect",
    help="show the first samples of a shard, or summarize an index file",
    description="For a shard: the key, byte offset, size and fields (with their sizes) of "
    "its first samples, read as a stream (only what is shown is read). For an index file "
    "(.json, .json.gz): its shards and sample counts.",
    args=(
        arg(
            "url",
            metavar="URL",
            help="a shard (or a brace pattern: its first shard) or an index file",
        ),
        arg("-n", type=int, default=5, help="samples (or shards of an index) to show (default: 5)"),
    ),
)


def run(args: argparse.Namespace) -> int:
    """Print the samples or the index summary."""
    if args.n < 0:
        raise ValueError(f"-n should be >= 0, got {args.n}")
    if args.url.endswith((".json", ".json.gz")):
        return _inspect_index(args.url, args.n)
    from shardpipes.cli.index import shard_urls

    urls = shard_urls([args.url])
    if len(urls) > 1:
        print(f"{args.url}: {len(urls)} shards; showing the first")
    return _inspect_shard(urls[0], args.n)


def _inspect_shard(url: str, n: int) -> int:
    from shardpipes.cli.index import format_bytes
    from shardpipes.datapipes.iter.fsspec import open_url
    from shardpipes.index import scan_samples

    print(url)
    shown = 0
    more = False
    with open_url(url, "rb") as stream:
        for s in scan_samples(stream, url):
            if shown == n:
                more = True  # stop reading here: only what is shown is read
                break
            shown += 1
            fields = "  ".join(f"{ext} {format_bytes(size)}" for ext, size in s.fields)
            print(f"  {s.key}  offset {s.offset}  size {s.size}  {fields}")
    print(
        f"first {shown} samples shown; the shard has more"
        if more
        else f"{shown} samples in the shard"
    )
    return 0


def _inspect_index(url: str, n: int) -> int:
    from shardpipes.cli.index import format_bytes
    from shardpipes.index import ShardIndex

    index = ShardIndex.load(url)
    print(
        f"{url}: shardpipes index version {index.version}, {len(index.shards)} shards, "
        f"{index.num_samples} samples, {format_bytes(index.total_bytes)}"
    )
    for shard in index.shards[:n]:
        first = f", first key {shard.keys[0]!r}" if shard.keys else ""
        print(
            f"  {shard.url}  {shard.num_samples} samples  {format_bytes(shard.total_bytes)}{first}"
        )
    if len(index.shards) > n:
        print(f"  ... {len(index.shards) - n} more shards")
    return 0
