"""Synthetic shards for the benchmark: presets, a cache directory reused across runs, a manifest.

Each dataset lives in ``<cache>/<preset>-<hash of its parameters>/`` with the shards, a
``manifest.json`` (written last: its presence means the dataset is complete) and a wids
descriptor ``wids.json`` (relative URLs, ``wids_version: 1``). Shard sizes are uneven on
purpose (counts drawn from a seeded uniform spread), as real datasets are.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass

__all__ = ["PRESETS", "Preset", "ensure_dataset", "load_manifest"]

_FORMAT = 1  # bump when the layout of the generated data changes


@dataclass(frozen=True)
class Preset:
    name: str
    shards: int
    samples: int  # total over all shards
    payload_bytes: int  # size of each sample's .bin field
    spread: float = 0.6  # shard counts drawn from [1 - spread, 1 + spread] x the mean
    seed: int = 0
    # "bytes": {.cls, .json, .bin} samples (shardpipes.synthetic); "jpeg": {.jpg, .cls}
    # photographs (_photos.py), decoded and transformed by every peer (_work.jpeg_item)
    kind: str = "bytes"


PRESETS = {
    # ~2 KB per sample (.cls ~1 B, .json ~45 B, .bin 2000 B): per-sample overhead bound.
    "small": Preset("small", shards=16, samples=60_000, payload_bytes=2_000),
    # ~100 KB per sample, ~600 MB on disk: I/O bound.
    "large": Preset("large", shards=12, samples=6_000, payload_bytes=100_000),
    # ~75 KB photographs, 500x375 at quality 90, ImageNet's training transform: decode bound.
    "jpeg": Preset("jpeg", shards=10, samples=1_200, payload_bytes=0, kind="jpeg"),
    # a few seconds end to end, for the smoke test
    "quick": Preset("quick", shards=4, samples=1_200, payload_bytes=2_000),
    "quickjpeg": Preset("quickjpeg", shards=4, samples=256, payload_bytes=0, kind="jpeg"),
}


def _counts(p: Preset) -> list[int]:
    rng = random.Random(p.seed)
    weights = [rng.uniform(1 - p.spread, 1 + p.spread) for _ in range(p.shards)]
    scale = p.samples / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    counts[-1] += p.samples - sum(counts)  # exact total
    if counts[-1] < 1:
        raise ValueError(
            f"preset {p.name}: cannot split {p.samples} samples into {p.shards} shards"
        )
    return counts


def _key(p: Preset) -> str:
    fields = asdict(p)
    if p.kind == "bytes":
        del fields["kind"]  # the keys of the byte presets' caches from before "kind" existed
    text = json.dumps({**fields, "format": _FORMAT}, sort_keys=True)
    return f"{p.name}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def load_manifest(directory: str) -> dict:
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)


def ensure_dataset(p: Preset, cache_dir: str, log=print) -> dict:
    """Return the manifest of preset ``p`` under ``cache_dir``, writing the shards if missing."""
    directory = os.path.abspath(os.path.join(cache_dir, _key(p)))
    if os.path.exists(os.path.join(directory, "manifest.json")):
        manifest = load_manifest(directory)
        if all(
            os.path.getsize(u) == s
            for u, s in zip(manifest["paths"], manifest["sizes"], strict=True)
        ):
            return manifest
        log(f"cached {p.name} data in {directory} is damaged; writing it again")
    tmp = directory + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    counts = _counts(p)
    t0 = time.perf_counter()
    if p.kind == "jpeg":
        import _photos

        _photos.write_jpeg_shards(tmp, counts, p.seed)
    else:
        from shardpipes.synthetic import write_synthetic

        write_synthetic(
            tmp, shards=p.shards, samples=counts, payload_bytes=p.payload_bytes, seed=p.seed
        )
    os.rename(tmp, directory)
    names = sorted(n for n in os.listdir(directory) if n.endswith(".tar"))
    paths = [os.path.join(directory, n) for n in names]
    sizes = [os.path.getsize(u) for u in paths]
    with open(os.path.join(directory, "wids.json"), "w") as f:
        json.dump(
            {
                "wids_version": 1,
                "name": p.name,
                "shardlist": [
                    {"url": n, "nsamples": c, "filesize": s}
                    for n, c, s in zip(names, counts, sizes, strict=True)
                ],
            },
            f,
            indent=1,
        )
    manifest = {
        "preset": asdict(p),
        "directory": directory,
        "paths": paths,
        "counts": counts,
        "sizes": sizes,
        "samples": sum(counts),
        "bytes": sum(sizes),
        "fields": 2 if p.kind == "jpeg" else 3,
        "wids_descriptor": os.path.join(directory, "wids.json"),
    }
    with open(os.path.join(directory, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.rename(
        os.path.join(directory, "manifest.json.tmp"), os.path.join(directory, "manifest.json")
    )
    log(
        f"wrote {p.name}: {p.shards} shards, {sum(counts)} samples, {sum(sizes) / 1e6:.0f} MB "
        f"in {time.perf_counter() - t0:.1f} s -> {directory}"
    )
    return manifest
