"""Turn webdataset pipeline stages into a shardpipes DataPipe graph.

``build(stages)`` walks a webdataset-style stage list and returns the graph: the shard list
becomes the graph's source, the splitters one ``sharding_filter`` (applied by the loader with
rank and worker), ``tarfile_to_samples`` the shardpipes reader
(``open_files_by_fsspec -> load_from_tar -> webdataset``) plus a conversion to webdataset's
sample format. webdataset's shuffle, batching, decoding and per-sample functions become core
stages (:mod:`shardpipes.webdataset._translate`), so the loader can seed,
count and resume them; any other stage function is a thin DataPipe calling it on its source's
iterator (:class:`~shardpipes.webdataset._stages.FilterStage`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass
from itertools import islice
from typing import Any, cast

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._lean import LeanMapperIterDataPipe
from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.errors import SampleFormatError
from shardpipes.formats.stream import StreamBytes
from shardpipes.webdataset import utils
from shardpipes.webdataset._stages import FilterStage, PassThrough, policy_of
from shardpipes.webdataset._translate import core_stage
from shardpipes.webdataset.handlers import reraise_exception
from shardpipes.webdataset.shardlists import SPLITTERS

__all__ = [
    "EmptyCheck",
    "FilterStage",
    "TarfileToSamples",
    "build",
    "tarfile_samples",
    "tarfile_to_samples",
]


class EmptyCheck(PassThrough):
    """Raise when the whole dataset yields nothing (webdataset's ``empty_check``); one-to-one.

    Only when this reader is the only one: a worker or rank without shards is normal when
    shards are few, and raising there is what makes webdataset's default hang DDP.
    """

    one_to_one = True  # passes samples through (mix() counts samples through it)

    def __init__(self, source_datapipe: IterDataPipe[Any], sharder: Any) -> None:
        super().__init__(source_datapipe)
        self.sharder = sharder

    def __iter__(self) -> Iterator[Any]:
        count = 0
        for sample in self.datapipe:
            count += 1
            yield sample
        readers = getattr(self.sharder, "num_of_instances", 1)
        if count == 0 and readers == 1:
            raise ValueError(
                "No samples found in dataset; check the URLs (empty_check=False in the "
                "WebDataset constructor turns this check off)"
            )


class MemberFilter(StageIterDataPipe[Any]):
    """Apply webdataset's ``select_files`` / ``rename_files`` to ``(path, stream)`` tar members."""

    def __init__(
        self, source_datapipe: IterDataPipe[Any], select_files: Any, rename_files: Any
    ) -> None:
        self.source_datapipe = source_datapipe
        self.select_files = select_files
        self.rename_files = rename_files

    def __iter__(self) -> Iterator[Any]:
        for path, stream in self.source_datapipe:
            name = stream.name
            if self.select_files is not None and not self.select_files(name):
                stream.close()
                continue
            if self.rename_files is not None:
                new = self.rename_files(name)
                path = path[: len(path) - len(name)] + new
                stream.name = new
            yield path, stream


def url_of(item: Any) -> str:
    """The URL of a shard-list item (``{"url": u}`` or ``u``)."""
    url: str = item["url"] if isinstance(item, dict) else item
    return url


def to_wds_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """Shardpipes sample -> webdataset sample: field names without the dot, lower-cased, values ``bytes``.

    webdataset's values are ``bytes`` (its users write ``io.BytesIO(v)`` and ``isinstance(v, bytes)``),
    so a member's :class:`StreamBytes` gives its data (shared, not copied).
    """
    out = {"__key__": sample["__key__"], "__url__": sample["__url__"]}
    for k, v in sample.items():
        if k[:1] == ".":
            out[k[1:].lower()] = v.getvalue() if isinstance(v, StreamBytes) else v
    return out


class _GroupingPolicy:
    """The user's handler, except that members without an extension are skipped as webdataset does."""

    def __init__(self, handler: Callable[[BaseException], bool]) -> None:
        self.handler = handler
        self.__name__ = getattr(handler, "__name__", "handler")

    def __call__(self, exc: BaseException) -> bool:
        if isinstance(exc, SampleFormatError) and "has no extension" in str(exc):
            return True
        return self.handler(exc)


@dataclass(eq=False, repr=False)  # a stage: identity, and no storage_options in a repr
class TarfileToSamples:
    """The ``wds.tarfile_to_samples(...)`` stage: the shardpipes tar reader, webdataset's samples."""

    handler: Callable[[BaseException], bool] = reraise_exception
    select_files: Any = None
    rename_files: Any = None
    _: KW_ONLY
    cache_dir: str | None = None
    cache_size: int = -1
    storage_options: Any = None

    def build(self, urls: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Append the reader to a graph of shard-list items (or of ``sharding_by_index``'s ranges).

        Right after ``sharding_by_index`` the ranges go straight to the opener, so the graph is
        the core's indexed reader (``sharding_by_index -> open -> load_from_tar -> webdataset``)
        and the loader knows each reader's length and resumes it by seeking. A compressed shard
        (``.tgz``, ``.tar.gz``, ``.bz2``, ``.xz``) is recognised by ``load_from_tar`` from its
        first bytes.
        """
        dp = urls if isinstance(urls, IndexSharderIterDataPipe) else urls.map(url_of)
        if self.cache_dir is not None and self.cache_size != 0:
            max_bytes = self.cache_size if self.cache_size > 0 else None
            dp = dp.on_disk_cache(
                self.cache_dir, max_bytes=max_bytes, storage_options=self.storage_options
            )
        dp = dp.open_files_by_fsspec(mode="rb", storage_options=self.storage_options)
        dp = dp.load_from_tar(handler=policy_of(self.handler))
        if self.select_files is not None or self.rename_files is not None:
            dp = MemberFilter(dp, self.select_files, self.rename_files)
        dp = dp.webdataset(handler=_GroupingPolicy(self.handler))
        return LeanMapperIterDataPipe(dp, to_wds_sample)

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        """Read the shards of ``src`` (``{"url": u}`` items) directly, outside a pipeline."""
        yield from self.build(IterableWrapper(list(src), deepcopy=False))


def tarfile_to_samples(
    handler: Callable[[BaseException], bool] = reraise_exception,
    select_files: Any = None,
    rename_files: Any = None,
) -> TarfileToSamples:
    """The stage that reads tar shards into samples ``{"__key__", "__url__", "jpg": bytes, ...}``."""
    return TarfileToSamples(handler, select_files, rename_files)


def tarfile_samples(
    src: Iterable[Any],
    handler: Callable[[BaseException], bool] = reraise_exception,
    select_files: Any = None,
    rename_files: Any = None,
) -> Iterator[Any]:
    """Read the shards of ``src`` (``{"url": u}`` items) into samples."""
    return TarfileToSamples(handler, select_files, rename_files)(src)


class IndexSplit:
    """The split by sample ranges of a shardpipes index (``sharding_by_index``), as a stage marker."""

    def __init__(self, index: Any, storage_options: Any = None) -> None:
        self.index = index
        self.storage_options = storage_options

    def build(self, urls: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Append the index split to a graph of shard-list items."""
        return cast(
            IterDataPipe[Any],
            urls.map(url_of).sharding_by_index(self.index, storage_options=self.storage_options),
        )


class CallSource(StageIterDataPipe[Any]):
    """A source stage that is a callable returning an iterable (webdataset allows these)."""

    def __init__(self, fn: Callable[[], Iterable[Any]]) -> None:
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        yield from self.fn()


def source_of(stage: Any) -> IterDataPipe[Any]:
    """The first stage of a pipeline as a DataPipe."""
    if isinstance(stage, IterDataPipe):
        return stage
    if isinstance(stage, list | tuple):
        return IterableWrapper(list(stage), deepcopy=False)
    if callable(stage) and not hasattr(stage, "__iter__"):
        return CallSource(stage)
    if hasattr(stage, "__iter__"):
        return IterableWrapper(stage, deepcopy=False)
    raise ValueError(f"{stage!r}: not a valid pipeline source")


def build(
    stages: Iterable[Any], dp: IterDataPipe[Any] | None = None, sharder: Any = None
) -> tuple[IterDataPipe[Any] | None, Any]:
    """Append ``stages`` to ``dp``; return the graph and its sharding stage (or ``None``)."""
    for stage in stages:
        if dp is None:
            dp = source_of(stage)
            continue
        if isinstance(stage, IndexSplit):
            if sharder is None:
                dp = sharder = stage.build(dp)
            continue
        if stage in SPLITTERS:
            if sharder is None:
                dp = sharder = dp.sharding_filter()
            continue
        if isinstance(stage, TarfileToSamples):
            if sharder is None:  # no splitter written: split here, never read all in every reader
                dp = sharder = dp.sharding_filter()
            dp = stage.build(dp)
        elif (core := core_stage(dp, stage)) is not None:
            dp = core
        elif isinstance(stage, IterDataPipe):
            raise ValueError(f"{stage!r}: a DataPipe can only be the first stage of a pipeline")
        elif isinstance(stage, utils.PipelineStage):
            dp = FilterStage(dp, stage.run)
        elif callable(stage):
            dp = FilterStage(dp, stage)
        else:
            raise ValueError(f"{stage!r}: not a valid pipeline stage")
    return dp, sharder


class RepeatEpochs(StageIterDataPipe[Any]):
    """Iterate the graph ``repetitions`` times (stopping early if a pass is empty), cut at ``nsamples``.

    webdataset's ``with_epoch``/``repeat`` on a pipeline: not one-to-one, so the loader neither
    derives a length from an index through it nor seeks into it (it replays).
    """

    def __init__(self, source_datapipe: IterDataPipe[Any], repetitions: int, nsamples: int) -> None:
        self.source_datapipe = source_datapipe
        self.repetitions = repetitions
        self.nsamples = nsamples

    def __iter__(self) -> Iterator[Any]:
        yield from repeat_epochs(self.source_datapipe, self.repetitions, self.nsamples)


def repeat_epochs(source: IterDataPipe[Any], repetitions: int, nsamples: int) -> Iterator[Any]:
    """Iterate ``source`` ``repetitions`` times (stopping early if a pass is empty), cut at ``nsamples``."""

    def passes() -> Iterator[Any]:
        for _ in range(repetitions):
            count = 0
            for sample in source:
                count += 1
                yield sample
            if count == 0:
                break

    it = passes()
    return islice(it, nsamples) if nsamples > 0 else it


MAXSIZE = sys.maxsize
