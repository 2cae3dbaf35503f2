"""LitData, MosaicML streaming, Megatron-Energon and DALI, each over its own format (peers' venv).

Imported only in the peers' venv (by ``_peers.py`` when one of these peers runs). Each reads
what ``_native.py`` wrote with the peer's own writer, shuffles the peer's way, and runs the
same item function (``_work.bytes_item`` or ``_work.jpeg_item``) on every sample, in the
worker where the peer has workers:

- ``litdata``: ``StreamingDataset(dir, shuffle=True)`` + ``StreamingDataLoader(batch_size=64,
  num_workers=N, collate_fn=...)``; the item function runs in the collate function.
  ``litdata_bare``: the same ``StreamingDataset`` iterated directly in the calling thread, the
  item function on each sample, lists of 64 (no loader).
- ``mosaic``: ``StreamingDataset(local=dir, shuffle=True, batch_size=64)`` + torch
  ``DataLoader(batch_size=64, num_workers=N, collate_fn=...)``.
- ``energon``: ``get_train_dataset(dir, shuffle_buffer_size=1000, batch_size=64,
  repeat=False, task_encoder=...)`` + ``get_loader``; a ``DefaultTaskEncoder`` with
  ``decoder = None`` and a stateless ``Cooker`` calling the item function; batches are lists.
- ``dali``: a CPU pipeline (``device_id=None``): ``fn.readers.webdataset(random_shuffle=True,
  initial_fill=1000)``; on ``jpeg`` DALI's own fused operators (``decoders.image_random_crop``,
  ``resize``, ``crop_mirror_normalize``) since a Python item function would not be DALI; on
  the byte presets the raw fields go through ``bytes_item`` in the calling thread. DALI has no
  worker processes: "in-process" is ``num_threads=1``, "N workers" is ``num_threads=N``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import _work

Made = tuple[Any, Callable[[], None], str]
_ITEM: Callable[[dict], dict] = _work.bytes_item  # set by each peer before its loader starts


def item_fn(m: dict) -> Callable[[dict], dict]:
    return _work.jpeg_item if m.get("preset", {}).get("kind") == "jpeg" else _work.bytes_item


def collate_items(batch: list[dict]) -> list[dict]:
    return [_ITEM(s) for s in batch]


def _nothing() -> None:
    pass


# --- LitData ----------------------------------------------------------------------------------


def litdata(m: dict, workers: int, cfg: dict) -> Made:
    import litdata as ld

    global _ITEM
    _ITEM = item_fn(m)
    ds = ld.StreamingDataset(m["native"]["litdata"]["dir"], shuffle=True, seed=0)
    dl = ld.StreamingDataLoader(
        ds, batch_size=cfg["batch"], num_workers=workers, collate_fn=collate_items
    )
    return (
        dl,
        _nothing,
        f"litdata StreamingDataLoader(batch_size={cfg['batch']}, num_workers={workers}) over StreamingDataset(shuffle=True)",
    )


class _Batched:
    """The item function over each item of ``items``, in lists of ``batch``: a plain loop."""

    def __init__(self, items: Any, batch: int) -> None:
        self.items, self.batch = items, batch

    def __iter__(self) -> Iterator[list]:
        item, out = _ITEM, []
        for s in self.items:
            out.append(item(s))
            if len(out) == self.batch:
                yield out
                out = []
        if out:
            yield out


def litdata_bare(m: dict, workers: int, cfg: dict) -> Made:
    """LitData's ``StreamingDataset`` iterated directly (no loader), in the calling thread."""
    import litdata as ld

    if workers:
        raise ValueError("litdata_bare is an in-process row (the dataset iterated directly)")
    global _ITEM
    _ITEM = item_fn(m)
    ds = ld.StreamingDataset(m["native"]["litdata"]["dir"], shuffle=True, seed=0)
    return (
        _Batched(ds, cfg["batch"]),
        _nothing,
        f"litdata StreamingDataset(shuffle=True) iterated directly, item function per sample, lists of {cfg['batch']}",
    )


# --- MosaicML streaming -----------------------------------------------------------------------


def mosaic(m: dict, workers: int, cfg: dict) -> Made:
    import _peers
    from torch.utils.data import DataLoader

    global _ITEM
    _ITEM = item_fn(m)
    sb = _peers.mosaic_base()
    sb.util.clean_stale_shared_memory()
    ds = sb.StreamingDataset(
        local=m["native"]["mosaic"]["dir"], shuffle=True, shuffle_seed=0, batch_size=cfg["batch"]
    )
    dl = DataLoader(ds, batch_size=cfg["batch"], num_workers=workers, collate_fn=collate_items)
    return (
        dl,
        sb.util.clean_stale_shared_memory,
        f"torch DataLoader(batch_size={cfg['batch']}, num_workers={workers}) over streaming StreamingDataset(shuffle=True)",
    )


