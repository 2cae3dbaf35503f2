"""wids compatibility: ``ShardListDataset`` (random access by sample) and the chunked samplers.

``dataset[i]`` finds the shard and the sample's byte span in the shardpipes index
(:mod:`shardpipes.index`: a ``shardpipes index`` sidecar when there is one, else each shard is
scanned once, on first use) and reads just that span: a ``seek`` for local shards, one ranged
request for remote ones (:func:`shardpipes.index.open_range`), or a local copy when
``cache_dir`` is given. Samples are wids samples: ``{"__key__", ".jpg": stream, ...}``
decoded by ``transformations`` (default ``"PIL"``, as wids).
"""

from __future__ import annotations

import io
import json
import math
import os
import posixpath
import random
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, cast

import numpy as np
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats.decoders import decoders
from shardpipes.formats.tarparse import iter_tar
from shardpipes.index import ShardIndex, ShardInfo, find_index, index_shard
from shardpipes.storage.open import open_text
from shardpipes.storage.ranges import read_range
from shardpipes.storage.source import Source, resolve

__all__ = [
    "ChunkedSampler",
    "DistributedChunkedSampler",
    "ShardListDataset",
    "ShardListSampler",
    "default_decoder",
]


# The registry's decoders for the extensions wids decodes by default (never a pickle).
_BASIC = decoders(("txt", "text", "cls", "cls2", "json", "npy"))


def _decode_basic(key: str, value: bytes) -> Any:
    parts = key.split(".")
    ext = parts[-1].lower()
    if ext == "gz" and len(parts) >= 3:
        ext = parts[-2].lower()
    fn = _BASIC.get(ext)
    return fn(value) if fn is not None else None


_IMAGE_EXTS = ("jpg", "png", "ppm", "pgm", "pbm", "pnm")


def default_decoder(sample: dict[str, Any], format: Any = True) -> dict[str, Any]:
    """Decode as wids does by default.

    ``.gz`` fields are decompressed, text/cls/json/npy decoded, images opened with PIL (``format="PIL"``) or as arrays (``format="numpy"``); other fields stay streams.
    Never unpickles.
    """
    import gzip

    import PIL.Image

    result = dict(sample)
    for key, value in list(result.items()):
        if key.startswith("__"):
            continue
        if not key.startswith("."):
            raise ValueError(f"Key {key} must start with a dot")
        data = value.read() if hasattr(value, "read") else value
        parts = key.split(".")
        if parts[-1].lower() == "gz" and len(parts) >= 3:
            data = gzip.decompress(data)
        decoded = _decode_basic(key, data)
        if decoded is None and parts[-1].lower() in _IMAGE_EXTS and format in ("PIL", "numpy"):
            img = PIL.Image.open(io.BytesIO(data))
            decoded = img if format == "PIL" else np.asarray(img)
        result[key] = decoded if decoded is not None else io.BytesIO(data)
    return result


class _Decode:
    def __init__(self, format: str) -> None:
        self.format = format

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return default_decoder(sample, self.format)


def _transformations(spec: Any) -> list[Callable[[Any], Any]]:
    specs = spec if isinstance(spec, list) else [spec]
    out: list[Callable[[Any], Any]] = []
    for t in specs:
        if t in ("PIL", "numpy"):
            out.append(_Decode(t))
        elif t is None:
            continue
        elif callable(t):
            out.append(t)
        else:
            raise ValueError(f"transformation {t!r} is neither 'PIL', 'numpy' nor a callable")
    return out


