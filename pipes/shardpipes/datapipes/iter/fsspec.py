"""List, open and save files through fsspec: local paths, ``file://``, ``s3://``, ``gs://``, HTTP."""

from __future__ import annotations

import errno
import fnmatch
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, cast

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.errors import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    RetriesExhaustedError,
    ShardReadError,
)
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler
from shardpipes.storage.open import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_READAHEAD,
    check_read_options,
    filesystem,
    is_local,
    open_source,
    open_url,
    read_shard_list,
    unstrip,
)
from shardpipes.storage.ranges import ShardRange, read_range
from shardpipes.storage.readahead import Readahead, iter_opened
from shardpipes.storage.retry import Redactor, RetryPolicy, classify_error
from shardpipes.storage.source import ReadOptions, Source, resolve

# The storage functions below are re-exported: user code and the docs import them from here.
__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_READAHEAD",
    "FSSpecFileListerIterDataPipe",
    "FSSpecFileOpenerIterDataPipe",
    "FSSpecSaverIterDataPipe",
    "ForbiddenShardError",
    "MissingShardError",
    "NotAFileError",
    "ReadOptions",
    "RetriesExhaustedError",
    "RetryPolicy",
    "filesystem",
    "is_local",
    "open_url",
    "read_shard_list",
]

_GLOB_CHARS = frozenset("*?[")


class OpenedFile(StreamWrapper):
    """torch's ``StreamWrapper`` (what torchdata 0.9 yielded), usable in a ``with`` block."""

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@register("list_files_by_fsspec")
class FSSpecFileListerIterDataPipe(StageIterDataPipe[str]):
    """List the files under URLs, directories or glob patterns (functional name: ``list_files_by_fsspec``).

    Each input (or ``root`` itself) may be a file, a directory or a glob pattern. A file is
    yielded as given; a directory gives its entries, files and subdirectories (as torchdata 0.9
    listed them: ``list_files_by_fsspec`` again lists a subdirectory), or with
    ``recursive=True`` every file below it; a glob gives the files it matches. Output URLs are
    sorted within each input, so every rank and worker sees the same list in the same order.

    Args:
        root: A URL, a list of URLs, or a DataPipe of URLs.
        masks: Glob patterns that a file's basename must match (any of them). Default: all files.
        recursive: List directories recursively. Default: ``False``.
        storage_options: Passed to the fsspec filesystem (endpoint, credentials, ...).
        **kwargs: Also passed to the fsspec filesystem, as torchdata 0.9 did (``anon=True``).

    Yields:
        str: File URLs, with the same protocol prefix as the input.

    Raises:
        FileNotFoundError: An input names nothing: no such file or directory, or a glob that
            matches no file. The message names the input.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for n in ("b.tar", "a.tar", "c.txt"): _ = (d / n).write_bytes(b"")
        >>> from shardpipes.datapipes.iter import FSSpecFileLister
        >>> [p.rsplit("/", 1)[1] for p in FSSpecFileLister(str(d), masks="*.tar")]
        ['a.tar', 'b.tar']
    """

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe[str],
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(root, str):
            root = [root]
        self.datapipe: Iterable[str] = root
        self.masks = [masks] if isinstance(masks, str) else list(masks)
        self.recursive = recursive
        self.storage_options = {**(storage_options or {}), **kwargs}

    def _matches(self, path: str) -> bool:
        masks = [m for m in self.masks if m]
        if not masks:
            return True
        name = posixpath.basename(path.rstrip("/"))
        return any(fnmatch.fnmatchcase(name, m) for m in masks)

    def __iter__(self) -> Iterator[str]:
        for url in self.datapipe:
            yield from self._list_one(url)

    def _list_one(self, url: str) -> list[str]:
        if not url:
            raise ValueError("list_files_by_fsspec got an empty URL")
        fs, path = filesystem(url, self.storage_options)
        try:
            return self._list_in(fs, path, url)
        except ShardReadError:
            raise
        except (OSError, ValueError) as exc:
            kind = classify_error(exc)
            if kind == "fatal" and not isinstance(exc, OSError):
                raise
            Redactor(url, self.storage_options).raise_(exc, kind, None, 1, 0.0)

    def _list_in(self, fs: Any, path: str, url: str) -> list[str]:
        if _GLOB_CHARS & set(path):
            found = [p for p in fs.glob(path) if not fs.isdir(p)]
            if not found:
                safe = Redactor(url, None).url
                msg = f"{safe}: the glob pattern matches no file"
                raise MissingShardError(msg, url=safe, offset=None, err=errno.ENOENT)
        elif fs.isdir(path):
            if self.recursive:
                found = list(fs.find(path))
            else:
                found = [e["name"] for e in fs.ls(path, detail=True) if e["name"] != path]
        elif fs.exists(path):
            return [url] if self._matches(path) else []  # a file: as given (as 0.9 did)
        else:
            safe = Redactor(url, None).url
            msg = f"{safe}: no such file or directory"
            raise MissingShardError(msg, url=safe, offset=None, err=errno.ENOENT)
        return sorted(unstrip(fs, p, url) for p in found if self._matches(p))


