"""``DataPipeline`` and the fluent methods shared by ``WebDataset``, ``FluidWrapper`` and ``WebLoader``."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from shardpipes.errors import ShardpipesWarning
from shardpipes.webdataset import _graph, filters
from shardpipes.webdataset._stages import PassThrough
from shardpipes.webdataset.handlers import reraise_exception

__all__ = ["DataPipeline", "FluidInterface"]


class FluidInterface:
    """webdataset's chainable methods; each returns a new pipeline with one more stage."""

    def compose(self, *args: Any) -> Any:  # pragma: no cover - provided by the subclasses
        """Return a copy with ``args`` appended as stages."""
        raise NotImplementedError

    def batched(
        self,
        batchsize: int,
        collation_fn: Callable[[list[Any]], Any] | None = filters.default_collation_fn,
        partial: bool = True,
    ) -> Any:
        """Group ``batchsize`` samples and collate them (``partial=False`` drops a short last batch)."""
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """Split batches back into samples."""
        return self.compose(filters.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Group ``batchsize`` samples into lists, without collating."""
        return self.compose(filters.batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Any:
        """Split lists back into samples."""
        return self.compose(filters.unlisted())

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Shuffle samples in a buffer of ``size`` (no-op for ``size < 1``); seeded per epoch and reader by the loader."""
        if size < 1:
            return self
        return self.compose(filters.shuffle(size, **kw))

    def map(
        self, f: Callable[[Any], Any], handler: Callable[[BaseException], bool] = reraise_exception
    ) -> Any:
        """Apply ``f`` to each sample; ``None`` results are dropped."""
        return self.compose(filters.map(f, handler=handler))

    def decode(
        self,
        *args: Any,
        pre: Any = None,
        post: Any = None,
        only: Any = None,
        partial: bool = False,
        handler: Callable[[BaseException], bool] = reraise_exception,
    ) -> Any:
        """Decode fields with webdataset's handler strings (``"pil"``, ``"rgb8"``, ...) and functions."""
        return self.compose(
            filters.decode(*args, pre=pre, post=post, only=only, partial=partial, handler=handler)
        )

    def map_dict(
        self, handler: Callable[[BaseException], bool] = reraise_exception, **kw: Any
    ) -> Any:
        """Apply ``kw[field]`` to each named field."""
        return self.compose(filters.map_dict(handler=handler, **kw))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep the samples for which ``predicate`` is true."""
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self, *args: Any, **kw: Any) -> Any:
        """Dict samples -> tuples of fields; ``"jpg;png"`` takes the first present, ``"jpg cls"`` two fields."""
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(
        self, *args: Any, handler: Callable[[BaseException], bool] = reraise_exception
    ) -> Any:
        """Apply ``args[i]`` to element ``i`` of tuple samples."""
        return self.compose(filters.map_tuple(*args, handler=handler))

    def slice(self, *args: Any) -> Any:
        """``itertools.islice`` of the stream (per reader)."""
        return self.compose(filters.slice(*args))

    def rename(self, **kw: Any) -> Any:
        """``rename(image="jpg;png")``: new field from the first present old one."""
        return self.compose(filters.rename(**kw))

    def rsample(self, p: float = 0.5) -> Any:
        """Keep each sample with probability ``p``."""
        return self.compose(filters.rsample(p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        """Rename fields by glob patterns."""
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self, *args: Any, **kw: Any) -> Any:
        """Dict samples -> tuples of the fields matching glob patterns."""
        return self.compose(filters.extract_keys(*args, **kw))

    def mcached(self) -> Any:
        """Cache the samples in memory after the first pass."""
        return self.compose(filters.Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Record the first whole pass in an LMDB database and replay it (``filters.LMDBCached``)."""
        return self.compose(filters.LMDBCached(*args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        """Decode by glob patterns of field names."""
        return self.compose(filters.xdecode(*args, **kw))


class _Stages:
    """The stage list, kept out of the DataPipe graph's traversal.

    torch's graph traversal pickles every list attribute of a DataPipe while it looks for
    child DataPipes; a list of user stages with lambdas would fail there. The DataPipes built
    from the stages carry what the graph needs.
    """

    def __init__(self, items: list[Any]) -> None:
        self.items = items


class DataPipeline(FluidInterface, PassThrough):  # type: ignore[misc]  # webdataset's map/shuffle
    """A pipeline of webdataset stages, built as a shardpipes DataPipe graph.

    To the loader it is one-to-one over its graph (or over the repetition that ``with_epoch``
    and ``repeat`` put around it), so a pipeline over an indexed dataset keeps its exact length
    and resumes by seeking.

    ``DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker,
    wds.tarfile_to_samples(), wds.shuffle(1000), wds.decode("pil"), wds.to_tuple("jpg", "cls"))``
    is a DataPipe whose ``sharding_filter`` the loader applies with rank and worker; iterate it
    directly, or give it to :class:`~shardpipes.webdataset.WebLoader` or ``DataLoader2``.

    Args:
        *args: The stages: a source first (a shard list, a list, a DataPipe or an iterable), then
            stage functions (``f(iterator) -> iterator``), ``PipelineStage`` objects, lists of stages.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        stages: list[Any] = []
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                stages.extend(arg)
            else:
                stages.append(arg)
        self._stages = _Stages(stages)
        self.repetitions = 1
        self.nsamples = -1
        self.size: int | None = None
        self.graph, self.sharder = _graph.build(self.pipeline)
        self._wrap()

    def _wrap(self) -> None:
        # The one child the loader walks to: the graph, or (with_epoch, repeat) a stage that
        # iterates it again and again, which the loader knows is not one-to-one.
        graph = self.graph
        self.source_datapipe = (
            graph
            if graph is None or self.repetitions == 1
            else _graph.RepeatEpochs(graph, self.repetitions, self.nsamples)
        )

    @property
    def pipeline(self) -> list[Any]:
        """The stages as given (the DataPipe graph was built from them)."""
        return self._stages.items

    def append(self, f: Any) -> None:
        """Add a stage in place (used while constructing)."""
        self.pipeline.append(f)
        self.graph, self.sharder = _graph.build([f], self.graph, self.sharder)
        self._wrap()

    def compose(self, *args: Any) -> Any:
        """A copy of this pipeline with ``args`` appended."""
        result = object.__new__(type(self))
        result.__dict__.update(self.__dict__)
        result._stages = _Stages([*self.pipeline, *args])
        result.graph, result.sharder = _graph.build(args, self.graph, self.sharder)
        result._wrap()
        return result

    def stage(self, i: int) -> Any:
        """Stage ``i`` as given."""
        return self.pipeline[i]

    def close(self) -> None:
        """Close the stages that can be closed."""
        for step in self.pipeline:
            if hasattr(step, "close"):
                step.close()

    def __iter__(self) -> Iterator[Any]:
        if self.source_datapipe is not None:
            yield from self.source_datapipe

    def __len__(self) -> int:
        if self.size is None:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.size

    def with_length(self, n: int, silent: bool = False) -> Any:
        """Set ``len()`` to ``n`` (it does not change the number of samples)."""
        if not silent:
            warnings.warn(
                ".with_length() only sets the value of __len__ for compatibility with some "
                "training environments. It does not change the number of samples in an epoch.",
                ShardpipesWarning,
                stacklevel=2,
            )
        self.size = n
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Any:
        """Make an epoch exactly ``nsamples`` items per reader, repeating the data as needed."""
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        self._wrap()
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Any:
        """Repeat the data ``nepochs`` times (for ever if ``nepochs <= 0``), at most ``nbatches`` items."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        self._wrap()
        return self
