"""``shardpipes verify``: replay a run's plan against its loader states and id logs."""

from __future__ import annotations

import argparse
import json

from shardpipes.cli._command import WORLD, Command, arg, one_of

__all__ = ["COMMAND", "run"]

COMMAND = Command(
    "verify",
    help="replay a run's plan: samples expected, read, duplicated, missing per epoch",
    description="Given the index, the topology and the run's loader states (JSON, in the "
    "order they were saved) and/or the id logs of dl.attest(log_dir=...), print per epoch "
    "the samples expected, read, read twice and never read (for a mix(): per source too, "
    "with --repeat/--choose/--weights). Exit status 1 if any.",
    args=(
        arg("index", help="the index file (a mix(): its sources' index files, comma-separated)"),
        arg("states", nargs="*", help="loader states (JSON), in the order saved"),
        WORLD,
        arg("--workers", type=int, default=0, metavar="W", help="workers per rank"),
        arg("--batch-size", type=int, required=True, metavar="B"),
        arg("--policy", choices=("drop", "pad"), default="drop"),
        arg("--logs", metavar="DIR", help="the folder of the ids-rank*.bin logs"),
        one_of(
            arg("--repeat", type=float, nargs="+", metavar="X", help="mix(repeat=[...])"),
            arg("--choose", type=int, nargs="+", metavar="N", help="mix(choose=[...])"),
            arg("--weights", type=float, nargs="+", metavar="W", help="mix(weights=[...])"),
        ),
        arg("--samples-per-epoch", type=int, metavar="N", help="with --weights"),
        arg("--names", metavar="A,B", help="the mixture's source names, comma-separated"),
    ),
)


def run(args: argparse.Namespace) -> int:
    """Print the report; 1 when something was read twice or missed."""
    from shardpipes.index.document import ShardIndex
    from shardpipes.plan.mixture import Mixture
    from shardpipes.verify import verify

    states = []
    for path in args.states:
        with open(path) as f:
            states.append(json.load(f))
    indexes = [ShardIndex.load(url) for url in args.index.split(",")]
    mixture = None
    if args.repeat or args.choose or args.weights:
        mixture = Mixture(
            len(indexes),
            repeat=tuple(args.repeat) if args.repeat else None,
            choose=tuple(args.choose) if args.choose else None,
            weights=tuple(args.weights) if args.weights else None,
            samples_per_epoch=args.samples_per_epoch,
        )
    reports = verify(
        indexes if mixture is not None else indexes[0],
        world=args.world,
        workers=args.workers,
        batch_size=args.batch_size,
        policy=args.policy,
        states=states,
        log_dir=args.logs,
        mixture=mixture,
        names=args.names.split(",") if args.names else None,
    )
    for r in reports:
        print(r.line())
    return 0 if all(r.ok for r in reports) else 1
