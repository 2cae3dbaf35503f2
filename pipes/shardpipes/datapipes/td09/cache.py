"""torchdata 0.9's ``on_disk_cache(filepath_fn=...)`` ... ``end_caching(...)`` pair.

``on_disk_cache`` called with 0.9's arguments (``filepath_fn``, ``hash_dict``, ``hash_type``,
``extra_check_fn``) builds a ``TorchdataCacheHolder``: :class:`OnDiskCacheHolderIterDataPipe`
holds the functional name and the 0.9 class name, and leaves every other call to the core stage
(``datapipes/iter/cache.py``, which knows nothing of 0.9). The stages between it and
``end_caching`` run only for items whose file is not on disk yet.

How the graph is cut (0.9's protocol, on-disk names kept so 0.9 caches are reused):

- each item of the holder's source is classified by a check of its file ``filepath_fn(item)``:
  cached (exists, hash and ``extra_check_fn`` pass), cached as several files (a
  ``<file>.torchdata_list`` lists them), or to do;
- "to do" is claimed across processes with a promise file ``<file>.promise.<uuid>`` written
  under an exclusive ``flock``: the first process claims the work, the others treat the item as
  cached and wait (up to ``timeout`` seconds) until the promise is gone;
- ``end_caching`` writes what the traced stages yield, checks hashes, deletes the promise of
  each source item once all its files are written, and yields the file paths, then the
  cached ones.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import _check_unpickable_fn
from torch.utils.data.graph import traverse_dps

from shardpipes.datapipes.iter import cache
from shardpipes.datapipes.iter.base import StageIterDataPipe, register, widen
from shardpipes.formats.hashes import check_hash_type, file_digest

__all__ = [
    "EndOnDiskCacheHolderIterDataPipe",
    "OnDiskCacheHolderIterDataPipe",
    "TorchdataCacheHolder",
    "WaitPendingCacheItemIterDataPipe",
]

_TODO, _CACHED, _CACHED_LIST = 0, 1, 2


def _promise(path: str, cache_uuid: Any) -> str:
    return f"{path}.promise.{cache_uuid}"


def _list_file(path: str) -> str:
    return path + ".torchdata_list"


def _hash_check(path: str, hash_dict: dict[str, str], hash_type: str) -> bool:
    if path not in hash_dict:
        return False
    return file_digest(path, hash_type) == hash_dict[path]


def _hash_check_09() -> Callable[[str, dict[str, str], str], bool]:
    """``_hash_check`` of 0.9's module path, looked up at call time as 0.9 did (tests patch it)."""
    module = sys.modules.get("shardpipes.datapipes.iter.util.cacheholder")
    return cast(
        Callable[[str, dict[str, str], str], bool], getattr(module, "_hash_check", _hash_check)
    )


