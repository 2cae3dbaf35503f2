"""The pipelines measured, one per peer, all doing the same logical work.

list -> open -> tar -> group by key -> decode ``.cls`` (int) and ``.json`` (object), ``.bin``
stays bytes -> shuffle (buffer 1000) -> batch 64, each batch a plain ``list`` of sample dicts.
``workers=0`` runs in the calling process; ``workers>0`` uses the peer's own multi-process loader.

Imports happen inside the functions: this module is loaded in interpreters that have only some
of the libraries (torchdata 0.9 and shardpipes register the same DataPipe names and can never
share a process). Every callable handed to a worker is a module-level function so it pickles.

Peer, in-process / with workers, and what a batch is:

- ``shardpipes``: the graph iterated directly / ``shardpipes.dataloader2.DataLoader2`` with
  ``MultiProcessingReadingService(num_workers)`` (torch ``DataLoader(batch_size=None)`` if that
  module does not import). ``.batch(64)`` yields lists.
- ``shardpipes_dl2``: the same graph run by ``DataLoader2()`` in-process (its own copy of the
  graph, where shardpipes swaps torch's hooked ``shuffle``/``batch`` for lean equivalents).
- ``shardpipes_idx``: the same graph with the index (``sharding_by_index`` for
  ``sharding_filter``), run by ``DataLoader2`` in-process or with workers.
- ``torchdata09``: the same graph with torchdata 0.9's DataPipes (decode is a ``map`` over
  ``(path, stream)`` members before ``.webdataset()``, as torchdata's docs show) / torchdata 0.9
  ``DataLoader2`` + ``MultiProcessingReadingService`` (which fails on this data: see
  ``torchdata09_dl``, the same graph under torch's ``DataLoader``). ``.batch(64)`` yields lists.
- ``webdataset``: ``wds.WebDataset(urls, shardshuffle=False).decode().shuffle(1000)
  .batched(64, collation_fn=None)`` iterated directly / ``wds.WebLoader(ds, batch_size=None,
  num_workers=N)`` (shards split by worker, webdataset's default). ``collation_fn=None`` gives
  lists; webdataset's default collation would build a dict of columns instead.
- ``wids``: ``wids.ShardListDataset(descriptor)`` (shards opened in place, ``lru_size`` = number
  of shards) with ``default_decoder``'s basic decoding (see ``wids_decode``) + ``ChunkedSampler(chunksize=1000)`` (shuffles within
  chunks of 1000 indices: wids' counterpart of a 1000-sample buffer) and torch ``DataLoader
  (batch_size=64, collate_fn=list)``, with ``num_workers`` 0 or N.
- ``litdata``, ``mosaic``, ``energon``, ``dali``: see ``_peers_native.py`` (their own formats,
  the per-sample work of ``_work.py``).
- ``shardpipes_fused`` (jpeg preset): the shardpipes graph with ``decode_random_resized_crop``
  in place of the shared transform; ``shardpipes_fused_t2`` the same decoding in 2 threads.
- On the ``jpeg`` preset every Python peer runs ``_work.jpeg_item`` (decode + the ImageNet
  training transform) after its shuffle and before batching.
- ``tarfile``: Python's ``tarfile`` in stream mode reading every member's bytes (and counting
  keys), nothing else: the floor of any tarfile-based loader. In-process only.
- ``cat``: ``cat`` of the shard files to ``/dev/null``: the I/O limit. Handled by the runner.
- ``floor``: the item function (``_work.bytes_item`` / ``jpeg_item``) alone, over the preset's
  samples already in memory (read from the tars before the clock starts, in a fixed shuffled
  order; ``.json``/``.bin``/``.jpg`` as ``memoryview`` as LitData hands them, so the item
  function copies ``.bin`` once as every loader must; ``.cls`` as the tar's bytes), lists of 64
  made and dropped as the loaders' batches are. No reading, no loader: what any Python loader
  that runs this item function must at least spend. In-process only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

Made = tuple[Iterable[Any], Callable[[], None], str]


# --- functions that cross into worker processes: module level ---------------------------------


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def same_path(url: str) -> str:
    return url


def wids_decode(sample: dict) -> dict:
    """wids' ``default_decoder`` without its image step (which imports Pillow unconditionally).

    wids hands out fields as ``BytesIO`` streams; the undecoded ones become ``bytes`` here, as
    every other peer yields them (``getvalue`` shares the buffer: no copy).
    """
    import io

    from wids.wids_decode import decode_all_gz, decode_basic

    sample = decode_basic(decode_all_gz(dict(sample), update_key=False))
    for k, v in sample.items():
        if isinstance(v, io.BytesIO):
            sample[k] = v.getvalue()
    return sample


def wds_gopen_fsspec(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """An ``s3://`` handler for webdataset's ``gopen``: fsspec (s3fs), as the other peers read."""
    import fsspec

    return fsspec.open(url, mode).open()


