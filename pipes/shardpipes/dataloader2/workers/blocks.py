"""Shared-memory blocks that never outlive the processes that map them.

The main process makes every block of its workers' rings (``ring.py``) before they start,
without a name anyone could find later: on Linux an anonymous ``memfd_create`` file; elsewhere,
or in a directory the user chose (:data:`DIR_ENV`), a file made with ``O_EXCL`` whose name is
removed as soon as it is open. Each worker gets its blocks as file descriptors (:class:`Handle`:
inherited by a fork, passed to a spawned worker as it starts), sizes them as its batches need
(:func:`grow`), and names a block in its messages by its number; both processes map it and reuse
it message after message. The kernel frees the memory when the last process that maps it or
holds its descriptor is gone, whatever the way it went (an exit, an exception, SIGKILL): nothing
is left in ``/dev/shm``, and Python's resource tracker never hears of the blocks. Nothing is
handed over while the loader runs, so a batch a worker sent just before it died still arrives.

A named block lives for the few microseconds between its ``open`` and its ``unlink``. Its name
says which process made it (``<prefix><pid>_<start time>_<n>``, base 36, the start time from
``/proc/<pid>/stat``), so that :func:`remove_stale`, run when a loader starts, can remove a name
whose maker is gone (a kill in those microseconds). That is a second line, never the first.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from multiprocessing import reduction, shared_memory
from typing import Any

__all__ = [
    "DIR_ENV",
    "PREFIX",
    "PREFIX_ENV",
    "Handle",
    "Mapping",
    "grow",
    "make_block",
    "prefix",
    "remove_stale",
]

PREFIX = "spipe_"  # short: macOS allows 31 characters in a shared-memory name
#: The environment variable that replaces :data:`PREFIX` (tests give each run its own).
PREFIX_ENV = "SHARDPIPES_SHM_PREFIX"
#: The environment variable naming a directory for the blocks (a tmpfs of your choice) instead
#: of anonymous memory; there, each block's file is made and its name removed at once.
DIR_ENV = "SHARDPIPES_SHM_DIR"
_SHM_DIR = "/dev/shm"  # where POSIX shared-memory names live on Linux (the janitor looks there)

_numbers = itertools.count()  # a block's number in this process (names are never reused)


def prefix() -> str:
    """The prefix of the blocks' names: :data:`PREFIX` unless :data:`PREFIX_ENV` says."""
    return os.environ.get(PREFIX_ENV) or PREFIX


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), ``None`` if there is none; 0 without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    # field 22, counted after the command name, which is in parentheses and may hold spaces
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _maker() -> str:
    """This process as a name part: its pid and start time, base 36."""
    pid = os.getpid()
    return f"{_b36(pid)}_{_b36(_start_time(pid) or 0)}"


def make_block() -> tuple[int, str, bool]:
    """A new, empty block: ``(descriptor, name, named)``, the name already gone.

    ``named``: the block is a file of a size-limited tmpfs (``/dev/shm`` or :data:`DIR_ENV`'s),
    whose pages :func:`grow` allocates at once. The main process makes the blocks, before its
    workers start, and each worker sizes its own.
    """
    name = f"{prefix()}{_maker()}_{_b36(next(_numbers))}"
    directory = os.environ.get(DIR_ENV)
    if directory:
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with contextlib.suppress(FileNotFoundError):  # (a janitor may have been quicker)
            os.unlink(path)
        return fd, name, True
    if hasattr(os, "memfd_create"):
        # charged to the memory of the job like any other, not to /dev/shm's size
        return os.memfd_create(name, os.MFD_CLOEXEC), name, False
    posix: Any = shared_memory._posixshmem  # type: ignore[attr-defined]
    fd = posix.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
    with contextlib.suppress(FileNotFoundError):
        posix.shm_unlink("/" + name)
    return fd, name, True


def grow(fd: int, size: int, *, named: bool) -> None:
    """Make block ``fd`` ``size`` bytes long (never shorter: lent values may map its start).

    Raises ``OSError`` when there is no room: in a size-limited tmpfs the pages are allocated
    now, so a full one says ``ENOSPC`` here, not ``SIGBUS`` when a page is first written.
    """
    os.ftruncate(fd, size)
    if named and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)


class Handle:
    """Block number ``index`` of a loader, as its worker gets it: ``fd()`` is its descriptor.

    Made by the main process before its workers start. A forked worker inherits the
    descriptor; a spawned one receives a copy when it starts (pickled, it is a ``DupFd``).
    """

    __slots__ = ("_dup", "_fd", "index", "name", "named")

    def __init__(self, index: int, name: str, fd: int, named: bool, dup: Any = None) -> None:
        self.index = index
        self.name = name
        self.named = named
        self._fd = fd
        self._dup = dup

    def __reduce__(self) -> tuple[Any, ...]:
        return (Handle, (self.index, self.name, -1, self.named, reduction.DupFd(self._fd)))

    def fd(self) -> int:
        """The block's descriptor in this process."""
        if self._dup is not None:
            dup, self._dup = self._dup, None
            self._fd = int(dup.detach())
        return self._fd

    def close(self) -> None:
        """Close the descriptor (in a worker: another worker's block, inherited by a fork)."""
        fd, self._fd = self._fd, -1
        if self._dup is None and fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dup = None


class Mapping:
    """``size`` bytes of a block mapped in this process: ``buf`` views them, until :meth:`close`."""

    __slots__ = ("buf", "map", "name", "size")

    def __init__(self, fd: int, name: str, size: int) -> None:
        self.size = size
        self.map: mmap.mmap | None = mmap.mmap(fd, size)
        self.buf: memoryview | None = memoryview(self.map)
        self.name = name

    def close(self) -> None:
        """Unmap now, or, while tensors or arrays lent from the block live, when they are gone."""
        buf, self.buf = self.buf, None
        mapped, self.map = self.map, None
        try:
            if buf is not None:
                buf.release()
            if mapped is not None:
                mapped.close()
        except BufferError:
            # Still lent out: the values hold the view, which holds the map; the map goes
            # when the last value made from it is freed.
            pass


def remove_stale(directory: str | None = None) -> list[str]:
    """Remove block names in ``directory`` whose maker is gone; return them.

    ``directory``: :data:`DIR_ENV`'s, else ``/dev/shm``. A name is removed only if it has this
    run's prefix and the form :func:`make_block` gives, and the process it names is not
    running, or a process of that pid started at another time. Removing a name never harms a
    live block (nothing opens a block by its name), so another pid namespace sharing the
    directory cannot lose data to this either.
    """
    directory = directory or os.environ.get(DIR_ENV) or _SHM_DIR
    start = prefix()
    try:
        names = [n for n in os.listdir(directory) if n.startswith(start)]
    except OSError:
        return []
    removed = []
    for name in names:
        parts = name[len(start) :].split("_")
        if len(parts) != 3:
            continue  # not ours (or an older release's, named otherwise)
        try:
            pid, started = int(parts[0], 36), int(parts[1], 36)
            int(parts[2], 36)
        except ValueError:
            continue
        now = _start_time(pid)
        if now is not None and (now == started or not now or not started):
            continue  # its maker runs (or cannot be told apart without /proc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    return removed
