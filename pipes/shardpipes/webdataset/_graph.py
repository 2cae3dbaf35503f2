"""Turn webdataset pipeline stages into a shardpipes DataPipe graph.

``build(stages)`` walks a webdataset-style stage list and returns the graph: the shard list
becomes the graph's source, the splitters one ``sharding_filter`` (applied by the loader with
rank and worker), ``tarfile_to_samples`` the shardpipes reader
(``open_files_by_fsspec -> load_from_tar -> webdataset``) plus a conversion to webdataset's
sample format, the shuffles seeded stages, and every other stage function a thin DataPipe
calling it on its source's iterator.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, cast

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter._base import StageIterDataPipe
from shardpipes.errors import SampleFormatError
from shardpipes.webdataset import filters, utils
from shardpipes.webdataset.handlers import reraise_exception
from shardpipes.webdataset.shardlists import SPLITTERS

__all__ = [
    "EmptyCheck",
    "FilterStage",
    "ShuffleStage",
    "TarfileToSamples",
    "build",
    "tarfile_samples",
    "tarfile_to_samples",
]


class FilterStage(StageIterDataPipe[Any]):
    """Run a webdataset stage function ``fn(iterator) -> iterator`` as a DataPipe."""

    def __init__(
        self, source_datapipe: IterDataPipe[Any], fn: Callable[[Iterator[Any]], Iterable[Any]]
    ) -> None:
        self.source_datapipe = source_datapipe
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        yield from self.fn(iter(self.source_datapipe))


class ShuffleStage(StageIterDataPipe[Any]):
    """webdataset's buffered shuffle, seeded by the loader (``set_seed``) once per epoch.

    Without a shardpipes loader: ``seed`` fixes the order (the same every iteration, as in
    webdataset), ``epoch_seeded`` (``detshuffle``) adds the iteration count to it, and no seed
    at all shuffles differently every time.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        bufsize: int = 1000,
        initial: int = 100,
        seed: Any = None,
        *,
        epoch_seeded: bool = False,
        counter: Any = None,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch_seeded = epoch_seeded
        # webdataset's detshuffle counts its epochs on the stage object the user holds.
        self.counter = counter if counter is not None else _Counter()
        self._loader_seed: int | None = None

    def set_seed(self, seed: int) -> ShuffleStage:
        """Called by the reading service before each epoch."""
        self._loader_seed = seed
        return self

    def __iter__(self) -> Iterator[Any]:
        self.counter.epoch += 1
        if self._loader_seed is not None:
            rng = random.Random(self._loader_seed)
        elif self.epoch_seeded:
            rng = random.Random(utils.make_seed(self.seed or 0, self.counter.epoch))
        elif self.seed is not None:
            rng = random.Random(self.seed)
        else:
            rng = filters._unseeded()
        yield from filters.shuffle_iter(self.source_datapipe, self.bufsize, self.initial, rng)


class _Counter:
    epoch = -1


class EmptyCheck(StageIterDataPipe[Any]):
    """Raise when the whole dataset yields nothing (webdataset's ``empty_check``).

    Only when this reader is the only one: a worker or rank without shards is normal when
    shards are few, and raising there is what makes webdataset's default hang DDP.
    """

    one_to_one = True  # passes samples through (mix() counts samples through it)

    def __init__(self, source_datapipe: IterDataPipe[Any], sharder: Any) -> None:
        self.source_datapipe = source_datapipe
        self.sharder = sharder

    def __iter__(self) -> Iterator[Any]:
        count = 0
        for sample in self.source_datapipe:
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


class _Stream(io.RawIOBase):
    """A decompressing reader that closes the compressed stream with itself."""

    def __init__(self, outer: Any, inner: Any) -> None:
        super().__init__()
        self.outer = outer
        self.inner = inner

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        data: bytes = self.outer.read(-1 if n is None else n)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.outer.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.outer.close()
            self.inner.close()
        super().close()


_DECOMPRESSORS = {
    ".gz": gzip.GzipFile,
    ".tgz": gzip.GzipFile,
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
}


