"""The floor under "large samples in-process": what copying each member into its own object costs.

    python benchmarks/copy_floor.py [--preset large] [--keep 3000] [--trials 5]

``cat`` reads a file into one small buffer that it reuses, so every byte lands in memory the
CPU has just written (in cache); a loader must hand out each member as an object of its own,
and with a shuffle buffer of 1,000 samples (3,000 members, 100 MB on the large preset) those
objects live long enough that each one is written to memory that is not in any cache. This
script measures, on the benchmark's shards (page cache warm, one process, best of
``--trials``):

1. ``readinto``: the files read in 1 MiB pieces into one reused buffer (what ``cat`` does);
2. ``pread, freed``: every member read into a new ``bytes`` object (one ``pread`` at its
   offset, no parsing), dropped at once: the allocator hands back the same warm memory;
3. ``pread, kept``: the same, the last ``--keep`` members kept alive, as a shuffle buffer
   keeps them: the floor of any loader that yields ``bytes`` with that buffer;
4. ``load_from_tar``: shardpipes' tar stage (parsing, checksums, members as bytes), nothing kept;
5. ``pipeline``: the benchmark's own shardpipes graph (``_peers.shardpipes``: tar, group,
   decode, shuffle 1000, batch 64).

Member offsets for 2 and 3 are found before the clock starts.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _data  # noqa: E402
import _peers  # noqa: E402

# `import shardpipes` no longer loads torch and the stages: load them before any clock starts.
import shardpipes.datapipes.iter  # noqa: E402, F401


def readinto(paths: list[str], _: list) -> int:
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
    return 0


def pread_members(keep: int):
    def run(paths: list[str], spans: list) -> int:
        alive: deque[bytes] = deque(maxlen=keep or None)
        n = 0
        for p, members in zip(paths, spans, strict=True):
            fd = os.open(p, os.O_RDONLY)
            try:
                for off, size in members:
                    data = os.pread(fd, size, off)
                    if keep:
                        alive.append(data)
                    n += 1
            finally:
                os.close(fd)
        return n

    return run


def tar_stage(paths: list[str], _: list) -> int:
    from shardpipes.datapipes.iter import IterableWrapper

    return sum(1 for _ in IterableWrapper(paths).open_files_by_fsspec().load_from_tar())


def pipeline(paths: list[str], _: list) -> int:
    # The very graph bench.py times for shardpipes in-process (_peers.shardpipes).
    dp, _close, _loader = _peers.shardpipes({"paths": paths}, 0, {"shuffle": 1000, "batch": 64})
    return sum(len(b) for b in dp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="large")
    ap.add_argument("--keep", type=int, default=3000, help="members kept alive (default: 3000)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--cache-dir", default=os.path.join(os.path.dirname(HERE), ".bench", "data"))
    args = ap.parse_args()
    m = _data.ensure_dataset(_data.PRESETS[args.preset], args.cache_dir, print)
    paths = m["paths"]
    from shardpipes.formats.tarparse import iter_tar

    spans = []
    for p in paths:
        with open(p, "rb") as f:
            spans.append([(e.data_offset, len(e.data)) for e in iter_tar(f, p)])
    for p in glob.glob(os.path.join(m["directory"], "*.tar")):
        with open(p, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass
    runs = [
        ("readinto (cat)", readinto),
        ("pread, freed", pread_members(0)),
        (f"pread, {args.keep} kept", pread_members(args.keep)),
        ("load_from_tar", tar_stage),
        ("pipeline", pipeline),
    ]
    best: dict[str, float] = {}
    for _ in range(args.trials):  # round-robin, so that noise spreads over all of them
        for name, fn in runs:
            t0 = time.perf_counter()
            fn(paths, spans)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    limit = m["bytes"] / best["readinto (cat)"]
    print(
        f"\n{args.preset}: {m['samples']:,} samples, {m['bytes'] / 1e6:,.0f} MB, best of {args.trials}\n"
    )
    print("| what | GB/s | of readinto |\n|---|---|---|")
    for name, _ in runs:
        rate = m["bytes"] / best[name]
        print(f"| {name} | {rate / 1e9:.2f} | {rate / limit:.0%} |")


if __name__ == "__main__":
    main()
