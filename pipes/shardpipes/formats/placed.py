"""Large members sent by where they lie, and read once, by the process that uses them.

A worker process of a loader reads a shard of 100 KB samples, and its training loop, in the
main process, uses each sample's bytes. Copied as values, each member's bytes cross three
copies: out of the page cache into the worker's value (faulting the mapped shard in), into
the worker's shared-memory block, and out of the block into a new ``bytes`` in the main
process (``dataloader2/workers/``). When no stage in the worker looks at a large member, none of
that is needed: the worker can send where the member lies, and the main process reads it from
the file, once, straight into the ``bytes`` it hands over.

So, in a worker whose batches cross through shared memory (and only there: the worker asks each
stage that can, a :class:`SupportsPlacedOutput`, to make them), a member of at least
:data:`MIN_BYTES` read from a mapped local file is made as a
:class:`PlacedBytes`: a :class:`~shardpipes.formats.stream.StreamBytes` that knows the file,
the offset and the size, and reads its data on first use. Whatever uses it in the worker (a
``map``, a decoder, ``bytes(v)``, pickling) reads it then and sees a ``StreamBytes`` like any
other; one that crosses to the main process unread is read there (:func:`read_at`) and
arrives as the ``StreamBytes`` an in-process run yields.

A file is named by its path and checked to be the same file, by device, inode, size and
modification time taken when the worker mapped it (:class:`Place`). A shard deleted or
replaced meanwhile (a cache evicting it, say) is still read, from the worker's own open file
(``/proc/<worker pid>/fd/<n>``, where there is a ``/proc``): the worker keeps each mapped
file open while a member of it may be unread (:class:`Held`), and its shared-memory ring
keeps those of a batch until the main process has read the batch. Only a file whose contents
changed in place, or one no longer open anywhere, raises
:class:`~shardpipes.errors.ShardReadError` naming the URL and the offset, rather than hand
over other bytes. Each process keeps up to :data:`MAX_FILES` files open for these reads,
least recently used closed first.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from shardpipes.errors import MissingShardError, ShardReadError
from shardpipes.formats.stream import StreamBytes

__all__ = [
    "MAX_FILES",
    "MIN_BYTES",
    "Held",
    "Place",
    "PlacedBytes",
    "SupportsPlacedOutput",
    "close_files",
    "place_of",
    "place_of_file",
    "read_at",
    "register",
    "unread",
    "values",
]

#: Smallest member sent by its place (smaller ones cost less to copy than to read again); the
#: shared-memory blocks of ``dataloader2/workers/`` take values from this size on too.
MIN_BYTES = 32 << 10
#: Files each process keeps open for :func:`read_at`.
MAX_FILES = 64


class Held:
    """A mapped file kept open while members of it may be unread; closed when freed.

    Every :class:`PlacedBytes` of the file holds it, and a batch sent with places holds those
    of its members until the main process has read it (``dataloader2/workers/``).
    """

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)
        weakref.finalize(self, os.close, self.fd)


class Place(NamedTuple):
    """A local file as it was when it was mapped: where to find it and how to know it again.

    ``pid`` and ``fd``: the process that mapped it and its descriptor of the file
    (:class:`Held`), for a file no longer at ``path``.
    """

    path: str
    url: str
    dev: int
    ino: int
    size: int
    mtime_ns: int
    pid: int
    fd: int

    def same(self, info: os.stat_result) -> bool:
        """Whether ``info`` (an ``os.fstat``) is of this file, unchanged."""
        return _identity(info) == (self.dev, self.ino, self.size, self.mtime_ns)


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file and its version apart: device, inode, size, modification time."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@runtime_checkable
class SupportsPlacedOutput(Protocol):
    """A stage that can make large members of mapped local files as :class:`PlacedBytes`.

    A worker whose batches cross to the main process through shared memory, where an unread
    member is sent by its place, asks every stage of its graph that declares this (as grain's
    workers ask a dataset that ``SupportsSharedMemoryOutput``). Nowhere else would it save a
    copy, so a stage makes plain values until asked.
    """

    def enable_placed_output(self) -> None:
        """Make large members of mapped files by their place from now on."""


# The maps of local files that a stage asked for places registered: which file each one is,
# the file offset of its first byte, and the file held open.
_places: weakref.WeakKeyDictionary[Any, tuple[Place, int, Held]] = weakref.WeakKeyDictionary()


def register(
    mapped: mmap.mmap,
    path: str,
    url: str,
    fd: int,
    origin: int = 0,
    mapped_as: os.stat_result | None = None,
) -> None:
    """Remember that ``mapped`` maps ``path`` from its byte ``origin``.

    ``fd``: a descriptor of the file mapped (the place is its ``os.fstat``); it is duplicated
    (:class:`Held`), not kept. ``mapped_as``: the ``os.fstat`` of the file when it was mapped,
    when ``fd`` was opened since: nothing is registered unless it is that file, unchanged (the
    members are then copied, as without places).
    """
    held = Held(fd)
    place = place_of_file(path, url, held)
    if mapped_as is None or place.same(mapped_as):
        _places[mapped] = (place, origin, held)


def place_of_file(path: str, url: str, held: Held) -> Place:
    """The :class:`Place` of ``path`` (made absolute), held open as ``held``, as it is now."""
    info = os.fstat(held.fd)
    return Place(
        os.path.abspath(path),
        url,
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        os.getpid(),
        held.fd,
    )


def place_of(source: memoryview, sizes: Iterable[int]) -> tuple[Place, int, Held] | None:
    """``(file, offset of source[0] in it, held file)`` for a view of a whole registered map.

    ``None`` also when none of ``sizes`` (the members' about to be made) is large enough to be
    placed: the caller then makes them as it would without places.
    """
    if not _places:
        return None
    obj = source.obj
    if type(obj) is not mmap.mmap or source.nbytes != len(obj):
        return None
    where = _places.get(obj)
    if where is None or max(sizes, default=0) < MIN_BYTES:
        return None
    return where


class PlacedBytes(StreamBytes):
    """A member's data at ``offset`` of ``place``'s file, ``size`` bytes, read on first use.

    A :class:`~shardpipes.formats.stream.StreamBytes` in every respect once read (and reading
    happens on any use of its data: ``bytes(v)``, ``v.read()``, ``v == ...``, pickling);
    ``len(v)`` is known without reading.
    """

    __slots__ = ("held", "offset", "place", "size")

    place: Place | None  # None once read
    held: Held | None

    def __init__(self, place: Place, offset: int, size: int, held: Held | None = None) -> None:
        # The _data slot stays unset until read (StreamBytes.__init__ would set it).
        self.place = place
        self.offset = offset
        self.size = size
        self.held = held
        self._pos = None

    def __getattr__(self, name: str) -> Any:
        if name == "_data":  # the slot is unset: read the data now
            place = self.place
            data = read_at(place, self.offset, self.size) if place is not None else b""
            self._data = data
            self.place = self.held = None  # read (unread() asks)
            return data
        return StreamBytes.__getattr__(self, name)

    def __len__(self) -> int:
        return self.size

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamBytes, (self._data,))


def values(
    where: tuple[Place, int, Held],
    piece: Callable[[slice], Any],
    at: Sequence[int],
    sizes: Sequence[int],
) -> list[StreamBytes]:
    """The members of a map :func:`place_of` knows: data at ``at`` of ``sizes`` bytes each.

    Each of at least :data:`MIN_BYTES` is a :class:`PlacedBytes`; each smaller one a
    ``StreamBytes`` of ``piece(slice(start, end))``, copied now.
    """
    place, origin, held = where
    return [
        PlacedBytes(place, origin + a, n, held)
        if n >= MIN_BYTES
        else StreamBytes(piece(slice(a, a + n)))
        for a, n in zip(at, sizes, strict=True)
    ]


def unread(value: PlacedBytes) -> bool:
    """Whether ``value``'s data has not been read yet."""
    return value.place is not None


class _File:
    """A file :func:`read_at` keeps open, and how many reads are using it now."""

    __slots__ = ("closing", "fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.closing = False

    def let_go(self) -> None:
        """Close it now, or when the last read using it is done (under ``_lock``)."""
        if self.users:
            self.closing = True
        else:
            os.close(self.fd)


_files: OrderedDict[Place, _File] = OrderedDict()
_lock = threading.Lock()


def read_at(place: Place, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of the file ``place`` names, checked to be the one mapped.

    Threads read at once (the lock covers only the table of open files): a file is closed
    when the last read using it is done.
    """
    with _lock:
        f = _files.get(place)
        if f is None:
            f = _files[place] = _File(_open(place, offset))
            while len(_files) > MAX_FILES:
                _files.popitem(last=False)[1].let_go()
        else:
            _files.move_to_end(place)
        f.users += 1
    try:
        data = os.pread(f.fd, size, offset)
    except OSError as exc:
        raise ShardReadError(
            f"{place.url}: reading {size} bytes at byte offset {offset} failed: {exc}",
            url=place.url,
            offset=offset,
        ) from exc
    finally:
        with _lock:
            f.users -= 1
            if f.closing:  # evicted while this read used it: closed by the last read out
                f.let_go()
    if len(data) != size:
        raise ShardReadError(
            f"{place.url}: the file ends before the {size} bytes at byte offset {offset} "
            "(it was cut short after it was read)",
            url=place.url,
            offset=offset,
        )
    return data


def _open(place: Place, offset: int) -> int:
    """A descriptor of ``place``'s file as it was mapped: at its path, or the mapper's own."""
    fd = _open_same(place.path, place)
    if fd is None and place.fd >= 0:  # gone or replaced: the worker's descriptor, if still open
        fd = _open_same(f"/proc/{place.pid}/fd/{place.fd}", place)
    if fd is not None:
        return fd
    if not os.path.exists(place.path):
        raise MissingShardError(
            f"{place.url}: the file is gone since it was read (at byte offset {offset}), and "
            "the process that read it no longer holds it open",
            url=place.url,
            offset=offset,
        )
    raise ShardReadError(
        f"{place.url}: the file changed since it was read (device, inode, size or "
        f"modification time differ from the {place.size} bytes mapped); the member at byte "
        f"offset {offset} is not read from another file",
        url=place.url,
        offset=offset,
    )


def _open_same(path: str, place: Place) -> int | None:
    """``path`` opened, when it is ``place``'s file unchanged; else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if place.same(os.fstat(fd)):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def close_files() -> None:
    """Close the files :func:`read_at` keeps open in this process (once no read uses them)."""
    with _lock:
        while _files:
            _files.popitem()[1].let_go()


def _after_fork_in_child() -> None:
    # A forked worker starts with no maps registered, a fresh lock (another thread may have
    # held the parent's), and none of the parent's files (its copies of them are closed).
    global _lock
    _lock = threading.Lock()
    _places.clear()
    while _files:  # (no thread of the parent reads in the child)
        os.close(_files.popitem()[1].fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