class Decompressed(StageIterDataPipe[Any]):
    """Decompress ``.tgz``/``.tar.gz``/``.bz2``/``.xz`` shards on the fly, as webdataset reads them."""

    one_to_one = True  # one stream per stream (mix() counts samples through it)

    def __init__(self, source_datapipe: IterDataPipe[Any]) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Any]:
        for url, stream in self.source_datapipe:
            name = str(url).lower()
            for suffix, cls in _DECOMPRESSORS.items():
                if name.endswith(suffix):
                    stream = _Stream(cls(fileobj=stream, mode="rb"), stream)
                    break
            yield url, stream


def url_of(item: Any) -> str:
    """The URL of a shard-list item (``{"url": u}`` or ``u``)."""
    url: str = item["url"] if isinstance(item, dict) else item
    return url


def to_wds_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """Shardpipes sample -> webdataset sample: field names without the dot, lower-cased."""
    out = {"__key__": sample["__key__"], "__url__": sample["__url__"]}
    for k, v in sample.items():
        if k[:1] == ".":
            out[k[1:].lower()] = v
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


def _policy(handler: Callable[[BaseException], bool]) -> Any:
    return "raise" if handler is reraise_exception else handler


class TarfileToSamples:
    """The ``wds.tarfile_to_samples(...)`` stage: the shardpipes tar reader, webdataset's samples."""

    def __init__(
        self,
        handler: Callable[[BaseException], bool] = reraise_exception,
        select_files: Any = None,
        rename_files: Any = None,
        *,
        cache_dir: str | None = None,
        cache_size: int = -1,
        storage_options: Any = None,
    ) -> None:
        self.handler = handler
        self.select_files = select_files
        self.rename_files = rename_files
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.storage_options = storage_options

    def build(self, urls: IterDataPipe[Any]) -> IterDataPipe[Any]:
        """Append the reader to a graph of shard-list items."""
        dp = urls.map(url_of)
        if self.cache_dir is not None and self.cache_size != 0:
            max_bytes = self.cache_size if self.cache_size > 0 else None
            dp = dp.on_disk_cache(
                self.cache_dir, max_bytes=max_bytes, storage_options=self.storage_options
            )
        dp = dp.open_files_by_fsspec(mode="rb", storage_options=self.storage_options)
        dp = Decompressed(dp)
        dp = dp.load_from_tar(handler=_policy(self.handler))
        if self.select_files is not None or self.rename_files is not None:
            dp = MemberFilter(dp, self.select_files, self.rename_files)
        dp = dp.webdataset(handler=_GroupingPolicy(self.handler))
        return cast(IterDataPipe[Any], dp.map(to_wds_sample))

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


def _is_curried(stage: Any, fn: Callable[..., Any]) -> bool:
    return isinstance(stage, filters.FilterFunction) and stage.f is fn


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
        elif _is_curried(stage, filters._shuffle):
            dp = _shuffle_stage(dp, stage)
        elif isinstance(stage, filters.detshuffle):
            dp = ShuffleStage(
                dp, stage.bufsize, stage.initial, stage.seed, epoch_seeded=True, counter=stage
            )
        elif isinstance(stage, IterDataPipe):
            raise ValueError(f"{stage!r}: a DataPipe can only be the first stage of a pipeline")
        elif isinstance(stage, utils.PipelineStage):
            dp = FilterStage(dp, stage.run)
        elif callable(stage):
            dp = FilterStage(dp, stage)
        else:
            raise ValueError(f"{stage!r}: not a valid pipeline stage")
    return dp, sharder


def _shuffle_stage(dp: IterDataPipe[Any], stage: filters.FilterFunction) -> IterDataPipe[Any]:
    names = ("bufsize", "initial", "rng", "seed", "handler")
    kw = dict(zip(names, stage.args, strict=False))
    kw.update(stage.kw)
    if kw.get("rng") is not None:  # an explicit generator: the user owns the randomness
        return FilterStage(dp, stage)
    return ShuffleStage(dp, kw.get("bufsize", 1000), kw.get("initial", 100), kw.get("seed"))


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