def _urldir(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/" if "/" in url else ""


def _load_descriptor(
    source: Any,
    base: str | None,
    options: dict[str, Any],
    storage_options: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], str | None]:
    if isinstance(source, str):
        with open_text(source, storage_options) as f:
            spec = json.load(f)
        base = base if base is not None else _urldir(source)
    else:
        spec = json.load(source)
    spec.update(options)
    if "shardlist" not in spec and "shards" in spec and isinstance(source, str):
        # A shardpipes index file: the same information, plus the sample offsets.
        idx = ShardIndex.load(source, storage_options=storage_options)
        spec["shardlist"] = [{"url": s.url, "nsamples": s.num_samples} for s in idx.shards]
        spec["_index"] = idx
        return spec, None
    for shard in spec.get("shardlist", []):
        url = shard["url"]
        if base and "://" not in url and not os.path.isabs(url):
            shard["url"] = posixpath.join(base, url) if "://" in base else os.path.join(base, url)
    return spec, base


class ShardListDataset(Dataset[dict[str, Any]]):
    """wids' indexable dataset over tar shards: ``len()``, ``dataset[i]``, ``add_transform``.

    Args:
        shards: A list of ``{"url": ..., "nsamples": ...}``, or the URL (or open file) of a
            wids descriptor (``{"shardlist": [...]}``) or of a ``shardpipes index`` file.
        cache_dir: Copy whole shards here on first use and read the copies (``on_disk_cache``);
            default: read sample spans in place (seeks, ranged requests).
        cache_size: Bytes the cache directory may hold.
        lru_size: Shards whose per-sample offsets stay in memory.
        transformations: ``"PIL"`` (default), ``"numpy"``, a callable or a list of them.
        base: Folder or URL prefix for relative shard URLs of a descriptor.
        options: Entries overriding the descriptor's.
        storage_options: fsspec options (endpoint, credentials) for the descriptor, its index
            and the shards.

    Raises:
        ValueError: An empty shard list, or a shard whose sample count differs from ``nsamples``.
        IndexError: ``dataset[i]`` with ``i`` outside ``[-len, len)``.
    """

    def __init__(
        self,
        shards: Any,
        *,
        cache_size: int = int(1e12),
        cache_dir: str | None = None,
        lru_size: int = 10,
        dataset_name: str | None = None,
        localname: Any = None,
        transformations: Any = "PIL",
        keep: bool = False,
        base: str | None = None,
        options: dict[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._index: ShardIndex | None = None
        if isinstance(shards, str | io.IOBase):
            self.spec, self.base = _load_descriptor(
                shards, base, dict(options or {}), storage_options
            )
            self._index = self.spec.pop("_index", None)
            self.shards = self.spec.get("shardlist", [])
            self.dataset_name = self.spec.get("name") or str(shards)
        else:
            self.spec, self.base = dict(options or {}), None
            self.shards = list(shards)
            self.dataset_name = dataset_name or "dataset"
        if not self.shards:
            raise ValueError(f"ShardListDataset: no shards in {shards!r}")
        self.lengths = [int(s["nsamples"]) for s in self.shards]
        self.cum_lengths = np.cumsum(self.lengths)
        self.total_length = int(self.cum_lengths[-1])
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.lru_size = lru_size
        self.storage_options = storage_options
        self.transformations = _transformations(transformations)
        self._infos: OrderedDict[str, tuple[Source, ShardInfo]] = OrderedDict()
        self._sidecar: ShardIndex | bool | None = None
        self.accesses = 0
        self.misses = 0

    def add_transform(self, transform: Callable[[Any], Any]) -> ShardListDataset:
        """Append a transformation applied to every sample; returns the dataset."""
        self.transformations.append(transform)
        return self

    def __len__(self) -> int:
        return self.total_length

    def get_stats(self) -> tuple[int, int]:
        """``(accesses, misses)`` of the in-memory shard-offset cache."""
        return self.accesses, self.misses

    def _sidecar_index(self) -> ShardIndex | None:
        if self._index is not None:
            return self._index
        if self._sidecar is None:
            urls = [s["url"] for s in self.shards]
            try:
                found = find_index(urls, storage_options=self.storage_options)
            except ValueError:
                found = None
            self._sidecar = (
                ShardIndex.load(found, storage_options=self.storage_options) if found else False
            )
        return self._sidecar if isinstance(self._sidecar, ShardIndex) else None

    def _shard(self, url: str, expected: int) -> tuple[Source, ShardInfo]:
        self.accesses += 1
        hit = self._infos.get(url)
        if hit is not None:
            self._infos.move_to_end(url)
            return hit
        self.misses += 1
        read_url = url
        if self.cache_dir is not None:
            [read_url] = list(
                IterableWrapper([url]).on_disk_cache(
                    self.cache_dir, max_bytes=self.cache_size, storage_options=self.storage_options
                )
            )
        idx = self._sidecar_index()
        info = None
        if idx is not None:
            try:
                info = idx.shards[idx.lookup(url)]
            except KeyError:
                info = None
        if info is None:
            info = index_shard(read_url, storage_options=self.storage_options)
        if info.num_samples != expected:
            raise ValueError(
                f"{url}: the shard has {info.num_samples} samples, the shard list says {expected}"
            )
        # Resolved once per shard: every sample read of it goes to the same filesystem.
        self._infos[url] = hit = (resolve(read_url, self.storage_options), info)
        while len(self._infos) > self.lru_size:
            self._infos.popitem(last=False)
        return hit

    def get_shard(self, index: int) -> tuple[str, int, dict[str, Any]]:
        """``(shard URL, index in the shard, shard descriptor)`` of sample ``index``."""
        shard_idx = int(np.searchsorted(self.cum_lengths, index, side="right"))
        inner = index - (int(self.cum_lengths[shard_idx - 1]) if shard_idx else 0)
        desc = self.shards[shard_idx]
        return desc["url"], inner, desc

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += self.total_length
        if not 0 <= index < self.total_length:
            raise IndexError(f"index {index} is outside [0, {self.total_length})")
        url, inner, desc = self.get_shard(index)
        source, info = self._shard(url, int(desc["nsamples"]))
        offset, size = info.byte_range(inner, inner + 1)
        stream = read_range(source, offset, size)
        sample: dict[str, Any] = {}
        try:
            for entry in iter_tar(
                cast(IO[bytes], stream), url, require_end=False, start_offset=offset
            ):
                name = entry.name.rsplit("/", 1)
                dot = name[-1].find(".")
                key = entry.name[: len(entry.name) - len(name[-1]) + dot]
                sample.setdefault("__key__", key)
                sample[name[-1][dot:]] = io.BytesIO(entry.data.getvalue())
        finally:
            stream.close()
        sample["__dataset__"] = desc.get("dataset")
        sample["__index__"] = index
        sample["__shard__"] = url
        sample["__shardindex__"] = inner
        for transform in self.transformations:
            sample = transform(sample)
        return sample

    def close(self) -> None:
        """Forget the cached shard offsets."""
        self._infos.clear()


def _ranges(lengths: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in lengths:
        out.append((start, start + n))
        start += n
    return out


def _iterate_ranges(
    ranges: list[tuple[int, int]],
    rng: random.Random,
    indexshuffle: bool = True,
    shardshuffle: bool = True,
) -> Iterator[int]:
    order = list(range(len(ranges)))
    if shardshuffle:
        rng.shuffle(order)
    for i in order:
        lo, hi = ranges[i]
        idx = list(range(lo, hi))
        if indexshuffle:
            rng.shuffle(idx)
        yield from idx


def _epoch_rng(seed: int, epoch: int) -> random.Random:
    return random.Random(seed + 1289738273 * epoch)  # wids' formula: the same orders as wids


class ShardListSampler(Sampler[int]):
    """Shards in random order, samples shuffled within each shard (wids' ``ShardListSampler``)."""

    def __init__(
        self,
        dataset: Any,
        *,
        lengths: list[int] | None = None,
        seed: int = 0,
        shufflefirst: bool = False,
    ) -> None:
        self.ranges = _ranges(list(dataset.lengths) if lengths is None else lengths)
        self.seed = seed
        self.shufflefirst = shufflefirst
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        rng = _epoch_rng(self.seed, self.epoch)
        yield from _iterate_ranges(
            self.ranges, rng, shardshuffle=self.shufflefirst or self.epoch > 0
        )
        self.epoch += 1


class ChunkedSampler(Sampler[int]):
    """Chunks of ``chunksize`` consecutive indexes in random order, shuffled within (wids' sampler).

    Args:
        dataset: Anything with ``len()``.
        num_samples: ``n`` (indexes ``0..n``) or ``(lo, hi)``. Default: the whole dataset.
        chunksize: Indexes per chunk. Default: ``2000``.
        seed: Seed; the order changes with :meth:`set_epoch` (or each iteration).
        shuffle: Shuffle at all. Default: ``True``.
        shufflefirst: Shuffle the chunk order in epoch 0 too.
        pad_to: Yield exactly this many indexes, repeating from the start (used by
            :func:`DistributedChunkedSampler` for equal ranks).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        dslength_per_replica: int = -1,
        num_samples: Any = None,
        chunksize: int = 2000,
        seed: int = 0,
        shuffle: bool = True,
        shufflefirst: bool = False,
        pad_to: int | None = None,
    ) -> None:
        if isinstance(num_samples, int):
            lo, hi = 0, num_samples
        elif num_samples is None:
            lo, hi = 0, len(dataset)
        else:
            lo, hi = num_samples
        self.dslength_per_replica = dslength_per_replica if dslength_per_replica > 0 else (hi - lo)
        self.ranges = [(i, min(i + chunksize, hi)) for i in range(lo, hi, chunksize)]
        self.seed = seed
        self.shuffle = shuffle
        self.shufflefirst = shufflefirst
        self.pad_to = pad_to
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        rng = _epoch_rng(self.seed, self.epoch)
        first = self.shufflefirst or self.epoch > 0
        order = list(
            _iterate_ranges(
                self.ranges, rng, indexshuffle=self.shuffle, shardshuffle=self.shuffle and first
            )
        )
        if self.pad_to is not None and order and len(order) < self.pad_to:
            order += [order[i % len(order)] for i in range(self.pad_to - len(order))]
        yield from order
        self.epoch += 1

    def __len__(self) -> int:
        return self.dslength_per_replica


def DistributedChunkedSampler(
    dataset: Any,
    *,
    num_replicas: int | None = None,
    num_samples: int | None = None,
    rank: int | None = None,
    shuffle: bool = True,
    shufflefirst: bool = False,
    seed: int = 0,
    drop_last: bool | None = None,
    chunksize: int = 1000000,
) -> ChunkedSampler:
    """A :class:`ChunkedSampler` over this rank's contiguous part of the dataset.

    Every rank yields exactly ``ceil(n / num_replicas)`` indexes: a short last part repeats
    its own first indexes (wids gives the last rank fewer, which hangs DDP at the epoch's end).
    """
    if drop_last is not None:
        warnings.warn(
            "DistributedChunkedSampler does not support drop_last, thus it will be ignored",
            stacklevel=2,
        )
    if dist.is_available() and dist.is_initialized():
        num_replicas = num_replicas if num_replicas is not None else dist.get_world_size()
        rank = rank if rank is not None else dist.get_rank()
    else:
        num_replicas = num_replicas or 1
        rank = rank or 0
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank ({rank}) should be in [0, num_replicas={num_replicas})")
    n = num_samples or len(dataset)
    per = math.ceil(n / num_replicas)
    start = rank * per
    end = min(start + per, n)
    if start >= end:  # more ranks than samples: borrow from the start
        start, end = 0, min(per, n)
    return ChunkedSampler(
        dataset,
        dslength_per_replica=per,
        num_samples=(start, end),
        chunksize=chunksize,
        seed=seed,
        shuffle=shuffle,
        shufflefirst=shufflefirst,
        pad_to=per,
    )
