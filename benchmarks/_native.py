"""Each peer's own format, written by its own writer from the preset's tars (peers' venv).

    python benchmarks/_native.py --manifest M.json --format litdata --out DIR

- ``litdata``: ``litdata.optimize`` (one input per shard, chunks of 64 MB), items
  ``{"key": str, "cls": int, <payload fields>: bytes}``;
- ``mosaic``: ``streaming.MDSWriter`` (columns ``key: str, cls: int``, the rest ``bytes``,
  shards of 64 MB);
- ``energon``: the plain tars, linked into ``DIR`` and indexed in place by ``energon prepare
  --sample-type CrudeWebdataset`` (``DIR/.nv-meta``);
- ``dali``: the plain tars, with an index per shard written by DALI's ``wds2idx`` tool.

Payload fields stay the bytes that the tar holds (``.json`` text, ``.bin`` bytes, ``.jpg`` the
encoded image): every peer then does the same decoding work at read time (``_work.py``). The
directory is written under ``DIR.partial`` and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _peers  # noqa: E402  (the import of Mosaic's streaming.base without torchvision)


def shard_samples(path: str) -> Iterator[dict]:
    """The samples of one tar, in order: ``{"key": ..., "cls": int, ext: bytes, ...}``."""
    sample: dict = {}
    with tarfile.open(path, mode="r|") as tar:
        for info in tar:
            if not info.isfile():
                continue
            key, ext = info.name.split(".", 1)
            if sample and sample["key"] != key:
                yield sample
                sample = {}
            sample["key"] = key
            data = tar.extractfile(info).read()
            sample[ext] = int(data) if ext == "cls" else data
            tar.members = []
    if sample:
        yield sample


def _fields(m: dict) -> list[str]:
    first = next(shard_samples(m["paths"][0]))
    return [k for k in first if k not in ("key", "cls")]


def write_litdata(m: dict, out: str) -> dict:
    import litdata

    litdata.optimize(
        fn=shard_samples,
        inputs=list(m["paths"]),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
        reorder_files=False,
        mode="overwrite",
        verbose=False,
    )
    return {"dir": out}


def write_mosaic(m: dict, out: str) -> dict:
    streaming_base = _peers.mosaic_base()
    columns = {"key": "str", "cls": "int", **dict.fromkeys(_fields(m), "bytes")}
    with streaming_base.MDSWriter(out=out, columns=columns, size_limit="64mb") as w:
        for path in m["paths"]:
            for s in shard_samples(path):
                w.write(s)
    return {"dir": out}


def _link_tars(m: dict, out: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    links = []
    for path in m["paths"]:
        link = os.path.join(out, os.path.basename(path))
        os.symlink(path, link)
        links.append(link)
    return links


def write_energon(m: dict, out: str) -> dict:
    _link_tars(m, out)
    energon = os.path.join(os.path.dirname(sys.executable), "energon")
    cmd = [energon, "prepare", out, "--non-interactive", "--split-ratio", "1,0,0"]
    cmd += ["--sample-type", "CrudeWebdataset", "--force-overwrite", "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return {"dir": out}


def write_dali(m: dict, out: str) -> dict:
    links = _link_tars(m, out)
    wds2idx = os.path.join(os.path.dirname(sys.executable), "wds2idx")
    indexes = []
    for link in links:
        idx = link[: -len(".tar")] + ".idx"
        subprocess.run([wds2idx, link, idx], check=True, capture_output=True, text=True)
        indexes.append(idx)
    return {"dir": out, "paths": links, "index_paths": indexes, "fields": ["cls", *_fields(m)]}


WRITERS = {
    "litdata": write_litdata,
    "mosaic": write_mosaic,
    "energon": write_energon,
    "dali": write_dali,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--format", required=True, choices=sorted(WRITERS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.manifest) as f:
        m = json.load(f)
    tmp = args.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    info = WRITERS[args.format](m, tmp)
    info = json.loads(json.dumps(info).replace(tmp, args.out))
    with open(os.path.join(tmp, "native.json"), "w") as f:
        json.dump(info, f)
    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    print("NATIVE " + json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