# --- Megatron-Energon -------------------------------------------------------------------------

from megatron.energon import Cooker, DefaultTaskEncoder, stateless  # noqa: E402


@stateless
def energon_cook(sample: dict) -> dict:
    return _ITEM(sample)


class EnergonEncoder(DefaultTaskEncoder):
    """Raw bytes to the item function (``decoder = None``); a batch is a plain list."""

    cookers = [Cooker(energon_cook)]
    decoder = None

    def batch(self, samples: list[dict]) -> list[dict]:  # type: ignore[override]
        return list(samples)


class _Limited:
    """One epoch of an Energon loader: stops after ``total`` samples (its train loader may repeat)."""

    def __init__(self, loader: Any, total: int) -> None:
        self.loader, self.total = loader, total

    def __iter__(self) -> Iterator[list]:
        left = self.total
        for batch in self.loader:
            if left <= 0:
                return
            yield batch[:left]
            left -= len(batch)


def energon(m: dict, workers: int, cfg: dict) -> Made:
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    global _ITEM
    _ITEM = item_fn(m)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_train_dataset(
        m["native"]["energon"]["dir"],
        worker_config=wc,
        batch_size=cfg["batch"],
        shuffle_buffer_size=cfg["shuffle"],
        max_samples_per_sequence=None,
        repeat=False,
        task_encoder=EnergonEncoder(),
    )
    loader = get_loader(ds, worker_config=wc)
    return (
        _Limited(loader, m["samples"]),
        _nothing,
        f"energon get_loader(get_train_dataset(shuffle_buffer_size={cfg['shuffle']}, batch_size={cfg['batch']}, repeat=False), num_workers={workers})",
    )


# --- DALI (CPU) -------------------------------------------------------------------------------


class _DaliEpoch:
    def __init__(self, pipe: Any, total: int, batch: int, fields: list[str], jpeg: bool) -> None:
        self.pipe, self.total, self.batch, self.fields, self.jpeg = pipe, total, batch, fields, jpeg

    def __iter__(self) -> Iterator[Any]:
        left = self.total
        for _ in range(math.ceil(self.total / self.batch)):
            outs = self.pipe.run()
            n = min(left, self.batch)
            left -= n
            if self.jpeg:
                yield outs[0].as_array()[:n]  # (n, 3, 224, 224) float32, normalised
            else:
                cols = [[t for t in o] for o in outs]
                yield [
                    bytes_item_dali({f: cols[j][i] for j, f in enumerate(self.fields)})
                    for i in range(n)
                ]


def bytes_item_dali(s: dict) -> dict:
    import numpy as np

    return _work.bytes_item({k: np.asarray(v) for k, v in s.items()})


def dali(m: dict, workers: int, cfg: dict) -> Made:
    from nvidia.dali import fn, pipeline_def, types

    nat = m["native"]["dali"]
    jpeg = m.get("preset", {}).get("kind") == "jpeg"
    fields = ["jpg", "cls"] if jpeg else nat["fields"]

    @pipeline_def(batch_size=cfg["batch"], num_threads=max(1, workers), device_id=None, seed=0)
    def pipe():  # type: ignore[no-untyped-def]
        outs = fn.readers.webdataset(
            paths=nat["paths"],
            index_paths=nat["index_paths"],
            ext=fields,
            random_shuffle=True,
            initial_fill=cfg["shuffle"],
            name="Reader",
        )
        if not jpeg:
            return tuple(outs)
        jpg, cls = outs
        img = fn.decoders.image_random_crop(
            jpg,
            device="cpu",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
        )
        img = fn.resize(img, resize_x=224, resize_y=224)
        img = fn.crop_mirror_normalize(
            img,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[x * 255 for x in _work.MEAN],
            std=[x * 255 for x in _work.STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return img, cls

    p = pipe()
    p.build()
    what = (
        "fused image_random_crop + resize + crop_mirror_normalize"
        if jpeg
        else "raw fields + bytes_item"
    )
    return (
        _DaliEpoch(p, m["samples"], cfg["batch"], fields, jpeg),
        _nothing,
        f"DALI CPU pipeline, fn.readers.webdataset(random_shuffle=True, initial_fill={cfg['shuffle']}), {what}, num_threads={max(1, workers)}",
    )


PEERS: dict[str, Callable[[dict, int, dict], Made]] = {
    "litdata": litdata,
    "litdata_bare": litdata_bare,
    "mosaic": mosaic,
    "energon": energon,
    "dali": dali,
}
