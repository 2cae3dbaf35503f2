"""A subcommand as data: its name, help texts and arguments, added to the parser in one place.

Each subcommand module declares a :class:`Command` named ``COMMAND`` and a ``run(args) -> int``;
:func:`register` turns the declaration into ``sub.add_parser(...)``, one ``add_argument`` per
:class:`Arg` and ``set_defaults(func=run)``, so the argparse calls are written once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NO_PROGRESS", "WORLD", "Arg", "Command", "OneOf", "arg", "flag", "one_of", "register"]


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: the name or flags, and the keyword options as argparse takes them."""

    names: tuple[str, ...]
    options: Mapping[str, Any]


def arg(*names: str, **options: Any) -> Arg:
    """An argument, written as the ``add_argument`` call it stands for."""
    return Arg(names, options)


def flag(*names: str, help: str) -> Arg:
    """An on/off switch: ``store_true``, off by default."""
    return Arg(names, {"action": "store_true", "help": help})


@dataclass(frozen=True)
class OneOf:
    """Arguments of which at most one may be given (argparse's mutually exclusive group)."""

    args: tuple[Arg, ...]


def one_of(*args: Arg) -> OneOf:
    """At most one of ``args`` on a command line."""
    return OneOf(args)


NO_PROGRESS = flag("--no-progress", help="no progress bar")
WORLD = arg("--world", type=int, required=True, metavar="R", help="ranks")


@dataclass(frozen=True)
class Command:
    """A subcommand: ``shardpipes NAME``, its one-line help, its ``--help`` text and arguments."""

    name: str
    help: str
    description: str
    args: tuple[Arg | OneOf, ...]


def register(
    sub: Any, command: Command, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """Add ``command`` to the subparsers ``sub``; the parsed arguments call ``run``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        command.name, help=command.help, description=command.description
    )
    for a in command.args:
        if isinstance(a, OneOf):
            group = parser.add_mutually_exclusive_group()
            for b in a.args:
                group.add_argument(*b.names, **b.options)
        else:
            parser.add_argument(*a.names, **a.options)
    parser.set_defaults(func=run)
    return parser
