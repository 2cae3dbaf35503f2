"""Image shards for the shardpipes.webdataset tests, written with shardpipes.writer."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import PIL.Image

from shardpipes.writer import ShardWriter


def encode(img: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()


def image(i: int, *, gray: bool = False, size: int = 8) -> np.ndarray:
    """A small deterministic image: ``size x size`` RGB, or 2-D grayscale."""
    y, x = np.mgrid[0:size, 0:size]
    base = ((x * 17 + y * 5 + i * 13) % 256).astype(np.uint8)
    return (
        base
        if gray
        else np.stack(
            [base, base[::-1], ((base.astype(np.int64) + 64) % 256).astype(np.uint8)], axis=2
        )
    )


def write_image_shards(
    directory: str | os.PathLike[str],
    *,
    shards: int = 4,
    per_shard: int = 6,
    gray_every: int = 0,
    exts: tuple[str, ...] = ("jpg",),
    prefix: str = "img",
) -> list[str]:
    """Shards of ``{<image ext>, cls, txt, json}``; every ``gray_every``-th image is grayscale.

    The image extension cycles through ``exts`` (``"jpg"``, ``"png"``, ``"jpeg"``, ``"webp"``);
    ``json`` holds ``{"id": global id, "gray": bool}``.
    """
    os.makedirs(directory, exist_ok=True)
    pattern = os.path.join(os.fspath(directory), f"{prefix}-%06d.tar")
    gid = 0
    with ShardWriter(pattern, maxcount=per_shard) as w:
        for _ in range(shards):
            for _ in range(per_shard):
                ext = exts[gid % len(exts)]
                gray = bool(gray_every) and gid % gray_every == 0
                fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[ext]
                w.write(
                    {
                        "__key__": f"s{gid:05d}",
                        f".{ext}": encode(image(gid, gray=gray), fmt),
                        ".cls": gid % 5,
                        ".txt": f"caption {gid}",
                        ".json": json.dumps({"id": gid, "gray": gray}),
                    }
                )
                gid += 1
    return list(w.urls)