@register("open_files_by_fsspec")
class FSSpecFileOpenerIterDataPipe(StageIterDataPipe[tuple[str, IO[Any]]]):
    """Open each URL through fsspec and yield ``(url, stream)`` (functional name: ``open_files_by_fsspec``).

    Streams are read sequentially by the next stage, which closes them; nothing is downloaded
    whole. Local files are opened directly. Remote objects (S3, GCS, HTTP, ...) are read in
    range requests by background threads, with one read-ahead for the whole iteration: the
    next remote shards are looked up and their first blocks requested while the current one
    is read. Memory stays bounded by one read-ahead budget per process (by default 56 MiB ahead,
    shared by every stream of the process, plus the block being read; see
    ``docs/cloud-storage.md``). The threads and open streams belong to the process, not to the
    stage: at most 32 fetch threads (as many as the requests in flight the process has learnt
    to pay), 2 opener threads and 16 remote streams per process, however many openers it runs
    (:mod:`shardpipes.storage.pool`). A
    transient error (connection reset, time-out, 5xx, a response cut short) is retried
    ``retries`` times with exponential backoff, and the read resumes at the byte offset it had
    reached: the stream delivers every byte once, in order. Permanent errors (no such key or bucket, 401/403)
    fail at once, in the order of the URLs.

    Args:
        source_datapipe: URLs to open.
        mode: ``"r"`` (text, the default, as in torchdata 0.9) or ``"rb"``. ``load_from_tar``
            reads a text-mode stream through its binary buffer, so a tar pipeline works with
            either; byte ranges from ``sharding_by_index`` are always opened binary.
        storage_options: Passed to the fsspec filesystem: endpoint, credentials, anonymous
            access, profile (for example ``{"anon": True}``, ``{"profile": "prod"}``,
            ``{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}``, or HTTP
            ``{"headers": {...}}``). Never shown in error messages.
        open_kwargs: Passed to ``fs.open`` for local files and for remote servers that cannot
            serve ranges (for example ``encoding``). ``kwargs_for_open`` is 0.9's name for it.
        block_size: Bytes per range request, or ``None``: a quarter of each object, within
            1-8 MiB. Default: ``None``.
        readahead: Blocks in flight or ready ahead of the reader, across shard boundaries
            (as many requests at once); ``0`` fetches in the reading thread and opens no shard
            ahead; ``None``: within the process's read-ahead budget, as many requests at once
            as the store rewards (learnt, up to 32). Default: ``None``.
        retries: Retries of a failing request after the first attempt. Default: ``5``.
        backoff: Seconds before the first retry, doubled for each next one (at most 30 s).
            Default: ``0.5``.
        timeout: Seconds one request may take before it is abandoned and retried, or ``None``.
            Default: ``60``.
        handler: What to do when a URL cannot be opened (missing, forbidden, retries used
            up): ``"raise"`` (default), ``"warn_and_skip"``/``"skip"`` (skip the shard and
            count it in ``skipped``), ``"stop"``, or a callable.
        **kwargs: Also passed to the fsspec filesystem, as torchdata 0.9 did (``anon=True``).

    Yields:
        tuple[str, StreamWrapper]: The URL and the open file in a ``StreamWrapper`` (as 0.9:
            ``.file_obj`` is the file; every file method works on the wrapper).

    Raises:
        ShardReadError: Raised when opening or reading fails, naming the URL (never
            credentials) and the byte offset: ``MissingShardError`` (a ``FileNotFoundError``),
            ``ForbiddenShardError`` (a ``PermissionError``), ``NotAFileError``, or
            ``RetriesExhaustedError`` once transient errors outlast ``retries``.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
        >>> _ = p.write_bytes(b"abc")
        >>> from shardpipes.datapipes.iter import FSSpecFileOpener, IterableWrapper
        >>> [(u == str(p), s.read()) for u, s in FSSpecFileOpener(IterableWrapper([str(p)]))]
        [(True, 'abc')]
        >>> [s.read() for _, s in FSSpecFileOpener(IterableWrapper([str(p)]), mode="rb")]
        [b'abc']
    """

    range_to_samples = ("ranges", "streams")

    def __init__(
        self,
        source_datapipe: Iterable[str],
        mode: str = "r",  # torchdata 0.9's default (text); tar and ranges read binary anyway
        *,
        storage_options: Mapping[str, Any] | None = None,
        open_kwargs: Mapping[str, Any] | None = None,
        block_size: int | None = None,
        readahead: int | None = None,
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float | None = 60.0,
        handler: HandlerLike = "raise",
        kwargs_for_open: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if mode not in ("rb", "r"):
            raise ValueError(f"mode {mode!r} is not supported; must be one of 'rb', 'r'")
        check_read_options(block_size, readahead)
        self.options = ReadOptions(block_size, readahead, retries, backoff, timeout)  # validates
        self.handler = resolve_handler(handler)
        self.skipped = SkipStats()
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.storage_options = {**(storage_options or {}), **kwargs}
        self.open_kwargs = {**(open_kwargs or {}), **(kwargs_for_open or {})}

    def _resolve(self, url: Any) -> tuple[Any, Source | None]:
        """``(url, its Source)``, resolved once per URL.

        ``None`` for a byte range or a failure (which ``_open`` raises again, in order).
        """
        if isinstance(url, ShardRange) or not isinstance(url, str):
            return url, None
        try:
            return url, resolve(url, self.storage_options)
        except Exception:
            return url, None

    def _open(self, item: tuple[Any, Source | None], queue: Any = None) -> IO[Any]:
        url, source = item
        if isinstance(url, ShardRange):  # a sample range from sharding_by_index: one read
            source = resolve(str(url), self.storage_options)
            return cast(
                IO[Any],
                read_range(source, url.offset, url.size, options=self.options, spans=url.spans),
            )
        if source is None:
            source = resolve(url, self.storage_options)
        return open_source(source, self.mode, self.options, self.open_kwargs, queue=queue)

    def __iter__(self) -> Iterator[tuple[str, IO[Any]]]:
        policy = self.handler
        items = map(self._resolve, self.source_datapipe)
        opened: Iterator[tuple[Any, Any, Any]]
        if self.options.readahead == 0:
            opened = ((item, None, None) for item in items)
        else:  # the next remote shards are opened, and their first blocks fetched, ahead
            pool = Readahead.for_options(self.options.readahead)
            opened = iter_opened(items, self._open, _streamed, pool)
        for item, future, _ in opened:
            url = item[0]
            try:
                opened_stream = self._open(item) if future is None else future.result()
                stream = cast(IO[Any], OpenedFile(opened_stream, name=str(url)))
            except ShardReadError as exc:
                if policy.raises:
                    raise
                if not policy(exc, str(url), self.skipped, shard=True):
                    return
                continue
            yield url, stream

    def __len__(self) -> int:
        """The number of URLs, as in torchdata 0.9 (unknown when a handler may skip some)."""
        if not self.handler.raises:
            raise TypeError(
                f"{type(self).__name__} instance doesn't have valid length: "
                "its handler may skip URLs"
            )
        return len(cast(Any, self.source_datapipe))


def _streamed(item: tuple[Any, Source | None]) -> bool:
    """Whether an item is read through a remote stream (and so may be opened ahead)."""
    return item[1] is not None and item[1].streamed


@register("save_by_fsspec")
class FSSpecSaverIterDataPipe(StageIterDataPipe[str]):
    """Write ``(url, data)`` pairs to their URLs and yield each URL (functional name: ``save_by_fsspec``).

    Args:
        source_datapipe: Pairs of metadata (the destination URL, or what ``filepath_fn`` maps
            to it) and data: ``str`` in text mode (the default, as in torchdata 0.9), ``bytes``
            with ``mode="wb"``.
        mode: A write mode for ``fs.open``: ``"w"`` (default), ``"wb"``, ``"a"``, ``"ab"``, ...
        filepath_fn: Maps the metadata to the destination URL. Default: unchanged.
        kwargs_for_open: Passed to ``fs.open`` (``encoding``, ...).
        storage_options: Passed to the fsspec filesystem.
        **kwargs: Also passed to the fsspec filesystem, as torchdata 0.9 did (``anon=True``).

    Yields:
        str: The URL written.

    Examples:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> out = list(IterableWrapper([(os.path.join(d, "a.bin"), b"xy")]).save_by_fsspec(mode="wb"))
        >>> open(out[0], "rb").read()
        b'xy'
    """

    def __init__(
        self,
        source_datapipe: Iterable[tuple[Any, bytes | str]],
        mode: str = "w",
        filepath_fn: Any = None,
        *,
        kwargs_for_open: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not (set(mode) <= set("wbaxt+") and len(set(mode) & set("wax")) == 1):
            raise ValueError(f"mode {mode!r} is not a write mode (for example 'w', 'wb', 'ab')")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.kwargs_for_open = dict(kwargs_for_open or {})
        self.storage_options = {**(storage_options or {}), **kwargs}

    def __iter__(self) -> Iterator[str]:
        for meta, data in self.source_datapipe:
            dest = self.filepath_fn(meta) if self.filepath_fn is not None else meta
            fs, path = filesystem(dest, self.storage_options)
            parent = posixpath.dirname(path)
            if parent:
                fs.makedirs(parent, exist_ok=True)
            with fs.open(path, self.mode, **self.kwargs_for_open) as f:
                try:
                    f.write(data)
                except TypeError as exc:
                    hint = "use mode='wb'" if "b" not in self.mode else "use mode='w'"
                    raise TypeError(
                        f"{Redactor(dest, None).url}: save_by_fsspec(mode={self.mode!r}) got "
                        f"{type(data).__name__} data: {hint}"
                    ) from exc
            yield dest

    def __len__(self) -> int:
        return len(cast(Any, self.source_datapipe))