def td09_decode_member(item: tuple[str, Any]) -> tuple[str, Any]:
    path, stream = item
    data = stream.read()
    stream.close()
    if path.endswith(".cls"):
        return path, int(data)
    if path.endswith(".json"):
        return path, json.loads(data)
    return path, data


def mosaic_base() -> Any:
    """MosaicML streaming's ``streaming.base`` (MDSWriter, StreamingDataset), without torchvision.

    ``import streaming`` runs the package's ``__init__``, which re-exports ``streaming.vision``,
    which imports torchvision at import time. torchvision cannot load beside torch 2.13's CPU
    wheel here (the index's wheel links ``libtorch_cuda``: ``operator torchvision::nms does not
    exist`` on import), so the peers' venv does not keep it (``_venv.py``), and this loads the
    installed ``streaming`` package without running its ``__init__``: the package module is
    created from its real spec and ``streaming.base`` imported beneath it. Nothing is stubbed
    or replaced; the MDS reader and writer never touch torchvision (only ``streaming.vision``
    does), so what runs is Mosaic's own code, as with a working torchvision.
    """
    import importlib
    import importlib.util
    import types

    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError("mosaicml-streaming is not installed")
        pkg = types.ModuleType("streaming")
        pkg.__spec__ = spec
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        sys.modules["streaming"] = pkg
    return importlib.import_module("streaming.base")


def jpeg_item(sample: dict) -> dict:
    import _work

    return _work.jpeg_item(sample)


def _jpeg(m: dict) -> bool:
    return m.get("preset", {}).get("kind") == "jpeg"


# --- peers ------------------------------------------------------------------------------------


def _readme_graph(m: dict, cfg: dict, sharded: Any) -> Any:
    """The README graph over ``sharded`` (the shard list after its sharding stage)."""
    dp = (
        sharded.open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode(image=None)
        .shuffle(buffer_size=cfg["shuffle"])
    )
    if _jpeg(m):
        dp = dp.map(jpeg_item)  # after the shuffle: the buffer holds encoded images
    return dp.batch(cfg["batch"])


def shardpipes(m: dict, workers: int, cfg: dict) -> Made:
    from shardpipes.datapipes.iter import IterableWrapper

    dp = _readme_graph(m, cfg, IterableWrapper(m["paths"]).sharding_filter())
    if workers == 0:
        return dp, _nothing, "graph iterated directly"
    return _shardpipes_loader(dp, workers)


def _shardpipes_loader(dp: Any, workers: int) -> Made:
    try:
        from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
    except ImportError as exc:
        from torch.utils.data import DataLoader

        dl = DataLoader(dp, batch_size=None, num_workers=workers)
        return (
            dl,
            _nothing,
            f"torch DataLoader(batch_size=None, num_workers={workers}) [stand-in: {exc}]",
        )
    dl2 = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers))
    return dl2, dl2.shutdown, f"shardpipes DataLoader2 + MultiProcessingReadingService({workers})"


