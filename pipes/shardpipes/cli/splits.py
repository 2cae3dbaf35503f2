"""``shardpipes splits``: which reader reads what in an epoch, and how many samples per rank.

With an index (``--index``, or the sidecar found next to the shards) the split is the exact
sample-level partition of :func:`shardpipes.plan.partition.partition_samples`. Without one it is
shard-level, as ``sharding_filter`` after a seeded shard shuffle splits: shard ``i`` of the
epoch's order goes to reader ``i % (ranks x workers)`` (:func:`shardpipes.plan.partition.assign_shards`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shardpipes.cli._command import WORLD, Command, arg, flag
from shardpipes.plan.partition import POLICIES

__all__ = ["COMMAND", "run"]

COMMAND = Command(
    "splits",
    help="show which rank and worker reads which shards or sample ranges",
    description="Prints, for one epoch, each reader's shards or sample ranges and counts, "
    "the total per rank, and a warning when readers would idle or ranks differ. With an "
    "index the split is exact and sample-level; without one it is shard-level.",
    args=(
        arg(
            "urls",
            nargs="*",
            metavar="URL",
            help="shards (patterns, globs, folders); default: all of --index",
        ),
        WORLD,
        arg(
            "--workers",
            type=int,
            required=True,
            metavar="W",
            help="workers per rank (0: the rank's main process)",
        ),
        arg("--seed", type=int, default=0, help="loader seed (default: 0)"),
        arg("--epoch", type=int, default=0, help="epoch (default: 0)"),
        arg(
            "--index",
            metavar="F",
            help="index file (default: the sidecar next to the shards, if any)",
        ),
        flag("--no-index", help="ignore any index: shard-level split"),
        arg(
            "--policy",
            choices=POLICIES,
            default="drop",
            help="with an index: drop or pad the remainder (default: drop)",
        ),
        flag("--no-shuffle", help="keep the shard order"),
    ),
)


def _label(reader: int, workers: int) -> str:
    if workers == 0:
        return f"rank {reader}"
    return f"rank {reader // workers} worker {reader % workers}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _names(urls: Sequence[str]) -> list[str]:
    """Shard basenames when they are unique, else the full URLs."""
    names = [u.rstrip("/").rsplit("/", 1)[-1] for u in urls]
    return names if len(set(names)) == len(names) else list(urls)


def run(args: argparse.Namespace) -> int:
    """Compute and print the split."""
    from shardpipes.cli.index import shard_urls
    from shardpipes.index import ShardIndex, find_index

    if args.index and args.no_index:
        raise ValueError("--index and --no-index exclude each other")
    if args.world < 1 or args.workers < 0:
        raise ValueError(
            f"--world ({args.world}) should be >= 1 and --workers ({args.workers}) >= 0"
        )
    urls = shard_urls(args.urls) if args.urls else []
    index_url = args.index
    if index_url is None and urls and not args.no_index:
        index_url = find_index(urls)
    if index_url is None:
        if not urls:
            raise ValueError("give shard URLs, or an index with --index")
        return _shard_level(urls, args)
    index = ShardIndex.load(index_url)
    if urls:
        try:
            index = index.select(urls)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    print(
        f"index {index_url}: {len(index.shards)} shards, {index.num_samples} samples; "
        f"exact sample-level split, policy {args.policy}"
    )
    return _sample_level(index.urls, index.counts, args)


def _topology(args: argparse.Namespace) -> tuple[int, str]:
    readers = args.world * max(args.workers, 1)
    who = f"{args.workers} workers" if args.workers else "no workers"
    return readers, f"{args.world} ranks x {who} = {readers} readers"


def _sample_level(urls: list[str], counts: list[int], args: argparse.Namespace) -> int:
    from shardpipes.plan.partition import partition_samples

    p = partition_samples(
        counts,
        world_size=args.world,
        num_workers=args.workers,
        seed=args.seed,
        epoch=args.epoch,
        policy=args.policy,
        shuffle=not args.no_shuffle,
    )
    _, topo = _topology(args)
    extra = (
        f", {p.dropped} dropped" if args.policy == "drop" else f", {p.padded} repeated as padding"
    )
    print(f"epoch {args.epoch}, seed {args.seed}: {topo}; {p.per_reader} samples each{extra}")
    names = _names(urls)
    summary = p.summary()
    for i, ranges in enumerate(p.readers):
        runs = " ".join(f"{names[r.shard]}[{r.start}:{r.stop}]" for r in ranges) or "-"
        print(f"  {_label(i, args.workers)}: {summary.per_reader[i]} samples  {runs}")
    for rank, n in enumerate(summary.per_rank):
        print(f"rank {rank}: {n} samples")
    if summary.warning:
        print(f"warning: {summary.warning}", file=sys.stderr)
    return 0


def _shard_level(urls: list[str], args: argparse.Namespace) -> int:
    from shardpipes.plan.partition import assign_shards

    readers, topo = _topology(args)
    print(
        "no index (run 'shardpipes index' for exact sample-level splits): shard-level split, "
        "as sharding_filter after a seeded shard shuffle; sample counts unknown"
    )
    print(f"epoch {args.epoch}, seed {args.seed}: {len(urls)} shards over {topo}")
    assignment = assign_shards(
        len(urls),
        world_size=args.world,
        num_workers=args.workers,
        seed=args.seed,
        epoch=args.epoch,
        shuffle=not args.no_shuffle,
    )
    names = _names(urls)
    for i, shards in enumerate(assignment):
        listed = " ".join(names[s] for s in shards) or "-"
        print(f"  {_label(i, args.workers)}: {_plural(len(shards), 'shard')}  {listed}")
    per = max(args.workers, 1)
    per_rank = [sum(len(a) for a in assignment[r * per : (r + 1) * per]) for r in range(args.world)]
    for rank, n in enumerate(per_rank):
        print(f"rank {rank}: {_plural(n, 'shard')}")
    idle = sum(1 for a in assignment if not a)
    if idle:
        print(
            f"warning: {idle} of {readers} readers get no shard and would idle: use fewer ranks or "
            "workers, more shards, or an index (sample-level split)",
            file=sys.stderr,
        )
    if len(set(per_rank)) > 1:
        print(
            f"warning: ranks get unequal shard counts {per_rank}: their sample counts differ, so "
            "an equal-length policy (stop at the first rank to finish, or pad) is needed under DDP",
            file=sys.stderr,
        )
    return 0