def _classify(
    item: Any,
    filepath_fn: Callable[[Any], str] | None,
    hash_dict: dict[str, str] | None,
    hash_type: str,
    extra_check_fn: Callable[[str], bool] | None,
    cache_uuid: Any,
) -> int:
    path = item if filepath_fn is None else filepath_fn(item)
    if not isinstance(path, str):
        raise TypeError(
            f"on_disk_cache: filepath_fn must return one str path, got {path!r} for {item!r}"
        )
    if os.path.exists(_list_file(path)):
        return _CACHED_LIST
    if (
        os.path.exists(path)
        and (hash_dict is None or _hash_check_09()(path, hash_dict, hash_type))
        and (extra_check_fn is None or extra_check_fn(path))
    ):
        return _CACHED
    promise = _promise(path, cache_uuid)
    os.makedirs(os.path.dirname(promise) or ".", exist_ok=True)
    fd = os.open(promise, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.pread(fd, 1, 0):  # another process claimed it: wait for its file
            return _CACHED
        os.pwrite(fd, b"[dataloader session uid]", 0)
        return _TODO
    finally:
        os.close(fd)  # releases the lock


_TORCHDATA_KWARGS = {"filepath_fn", "hash_dict", "hash_type", "extra_check_fn"}


def _is_torchdata_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """0.9's arguments: none, a callable (or None) first, or one of its keywords."""
    if _TORCHDATA_KWARGS & set(kwargs):
        return True
    if not args:
        return "cache_dir" not in kwargs
    return args[0] is None or callable(args[0])


class OnDiskCacheHolderIterDataPipe(cache.OnDiskCacheHolderIterDataPipe):
    """``on_disk_cache`` with torchdata 0.9's arguments as well as ours (functional name: ``on_disk_cache``).

    ``on_disk_cache(cache_dir, ...)`` is the core stage (this class adds nothing to it);
    ``on_disk_cache(filepath_fn, hash_dict, hash_type, extra_check_fn)`` is 0.9's, a
    :class:`TorchdataCacheHolder` that needs ``end_caching``.
    """

    def __new__(
        cls, source_datapipe: IterDataPipe[str] | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        """Build 0.9's holder for 0.9's arguments, else the core stage."""
        # Unpickling calls __new__ with no arguments at all.
        if source_datapipe is not None and _is_torchdata_call(args, kwargs):
            return TorchdataCacheHolder(source_datapipe, *args, **kwargs)
        return super().__new__(cls)


widen("on_disk_cache", OnDiskCacheHolderIterDataPipe)


class TorchdataCacheHolder(StageIterDataPipe[Any]):
    """The 0.9 form of ``on_disk_cache``: marks where cached work starts; needs ``end_caching``.

    Args:
        source_datapipe: Items whose results are cached.
        filepath_fn: Item -> path of its cached file. Default: ``None`` (items are paths).
        hash_dict: Path -> expected digest; a file that does not match is made again.
        hash_type: ``"sha256"`` or ``"md5"``. Default: ``"sha256"``.
        extra_check_fn: Path -> whether the cached file is usable. Default: ``None``.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        filepath_fn: Callable[[Any], str] | None = None,
        hash_dict: dict[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ) -> None:
        if filepath_fn is not None:
            _check_unpickable_fn(filepath_fn)
        if hash_dict is not None:
            check_hash_type(hash_type)
        self.source_datapipe = source_datapipe
        self.filepath_fn = filepath_fn
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.extra_check_fn = extra_check_fn
        self.cache_uuid = uuid.uuid4()
        self._end_caching_flag = False

    def __iter__(self) -> Iterator[Any]:
        if not self._end_caching_flag:
            raise RuntimeError("Please call `end_caching()` before iteration.")
        yield from self.source_datapipe

    def __add__(self, other: Any) -> Any:
        raise RuntimeError("`OnDiskCacheHolder` doesn't support add operation")

    def _end_caching(self) -> tuple[IterDataPipe[Any], IterDataPipe[Any]]:
        check = partial(
            _classify,
            filepath_fn=self.filepath_fn,
            hash_dict=self.hash_dict,
            hash_type=self.hash_type,
            extra_check_fn=self.extra_check_fn,
            cache_uuid=self.cache_uuid,
        )
        todo, cached, listed = self.source_datapipe.demux(3, check)
        if self.filepath_fn is not None:
            cached = cached.map(self.filepath_fn)
            listed = listed.map(self.filepath_fn)
        self.source_datapipe = _MemoryCell(todo)
        self._end_caching_flag = True
        return cached, _ListedFiles(listed)


@register("memory_cell")
class _MemoryCell(StageIterDataPipe[Any]):
    """Pass items through, remembering the last ``keep`` with an id each."""

    def __init__(self, source_datapipe: IterDataPipe[Any], keep: int = 1000) -> None:
        self.source_datapipe = source_datapipe
        self.keep = keep
        self.recent: list[tuple[int, Any]] = []
        self._next_id = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            self._next_id += 1
            self.recent.append((self._next_id, item))
            del self.recent[: -self.keep]
            yield item


class _ListedFiles(StageIterDataPipe[tuple[str, str]]):
    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for path in self.source_datapipe:
            with open(_list_file(path)) as f:
                for line in f:
                    yield path, line.rstrip()


class WaitPendingCacheItemIterDataPipe(StageIterDataPipe[Any]):
    """Yield cached paths once no other process still promises to write them.

    ``timeout`` (seconds) is what ``CacheTimeout`` sets through ``set_timeout``.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        timeout: float = 300,
        input_col: Any = None,
        cache_uuid: Any = None,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.timeout = timeout
        self.input_col = input_col
        self.cache_uuid = cache_uuid

    def set_cache_timeout(self, timeout: float) -> None:
        """Set how long to wait for a file another process is writing (the hook ``CacheTimeout`` calls)."""
        self.timeout = timeout

    set_timeout = set_cache_timeout  # 0.9's name

    def __iter__(self) -> Iterator[Any]:
        for data in self.source_datapipe:
            path = data if self.input_col is None else data[self.input_col]
            promise = _promise(path, self.cache_uuid)
            deadline = time.monotonic() + self.timeout
            while os.path.exists(promise):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"OnDiskCache Exception: {path} expected to be written by different "
                        f"process, but file is not ready in {self.timeout} seconds."
                    )
                time.sleep(0.01)
            yield data


class _FulfilledPromises(StageIterDataPipe[str]):
    """Pass written paths through; delete a source item's promise once all its files are written."""

    def __init__(
        self, source_datapipe: IterDataPipe[str], cell: _MemoryCell, holder: TorchdataCacheHolder
    ) -> None:
        self.source_datapipe = source_datapipe
        self.cell = cell
        self.holder = holder

    def _original(self, item: Any) -> str:
        fn = self.holder.filepath_fn
        return item if fn is None else fn(item)

    def _fulfil(self, upto: int | None) -> None:
        for rec_id, item in list(self.cell.recent):
            if upto is not None and rec_id > upto:
                break
            path = self._original(item)
            try:
                os.unlink(_promise(path, self.holder.cache_uuid))
            except FileNotFoundError:
                pass
        self.cell.recent[:] = [r for r in self.cell.recent if upto is not None and r[0] > upto]

    def __iter__(self) -> Iterator[str]:
        current: int | None = None
        many = one = False
        try:
            for path in self.source_datapipe:
                if not self.cell.recent:
                    raise RuntimeError(
                        f"end_caching: {path} was written but no source item is pending"
                    )
                rec_id, item = self.cell.recent[-1]
                original = self._original(item)
                if original != path:  # one source item -> several files: list them
                    many = True
                    if one:
                        raise RuntimeError(
                            "Disovered different keys when one-to-one mode previously assumed"
                        )
                    with open(_list_file(original), "a") as f:
                        f.write(f"{path}\n")
                else:
                    one = True
                    if many:
                        raise RuntimeError("first key somehow equal to secondary key")
                if rec_id != current:
                    if current is not None:
                        self._fulfil(current)  # the previous item is complete
                    current = rec_id
                yield path
        finally:
            if current is not None:
                self._fulfil(None)


def _read_bytes(stream: Any) -> bytes:
    return b"".join(stream)


def _read_str(stream: Any) -> str:
    return "".join(stream)


def _second(pair: tuple[Any, Any]) -> Any:
    return pair[1]


def _find_holder(graph: dict[Any, Any]) -> TorchdataCacheHolder | None:
    for dp, _ in graph.values():
        if isinstance(dp, TorchdataCacheHolder):
            return dp
    for _, sub in graph.values():
        found = _find_holder(sub)
        if found is not None:
            return found
    return None


@register("end_caching")
# Not on the stage base: __new__ builds the graph it stands for (0.9 did the same).
class EndOnDiskCacheHolderIterDataPipe(IterDataPipe[str]):
    """Write the results traced since ``on_disk_cache(filepath_fn=...)`` to files and yield their paths (functional name: ``end_caching``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``datapipe``: Yields ``(path or metadata, data or stream)``; the graph holds an
      ``on_disk_cache`` called with 0.9's arguments.
    - ``mode``: Write mode (``"wb"``, or ``"w"``/``"t"`` for text). Default: ``"wb"``.
    - ``filepath_fn``: Metadata -> file path. Default: ``None`` (the metadata is the path).
    - ``same_filepath_fn``: Use the ``filepath_fn`` of ``on_disk_cache``. Default: ``False``.
    - ``skip_read``: Data is already bytes/str, do not read it as a stream. Default: ``False``.
    - ``timeout``: Seconds to wait for a file another process is writing. Default: ``300``.

    Raises:
        RuntimeError: No ``on_disk_cache`` in the graph, or ``end_caching`` called twice.
    """

    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[Any],
        mode: str = "wb",
        filepath_fn: Callable[[Any], str] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float = 300,
    ) -> IterDataPipe[str]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        if filepath_fn is not None and same_filepath_fn:
            raise ValueError("`filepath_fn` is mutually exclusive with `same_filepath_fn`")
        holder = _find_holder(traverse_dps(datapipe))
        if holder is None:
            raise RuntimeError(
                "Expected `OnDiskCacheHolder` existing in pipeline when `end_caching` is invoked"
            )
        if holder._end_caching_flag:
            raise RuntimeError("`end_caching` can only be invoked once per `OnDiskCacheHolder`")
        cached, listed = holder._end_caching()
        cached = WaitPendingCacheItemIterDataPipe(
            cached, timeout=timeout, cache_uuid=holder.cache_uuid
        )
        listed = WaitPendingCacheItemIterDataPipe(
            listed, timeout=timeout, input_col=0, cache_uuid=holder.cache_uuid
        )
        if same_filepath_fn:
            filepath_fn = holder.filepath_fn
        todo: IterDataPipe[Any] = datapipe
        if not skip_read:
            todo = todo.map(fn=_read_str if "t" in mode else _read_bytes, input_col=1)
        if filepath_fn is not None:
            todo = todo.map(fn=filepath_fn, input_col=0)
        if holder.hash_dict is not None:
            todo = todo.check_hash(holder.hash_dict, holder.hash_type)
        todo = todo.save_to_disk(mode=mode)
        cell = cast(_MemoryCell, holder.source_datapipe)  # set by _end_caching just above
        todo = _FulfilledPromises(todo, cell, holder)
        return todo.concat(cached).concat(listed.map(_second))
