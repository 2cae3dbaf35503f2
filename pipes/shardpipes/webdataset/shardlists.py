"""Shard lists and splitters with webdataset's names.

``SimpleShardList`` and ``ResampledShards`` yield ``{"url": ...}`` as webdataset's do. Inside a
``DataPipeline`` (and in ``WebDataset``), ``split_by_node``, ``split_by_worker`` and
``single_node_only`` all mark one place: where the graph's ``sharding_filter`` goes. The
loader then splits by rank and worker together, so none of them is needed, and leaving them
out no longer reads every shard in every worker: the split is put in front of the tar reader
when a pipeline has none.
"""

from __future__ import annotations

import os
import random
import re
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from shardpipes.datapipes.iter import IterableWrapper, ShardExpander
from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.webdataset import utils
from shardpipes.webdataset.filters import pipelinefilter

__all__ = [
    "ResampledShards",
    "SimpleShardList",
    "expand_urls",
    "non_empty",
    "resampled",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
]


def _envsubst(s: str) -> str:
    """Substitute ``${name}`` with the environment variable ``WDS_name``, as webdataset does."""

    def lookup(m: re.Match[str]) -> str:
        key = "WDS_" + m.group(1)
        if key not in os.environ:
            raise ValueError(f"{s}: environment variable {key} is not set")
        return os.environ[key]

    return re.sub(r"\$\{(\w+)\}", lookup, s)


def expand_urls(urls: str) -> list[str]:
    """Split on ``::``, substitute ``${WDS_...}`` variables and expand braces, as webdataset does."""
    result: list[str] = []
    for url in urls.split("::"):
        for _ in range(10):
            last, url = url, _envsubst(url)
            if url == last:
                break
        result.extend(ShardExpander(IterableWrapper([url])))
    return result


def _expand_source(source: Any, max_urls: int = int(1e9)) -> list[str]:
    if isinstance(source, str):
        return expand_urls(source)
    if isinstance(source, list):
        return [u for s in source for u in (expand_urls(s) if isinstance(s, str) else [s])]
    if utils.is_iterable(source):
        return list(islice(source, max_urls))
    raise ValueError(f"cannot handle {type(source)}")


def split_by_node(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Keep every ``world_size``-th item from ``rank`` on (a marker inside a pipeline: see the module doc)."""
    rank, world, _, _ = utils.pytorch_worker_info(group=group)
    yield from islice(src, rank, None, world) if world > 1 else src


def single_node_only(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Webdataset's default node splitter; in a shardpipes pipeline it marks the automatic split."""
    yield from split_by_node(src, group)


def split_by_worker(src: Iterable[Any]) -> Iterator[Any]:
    """Keep every ``num_workers``-th item from ``worker`` on (a marker inside a pipeline)."""
    _, _, worker, workers = utils.pytorch_worker_info()
    yield from islice(src, worker, None, workers) if workers > 1 else src


SPLITTERS = (split_by_node, split_by_worker, single_node_only)


class SimpleShardList(StageIterDataPipe[dict[str, str]]):
    """The shard URLs (a list, or a brace pattern such as ``"train-{000..009}.tar"``) as ``{"url": u}``.

    Args:
        urls: URLs, or one string with braces and ``::`` separators.
        seed: Shuffle the list with this seed once per iteration (``None``: keep the order).
    """

    def __init__(self, urls: Any, seed: Any = None) -> None:
        self.urls = expand_urls(urls) if isinstance(urls, str) else _expand_source(list(urls))
        if not self.urls or not isinstance(self.urls[0], str):
            raise ValueError(f"SimpleShardList needs at least one URL string, got {urls!r}")
        self.seed = seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for url in urls:
            yield {"url": url}


class ResampledShards(StageIterDataPipe[dict[str, str]]):
    """An endless stream of shard URLs ``{"url": u}``: every pass is a fresh permutation of all shards.

    webdataset draws each shard at random *with* replacement, so in a pass some shards come
    twice and others never; here each pass over the list holds every shard once, in an order
    seeded from the loader (the same on every rank, new each epoch), and the graph's split
    then gives every reader its own shards.

    Args:
        urls: URLs or a brace pattern.
        nshards: Stop after this many. Default: endless.
        seed: Seed when iterated without a shardpipes loader. Default: ``0``.
        worker_seed: Accepted for webdataset compatibility; the loader seeds.
        deterministic: Accepted for webdataset compatibility; always deterministic.
        max_urls: Most URLs taken from an iterable ``urls``.
        empty_check: Raise ``ValueError`` for an empty list.
    """

    def __init__(
        self,
        urls: Any,
        nshards: int = sys.maxsize,
        seed: int = 0,
        worker_seed: Any = None,
        deterministic: bool = False,
        max_urls: int = int(1e6),
        empty_check: bool = True,
    ) -> None:
        self.urls = _expand_source(urls, max_urls)
        if not self.urls and empty_check:
            raise ValueError("empty_check=True, but no shards found in ResampledShards")
        self.nshards = nshards
        self.seed = seed
        self.deterministic = deterministic
        self._loader_seed: int | None = None
        self.epoch = -1

    def set_seed(self, seed: int) -> ResampledShards:
        """Called by the loader each epoch (the same seed on every rank and worker)."""
        self._loader_seed = seed
        return self

    def __iter__(self) -> Iterator[dict[str, str]]:
        self.epoch += 1
        seed = self._loader_seed
        if seed is None:
            seed = utils.make_seed(self.seed, self.epoch)
        if not self.urls:
            return
        count = 0
        for p in range(sys.maxsize):
            order = list(self.urls)
            random.Random(utils.make_seed(seed, p)).shuffle(order)
            for url in order:
                if count >= self.nshards:
                    return
                count += 1
                yield {"url": url}


def resampled_(src: Iterable[Any], n: int = sys.maxsize) -> Iterator[Any]:
    """Draw ``n`` items from ``src`` at random with replacement (webdataset's ``resampled``)."""
    items = list(src)
    rng = random.Random(utils.make_seed(len(items), n))
    for _ in range(n):
        yield rng.choice(items)


resampled = pipelinefilter(resampled_)


def non_empty(src: Iterable[Any]) -> Iterator[Any]:
    """Pass ``src`` through; raise ``ValueError`` if it was empty."""
    count = 0
    for s in src:
        yield s
        count += 1
    if count == 0:
        raise ValueError("pipeline stage received no data at all and this was declared as an error")


def shardspec(spec: Any) -> SimpleShardList:
    """A shard list from a URL pattern or a list (webdataset's ``shardspec``, without its YAML form)."""
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")):
        raise ValueError(
            f"{spec}: YAML dataset specifications are not supported by shardpipes.webdataset"
        )
    return SimpleShardList(spec)
