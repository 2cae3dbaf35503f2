"""Samples per CPU-second of the README pipeline, in-process, for several checkouts of shardpipes.

The pipeline a user writes from the README, on the ``small`` preset's shards (written by
``bench.py`` first), ``IterableWrapper(paths).sharding_filter().open_files_by_fsspec(mode="rb")
.load_from_tar().webdataset().decode(image=None).shuffle(buffer_size=1000).batch(64)``, run by
``DataLoader2(dp)`` (``dl2``) or iterated directly (``direct``). Each measurement is a fresh
process with one checkout's ``pipes/`` on ``PYTHONPATH``; rounds go over the checkouts in turn,
so that other work on the machine spreads over all of them. Prints each run, then medians::

    git archive 8ecd8bf pipes | tar -x -C /tmp/old
    python benchmarks/readme_cpu.py .bench/data/small-* /tmp/old/pipes pipes --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_CHILD = """
import glob, resource, sys, time
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.dataloader2 import DataLoader2
paths = sorted(glob.glob(sys.argv[1] + "/*.tar"))
t = time.process_time()
dp = (IterableWrapper(paths).sharding_filter().open_files_by_fsspec(mode="rb").load_from_tar()
      .webdataset().decode(image=None).shuffle(buffer_size=1000).batch(64))
if sys.argv[2] == "dl2":
    dl = DataLoader2(dp)
    n = sum(map(len, dl))
    dl.shutdown()
else:
    n = sum(map(len, dp))
print(n, n / (time.process_time() - t), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a folder of the small preset's shards")
    ap.add_argument("pipes", nargs="+", help="the pipes/ folders of the checkouts to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="dl2,direct")
    args = ap.parse_args()
    got: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for r in range(args.rounds):
        for pipes in args.pipes:
            for mode in args.modes.split(","):
                env = {**os.environ, "PYTHONPATH": os.path.abspath(pipes)}
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, args.data, mode],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                n, rate, rss = int(out[0]), float(out[1]), int(out[2])
                got.setdefault((pipes, mode), []).append((rate, rss))
                print(f"round {r + 1} {pipes} {mode}: {n} samples, {rate:,.0f}/CPU-s, {rss} MB")
    for (pipes, mode), runs in got.items():
        rate = statistics.median(x[0] for x in runs)
        print(
            f"median {pipes} {mode}: {rate:,.0f} samples/CPU-s, peak RSS {max(x[1] for x in runs)} MB"
        )


if __name__ == "__main__":
    main()