def _fused_graph(m: dict, cfg: dict, **crop: Any) -> Any:
    """The jpeg preset's shardpipes graph with ``decode_random_resized_crop(224, **crop)``."""
    from shardpipes.datapipes.iter import IterableWrapper

    return (
        IterableWrapper(m["paths"])
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode(image=None)
        .shuffle(buffer_size=cfg["shuffle"])
        .decode_random_resized_crop(224, **crop)
        .batch(cfg["batch"])
    )


def shardpipes_fused(m: dict, workers: int, cfg: dict, threads: int = 0) -> Made:
    """The jpeg preset with shardpipes' own crop-decode stage instead of the shared transform.

    ``.decode_random_resized_crop(224)`` (``shardpipes.formats.image``): the same ImageNet
    transform (random resized crop, flip, float tensor, normalise) fused with the decode.
    """
    if not _jpeg(m):
        raise ValueError("shardpipes_fused runs on the jpeg preset only (no images elsewhere)")
    dp = _fused_graph(m, cfg, threads=threads)
    if workers == 0:
        return (
            dp,
            _nothing,
            f"graph iterated directly, decode_random_resized_crop(threads={threads})",
        )
    return _shardpipes_loader(dp, workers)


class _NormaliseAfter:
    """Batches of uint8 crops from the workers, normalised here in the main process."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        import numpy as np
        import torch

        from shardpipes.formats.image import IMAGENET_MEAN, IMAGENET_STD, _affine

        scale, shift = _affine(IMAGENET_MEAN, IMAGENET_STD)
        for batch in self.loader:
            for s in batch:
                # in numpy, as the stage itself does: torch's ops would wake its thread pool
                out = np.multiply(s[".jpg"].numpy(), scale, dtype=np.float32)
                out += shift
                s[".jpg"] = torch.from_numpy(out)
            yield batch


def shardpipes_fused_u8(m: dict, workers: int, cfg: dict) -> Made:
    """``shardpipes_fused`` with workers sending uint8 crops; normalised in the main process.

    The same work as ``shardpipes_fused`` (the normalisation is done, and its CPU counted, in
    the main process), with a quarter of the bytes crossing between processes (150 KB per
    sample instead of 600 KB of float32).
    """
    if not _jpeg(m) or not workers:
        raise ValueError("shardpipes_fused_u8 is a workers row of the jpeg preset")
    dp = _fused_graph(m, cfg, mean=None, std=None)
    dl, close, what = _shardpipes_loader(dp, workers)
    return _NormaliseAfter(dl), close, what + ", uint8 crops normalised in the main process"


def shardpipes_fused_t2(m: dict, workers: int, cfg: dict) -> Made:
    """``shardpipes_fused`` decoding in 2 threads in-process (Pillow and torch release the GIL)."""
    if workers:
        raise ValueError("shardpipes_fused_t2 is an in-process row")
    return shardpipes_fused(m, 0, cfg, threads=2)


def shardpipes_dl2(m: dict, workers: int, cfg: dict) -> Made:
    """The same graph run by ``DataLoader2`` with its default in-process reading service.

    The loader runs its own copy of the graph, in which shardpipes may swap torch's hooked
    stages (``shuffle``, ``batch``) for lean equivalents: this row shows what that is worth
    next to iterating the user's graph directly.
    """
    if workers:
        raise ValueError("shardpipes_dl2 is the in-process DataLoader2 row; shardpipes has workers")
    from shardpipes.dataloader2 import DataLoader2

    dp, _, _ = shardpipes(m, 0, cfg)
    dl2 = DataLoader2(dp)
    return dl2, dl2.shutdown, "shardpipes DataLoader2 (default in-process reading service)"


def _index_path(m: dict) -> str:
    return os.path.join(os.path.dirname(m["paths"][0]), "shardpipes.index.json.gz")


def shardpipes_idx(m: dict, workers: int, cfg: dict) -> Made:
    """The README graph with the index: ``sharding_by_index(index)`` for ``sharding_filter()``.

    Run by ``DataLoader2`` in-process, or with ``MultiProcessingReadingService(workers)``. The
    index is built once per dataset, before the timed run (``preload``); loading it is timed.
    """
    from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
    from shardpipes.datapipes.iter import IterableWrapper
    from shardpipes.index import ShardIndex

    index = ShardIndex.load(_index_path(m))
    dp = _readme_graph(m, cfg, IterableWrapper(m["paths"]).shuffle().sharding_by_index(index))
    service = MultiProcessingReadingService(num_workers=workers) if workers else None
    dl2 = DataLoader2(dp, reading_service=service)
    return dl2, dl2.shutdown, f"shardpipes DataLoader2, sharding_by_index, {workers} workers"


def torchdata09(m: dict, workers: int, cfg: dict) -> Made:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation banner of torchdata.datapipes
        from torchdata.datapipes.iter import IterableWrapper

    dp = (
        IterableWrapper(m["paths"])
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .map(td09_decode_member)
        .webdataset()
        .shuffle(buffer_size=cfg["shuffle"])
    )
    if _jpeg(m):
        dp = dp.map(jpeg_item)
    dp = dp.batch(cfg["batch"])
    if workers == 0:
        return dp, _nothing, "graph iterated directly"
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

    dl2 = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers))
    return (
        dl2,
        dl2.shutdown,
        f"torchdata 0.9 DataLoader2 + MultiProcessingReadingService({workers})",
    )


def torchdata09_dl(m: dict, workers: int, cfg: dict) -> Made:
    """torchdata 0.9's DataPipes run by torch's ``DataLoader`` (workers only).

    torchdata 0.9's own ``DataLoader2`` + ``MultiProcessingReadingService`` fails on this data
    ("Can not expect any response without submitted request" when the first worker runs out;
    upstream meta-pytorch/data#1310, never fixed). torch's ``DataLoader`` applies the graph's
    ``sharding_filter`` per worker itself, so the same graph runs in 2 workers this way.
    """
    if workers == 0:
        raise ValueError("torchdata09_dl measures workers only; torchdata09 is the in-process row")
    from torch.utils.data import DataLoader

    dp, _, _ = torchdata09(m, 0, cfg)
    dl = DataLoader(dp, batch_size=None, num_workers=workers)
    return (
        dl,
        _nothing,
        f"torch DataLoader(batch_size=None, num_workers={workers}) over torchdata 0.9 DataPipes",
    )


def webdataset(m: dict, workers: int, cfg: dict) -> Made:
    import webdataset as wds

    if m.get("transport") == "s3":
        # webdataset 1.0.2 has no s3:// handler (its docs pipe through `aws s3 cp`); register
        # fsspec's, as its docs suggest for other schemes. Workers inherit it (fork).
        import importlib

        # the package's `gopen` attribute is the function; the table lives in the module
        importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = wds_gopen_fsspec
    ds = wds.WebDataset(m["paths"], shardshuffle=False).decode().shuffle(cfg["shuffle"])
    if _jpeg(m):
        ds = ds.map(jpeg_item)
    ds = ds.batched(cfg["batch"], collation_fn=None)
    if workers == 0:
        return ds, _nothing, "WebDataset iterated directly"
    loader = wds.WebLoader(ds, batch_size=None, num_workers=workers)
    return loader, _nothing, f"wds.WebLoader(batch_size=None, num_workers={workers})"


def wids(m: dict, workers: int, cfg: dict) -> Made:
    import wids as wids_
    from torch.utils.data import DataLoader

    ds = wids_.ShardListDataset(
        m["wids_descriptor"],
        localname=same_path,  # read the shards where they are (no copy into a cache dir)
        lru_size=len(m["paths"]),
        transformations=[wids_decode, jpeg_item] if _jpeg(m) else [wids_decode],
    )
    sampler = wids_.ChunkedSampler(ds, chunksize=cfg["shuffle"], shuffle=True, seed=0)
    dl = DataLoader(
        ds, batch_size=cfg["batch"], sampler=sampler, num_workers=workers, collate_fn=as_list
    )
    return (
        dl,
        ds.close,
        f"torch DataLoader(batch_size={cfg['batch']}, num_workers={workers}) over ShardListDataset",
    )


class _TarfileOnly:
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self):
        import tarfile

        for path in self.paths:
            count = 0
            last = None
            with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                for info in tar:
                    if not info.isfile():
                        continue
                    data = tar.extractfile(info).read()  # noqa: F841 - reading is the work measured
                    key = info.name.split(".", 1)[0]
                    if key != last:
                        count += 1
                        last = key
                    tar.members = []  # as webdataset does: do not keep every TarInfo
            yield range(count)  # the runner counts len() of each item


def tarfile(m: dict, workers: int, cfg: dict) -> Made:
    if workers:
        raise ValueError("the tarfile peer runs in-process only")
    return _TarfileOnly(m["paths"]), _nothing, "tarfile.open(mode='r|') reading each member"


def _nothing() -> None:
    pass


_FLOOR_SAMPLES: list[dict] = []  # filled by preload("floor"), before the clock starts


def _load_floor_samples(m: dict) -> None:
    import random
    import tarfile as tarfile_mod

    samples: dict[str, dict] = {}
    for path in m["paths"]:
        with tarfile_mod.open(path, "r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, _, ext = member.name.partition(".")
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                s = samples.setdefault(key, {"__key__": key})
                s[ext] = data if ext == "cls" else memoryview(data)
    if len(samples) != m["samples"]:
        raise RuntimeError(f"floor: read {len(samples)} samples, the manifest says {m['samples']}")
    order = list(samples.values())
    random.Random(0).shuffle(order)
    _FLOOR_SAMPLES[:] = order


class _Floor:
    """The item function over samples in memory, in lists of ``batch`` dropped as made."""

    def __init__(self, item: Callable[[dict], dict], batch: int) -> None:
        self.item, self.batch = item, batch

    def __iter__(self) -> Any:
        item, samples, n = self.item, _FLOOR_SAMPLES, self.batch
        for i in range(0, len(samples), n):
            yield [item(s) for s in samples[i : i + n]]


def floor(m: dict, workers: int, cfg: dict) -> Made:
    import _work

    if workers:
        raise ValueError("the floor peer runs in-process only")
    item = _work.jpeg_item if _jpeg(m) else _work.bytes_item
    what = f"the item function ({item.__name__}) alone over the samples in memory, lists of {cfg['batch']}"
    return _Floor(item, cfg["batch"]), _nothing, what


PEERS: dict[str, Callable[[dict, int, dict], Made]] = {
    "shardpipes": shardpipes,
    "shardpipes_dl2": shardpipes_dl2,
    "shardpipes_idx": shardpipes_idx,
    "shardpipes_fused": shardpipes_fused,
    "shardpipes_fused_t2": shardpipes_fused_t2,
    "shardpipes_fused_u8": shardpipes_fused_u8,
    "torchdata09": torchdata09,
    "torchdata09_dl": torchdata09_dl,
    "webdataset": webdataset,
    "wids": wids,
    "tarfile": tarfile,
    "floor": floor,
    "litdata": lambda m, w, c: _native("litdata", m, w, c),
    "litdata_bare": lambda m, w, c: _native("litdata_bare", m, w, c),
    "mosaic": lambda m, w, c: _native("mosaic", m, w, c),
    "energon": lambda m, w, c: _native("energon", m, w, c),
    "dali": lambda m, w, c: _native("dali", m, w, c),
}


def _native(peer: str, m: dict, workers: int, cfg: dict) -> Made:
    import _peers_native  # the peers' venv only: it imports Energon at module level

    return _peers_native.PEERS[peer](m, workers, cfg)


# Imported by the runner before the clock starts, so import time is never measured.
PRELOAD: dict[str, list[str]] = {
    "shardpipes": [
        "torch",
        "fsspec.implementations.local",
        "shardpipes.datapipes.iter",
        "shardpipes.dataloader2",
    ],
    "torchdata09": [
        "torch",
        "fsspec.implementations.local",
        "torchdata.datapipes.iter",
        "torchdata.dataloader2",
    ],
    "shardpipes_dl2": ["torch", "fsspec.implementations.local", "shardpipes.dataloader2"],
    "shardpipes_idx": ["torch", "fsspec.implementations.local", "shardpipes.dataloader2"],
    "shardpipes_fused": [
        "torch",
        "fsspec.implementations.local",
        "shardpipes.datapipes.iter",
        "shardpipes.dataloader2",
        "PIL.JpegImagePlugin",
        "numpy",
    ],
    "shardpipes_fused_t2": [
        "torch",
        "fsspec.implementations.local",
        "shardpipes.datapipes.iter",
        "PIL.JpegImagePlugin",
        "numpy",
    ],
    "shardpipes_fused_u8": [
        "torch",
        "fsspec.implementations.local",
        "shardpipes.datapipes.iter",
        "shardpipes.dataloader2",
        "PIL.JpegImagePlugin",
        "numpy",
    ],
    "torchdata09_dl": ["torch", "fsspec.implementations.local", "torchdata.datapipes.iter"],
    "webdataset": ["torch", "webdataset"],
    "wids": ["torch", "wids", "wids.wids_decode"],
    "tarfile": ["tarfile"],
    "floor": ["torch", "_work"],
    "litdata": ["torch", "litdata", "_peers_native"],
    "litdata_bare": ["torch", "litdata", "_peers_native"],
    "mosaic": ["torch", "_peers_native"],
    "energon": ["torch", "megatron.energon", "_peers_native"],
    "dali": ["nvidia.dali", "nvidia.dali.fn", "_peers_native"],
    "cat": [],
    "s3cat": ["s3fs"],
}


def preload(peer: str, m: dict | None = None) -> None:
    import importlib
    import warnings

    if peer == "shardpipes_idx" and m is not None and not os.path.exists(_index_path(m)):
        from shardpipes.index import build_index

        build_index(m["paths"], progress=False).save(_index_path(m))
    if peer == "floor" and m is not None:
        _load_floor_samples(m)

    names = PRELOAD[peer]
    if m is not None and m.get("transport") == "s3" and "s3fs" not in names:
        names = [*names, "s3fs"]  # as the plain s3fs rows of object_store.py: not timed
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchdata 0.9's deprecation banner
            try:
                if peer == "mosaic" and name == "_peers_native":
                    mosaic_base()
                importlib.import_module(name)
            except ImportError:
                if peer == "shardpipes" and name == "shardpipes.dataloader2":
                    continue  # the stand-in loader is used; see shardpipes()
                raise


def library_versions(peer: str) -> dict[str, str]:
    from importlib import metadata

    names = {
        "shardpipes": ["shardpipes", "torch", "torchdata"],
        "shardpipes_dl2": ["shardpipes", "torch", "torchdata"],
        "shardpipes_idx": ["shardpipes", "torch", "torchdata"],
        "shardpipes_fused": ["shardpipes", "torch", "torchdata", "pillow"],
        "shardpipes_fused_t2": ["shardpipes", "torch", "torchdata", "pillow"],
        "shardpipes_fused_u8": ["shardpipes", "torch", "torchdata", "pillow"],
        "torchdata09": ["torchdata", "torch"],
        "torchdata09_dl": ["torchdata", "torch"],
        "webdataset": ["webdataset", "torch"],
        "wids": ["wids", "torch"],
        "tarfile": [],
        "floor": ["torch"],
        "litdata": ["litdata", "torch"],
        "litdata_bare": ["litdata", "torch"],
        "mosaic": ["mosaicml-streaming", "torch"],
        "energon": ["megatron-energon", "torch"],
        "dali": ["nvidia-dali-cuda120"],
        "cat": [],
        "s3cat": ["s3fs", "fsspec"],
    }[peer]
    if peer in ("shardpipes", "torchdata09", "torchdata09_dl"):
        names = [*names, "fsspec", "s3fs"]
    out = {"python": sys.version.split()[0]}
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    out.update({n: installed.get(n, "missing") for n in names})
    return out
