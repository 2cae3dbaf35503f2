"""The ``shardpipes`` command line: one module per subcommand.

Each module in :data:`COMMANDS` declares its subcommand as data, ``COMMAND`` (a
:class:`~shardpipes.cli._command.Command`: name, help texts, arguments), and defines a
``run(args) -> int``; :func:`build_parser` registers them all the same way. The CLI imports the
library; the library never imports the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from shardpipes.cli._command import register

__all__ = ["COMMANDS", "main"]

COMMANDS = ("demo", "write", "index", "inspect", "splits", "bench", "verify", "report")


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every available subcommand."""
    from shardpipes import __version__

    parser = argparse.ArgumentParser(
        prog="shardpipes",
        description="Stream sharded datasets into distributed PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"shardpipes {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"shardpipes.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"shardpipes.cli.{name}":
                raise
            continue  # a subcommand not built yet
        register(sub, module.COMMAND, module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as exc:
        print(f"shardpipes {args.command}: error: {exc}", file=sys.stderr)
        return 1
