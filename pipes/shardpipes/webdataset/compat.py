"""``WebDataset`` and ``FluidWrapper``: webdataset's dataset classes over the shardpipes graph."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from shardpipes.errors import ShardingWarning, ShardpipesWarning
from shardpipes.index import find_index
from shardpipes.webdataset import _graph, filters, shardlists
from shardpipes.webdataset.handlers import reraise_exception
from shardpipes.webdataset.pipeline import DataPipeline, FluidInterface

__all__ = ["FluidInterface", "FluidWrapper", "WebDataset"]


def pipe_cleaner(spec: str) -> str:
    """Webdataset's URL-to-cache-name rule (accepted; the shardpipes cache names entries itself)."""
    return spec


class WebDataset(DataPipeline):
    """webdataset's ``WebDataset(urls, ...)``: shard list -> shard shuffle -> split -> tar -> samples.

    The graph is ``SimpleShardList(urls)`` (or ``ResampledShards`` with ``resampled=True``), a
    seeded shard shuffle (``shardshuffle``), one ``sharding_filter``, the shardpipes reader
    (``open_files_by_fsspec -> load_from_tar -> webdataset``) and a conversion to webdataset's
    samples (``{"__key__", "__url__", "jpg": bytes, ...}``). The split by rank and worker is
    done by the loader whatever ``nodesplitter``/``workersplitter`` say, so multi-node needs
    no splitter; the shard shuffle runs before the split with the same seed on every reader,
    a new order each epoch.

    Args:
        urls: Shard URLs, or a brace pattern (``"s3://b/train-{000000..000127}.tar"``).
        handler: webdataset error handler for read and format errors. Default: ``reraise_exception``.
        resampled: An endless stream of shards (a fresh permutation per pass); cut epochs with
            ``with_epoch(n)``.
        shardshuffle: Shard shuffle buffer (``True`` = 100); ``None``/``False``/``0``: none.
        cache_dir: Keep downloaded shards here (``on_disk_cache``); ``cache_size`` bytes at most.
        nodesplitter: Accepted; the split is automatic (see above). A splitter function that is
            not one of webdataset's is ignored with a warning.
        workersplitter: As ``nodesplitter``.
        select_files: Keep the tar members whose name this function accepts.
        rename_files: Rename tar members (a function of the name) before grouping.
        empty_check: Raise if a dataset read by one reader yields nothing. Default: ``True``.
        detshuffle: Seed the shard shuffle with ``seed`` + epoch when iterated without a loader.
        seed: Seed of the shard shuffle; ``WebLoader`` uses it as the loader seed.
        index: A shardpipes index (its URL or a ``ShardIndex``) to split the samples exactly:
            every reader gets the same number of samples and each epoch reads every sample
            once (``sharding_by_index``). Default (``None``): the sidecar that ``shardpipes
            index`` writes next to the shards, if there is one; ``False``: split by shards.
        storage_options: fsspec options (endpoint, credentials) for the shards.
    """

    def __init__(
        self,
        urls: Any,
        handler: Callable[[BaseException], bool] = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: Any = None,
        cache_size: int = -1,
        cache_dir: str | None = None,
        url_to_name: Callable[[str], str] = pipe_cleaner,
        detshuffle: bool = False,
        nodesplitter: Any = shardlists.single_node_only,
        workersplitter: Any = shardlists.split_by_worker,
        select_files: Any = None,
        rename_files: Any = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: Any = None,
        storage_options: Any = None,
        index: Any = None,
    ) -> None:
        super().__init__()
        if resampled:
            mode = "resampled"
        for name, splitter in (("nodesplitter", nodesplitter), ("workersplitter", workersplitter)):
            if splitter not in (None, False, *shardlists.SPLITTERS):
                warnings.warn(
                    f"WebDataset({name}={getattr(splitter, '__name__', splitter)}) is ignored: "
                    "shardpipes splits shards by rank and worker itself",
                    ShardingWarning,
                    stacklevel=2,
                )
        if shardshuffle is True:
            shardshuffle = 100
        if mode == "resampled" and shardshuffle not in (None, False, 0):
            warnings.warn(
                "WebDataset(shardshuffle=...) is ignored for resampled datasets",
                ShardpipesWarning,
                stacklevel=2,
            )
            shardshuffle = None
        env_seed = os.environ.get("WDS_SEED")
        if seed is None and env_seed is not None:
            seed = int(env_seed)
        self.seed = seed
        cache_size = int(os.environ.get("WDS_CACHE_SIZE", cache_size))
        cache_dir = os.environ.get("WDS_CACHE", cache_dir)
        if cache_dir is not None:
            cache_dir = os.path.expanduser(cache_dir)
            if not os.path.exists(cache_dir):
                raise ValueError(f"cache directory {cache_dir} does not exist")
        if isinstance(urls, str) and urls.endswith(".json"):
            raise ValueError(
                f"{urls}: a wids descriptor; use shardpipes.webdataset.wids.ShardListDataset for it"
            )
        if mode == "resampled":
            self.append(shardlists.ResampledShards(urls))
        else:
            self.append(shardlists.SimpleShardList(urls))
            if repeat:
                self.append(filters.FilterFunction(_cycle))
        if shardshuffle:
            self.append(
                filters.detshuffle(int(shardshuffle), seed=seed or 0)
                if detshuffle
                else filters.shuffle(int(shardshuffle), seed=seed if seed is not None else 0)
            )
        if index is None and mode != "resampled" and not repeat:
            index = _sidecar(self.pipeline[0].urls, storage_options)
        if index not in (None, False) and mode != "resampled" and not repeat:
            self.append(_graph.IndexSplit(index, storage_options))
        self.append(shardlists.split_by_node)
        self.append(
            _graph.TarfileToSamples(
                handler,
                select_files,
                rename_files,
                cache_dir=cache_dir,
                cache_size=cache_size,
                storage_options=storage_options,
            )
        )
        if empty_check and self.graph is not None:
            self.graph = _graph.EmptyCheck(self.graph, self.sharder)
            self._wrap()

    def __enter__(self) -> WebDataset:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()


def _sidecar(urls: list[str], storage_options: Any) -> str | None:
    """The ``shardpipes index`` sidecar of ``urls``, if it exists (local or remote)."""
    try:
        return find_index(urls, storage_options=storage_options)
    except (ValueError, OSError):
        return None


def _cycle(src: Any) -> Any:
    items = list(src)
    while items:
        yield from items


class FluidWrapper(DataPipeline, FluidInterface):  # type: ignore[misc]  # webdataset's map/shuffle
    """Give any iterable (or DataPipe) webdataset's chainable methods."""

    def __init__(self, initial: Any) -> None:
        super().__init__(initial)
