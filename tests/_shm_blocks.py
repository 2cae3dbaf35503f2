"""Counting the loader's shared-memory blocks by name, wherever one could survive.

A block is left behind if its name is in ``/dev/shm`` (or the directory blocks are made in), or
if any process still maps it or holds its descriptor (``/proc/<pid>/maps`` and ``fd``: an
anonymous block shows there as ``/memfd:<name> (deleted)``). Each test run names its blocks
with a prefix of its own (``SHARDPIPES_SHM_PREFIX``), so parallel runs on the machine do not
disturb the counts.
"""

from __future__ import annotations

import os
import secrets

from shardpipes.dataloader2.workers.blocks import PREFIX_ENV

__all__ = ["PREFIX_ENV", "blocks_left", "named_blocks", "new_prefix", "processes_holding"]


def new_prefix() -> str:
    """A prefix no other run uses (the default, ``spipe_``, stays for users)."""
    return f"spt{secrets.token_hex(3)}_"


def named_blocks(prefix: str, directory: str = "/dev/shm") -> list[str]:
    """Names with ``prefix`` in ``directory``."""
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def processes_holding(prefix: str) -> dict[int, list[str]]:
    """The processes that map a block named ``prefix...`` or hold its descriptor."""
    held: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        found = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                found += [line.split()[-2] for line in f if prefix in line]
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if prefix in target:
                    found.append(target)
        except (OSError, IndexError):
            continue  # gone meanwhile
        if found:
            held[pid] = found
    return held


def blocks_left(prefix: str, directory: str = "/dev/shm") -> list[str]:
    """Every trace of a block named ``prefix...``: names, maps and descriptors."""
    traces = named_blocks(prefix, directory)
    for pid, found in processes_holding(prefix).items():
        traces += [f"{pid}: {x}" for x in found]
    return traces
