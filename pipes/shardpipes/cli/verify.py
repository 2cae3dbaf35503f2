"""``shardpipes verify``: replay a run's plan against its loader states and id logs."""

from __future__ import annotations

import argparse
import json

from shardpipes.cli._command import WORLD, Command, arg

__all__ = ["COMMAND", "run"]

COMMAND = Command(
    "verify",
    help="replay a run's plan: samples expected, read, duplicated, missing per epoch",
    description="Given the index, the topology and the run's loader states (JSON, in the "
    "order they were saved) and/or the id logs of dl.attest(log_dir=...), print per epoch "
    "the samples expected, read, read twice and never read. Exit status 1 if any.",
    args=(
        arg("index", help="the index file"),
        arg("states", nargs="*", help="loader states (JSON), in the order saved"),
        WORLD,
        arg("--workers", type=int, default=0, metavar="W", help="workers per rank"),
        arg("--batch-size", type=int, required=True, metavar="B"),
        arg("--policy", choices=("drop", "pad"), default="drop"),
        arg("--logs", metavar="DIR", help="the folder of the ids-rank*.bin logs"),
    ),
)


def run(args: argparse.Namespace) -> int:
    """Print the report; 1 when something was read twice or missed."""
    from shardpipes.index.document import ShardIndex
    from shardpipes.verify import verify

    states = []
    for path in args.states:
        with open(path) as f:
            states.append(json.load(f))
    reports = verify(
        ShardIndex.load(args.index),
        world=args.world,
        workers=args.workers,
        batch_size=args.batch_size,
        policy=args.policy,
        states=states,
        log_dir=args.logs,
    )
    for r in reports:
        print(r.line())
    return 0 if all(r.ok for r in reports) else 1
