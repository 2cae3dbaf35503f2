"""The per-sample work every Python peer runs: the same function, whatever loader hands the sample in.

Imported in both interpreters (shardpipes' and the peers' venv), so it needs only numpy, torch
and Pillow. Field names are looked up with and without the leading dot (shardpipes keeps
``.jpg``, webdataset strips it), and raw values may be ``bytes``, ``memoryview`` (LitData) or
numpy ``uint8`` arrays (DALI).

- ``bytes_item``, the ``small`` / ``large`` presets: ``.cls`` to ``int``, ``.json`` to objects,
  ``.bin`` stays ``bytes``. Used by the peers whose reader hands raw fields (LitData, Mosaic,
  Energon, DALI); webdataset, wids, torchdata 0.9 and shardpipes use their own ``decode``.
- ``jpeg_item``, the ``jpeg`` preset: the ImageNet training transform written with Pillow and
  numpy/torch, as torchvision's ``RandomResizedCrop(224)`` (scale 0.08-1, ratio 3/4-4/3,
  bilinear with antialias) + ``RandomHorizontalFlip()`` + ``ToTensor()`` + ``Normalize(mean,
  std)`` compose it: decode the whole image, crop, resize, flip, to a float CHW tensor,
  normalise. torchvision itself cannot be installed beside torch 2.13's CPU wheel here (the
  index's torchvision wheel links ``libtorch_cuda``), so this is the transform every Python
  peer runs, webdataset's "torchvision-style" row included.
"""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["MEAN", "STD", "bytes_item", "jpeg_item", "jpeg_transform", "rrc_params"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_MEAN = torch.tensor(MEAN).view(3, 1, 1)
_STD = torch.tensor(STD).view(3, 1, 1)
_RNG = random.Random(0)  # the transform's draws; which crop is taken does not change its cost


def _field(s: dict, name: str) -> Any:
    v = s.get(name)
    return s["." + name] if v is None else v


def _raw(v: Any) -> bytes:
    if isinstance(v, np.ndarray):
        return v.tobytes()
    return bytes(v) if not isinstance(v, bytes) else v


def _int(v: Any) -> int:
    return v if isinstance(v, int) else int(_raw(v))


def bytes_item(s: dict) -> dict:
    return {
        "__key__": s.get("__key__", s.get("key")),
        "cls": _int(_field(s, "cls")),
        "json": json.loads(_raw(_field(s, "json"))),
        "bin": _raw(_field(s, "bin")),
    }


def rrc_params(
    rng: random.Random,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: ``(left, top, width, height)``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height  # fallback: the central crop
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def jpeg_transform(data: Any, size: int = 224) -> torch.Tensor:
    img = Image.open(io.BytesIO(_raw(data))).convert("RGB")
    x, y, w, h = rrc_params(_RNG, *img.size)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
    if _RNG.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # as torchvision's to_tensor: a contiguous CHW copy, then float / 255; then normalize
    t = torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous().float().div_(255)
    return t.sub_(_MEAN).div_(_STD)


def jpeg_item(s: dict) -> dict:
    return {
        "__key__": s.get("__key__", s.get("key")),
        "jpg": jpeg_transform(_field(s, "jpg")),
        "cls": _int(_field(s, "cls")),
    }
