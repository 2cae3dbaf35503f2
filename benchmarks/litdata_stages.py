"""LitData's cost per small sample, stage by stage, in the peers' environment.

The counterpart of ``shardpipes bench <shards> --profile`` for the loader issue 30 measures
against: LitData 0.2.76 over the chunks its own ``optimize()`` wrote for the ``small`` preset
(``bench.py`` writes them into ``<preset dir>/native/litdata``), one process, no workers::

    .bench/venv-peers/bin/python benchmarks/litdata_stages.py .bench/data/small-<digest>/native/litdata

Each row runs the pipeline up to that stage over every sample (a fresh dataset each time, best
of ``--rounds`` after one warm-up), CPU time of the process; a stage's own cost is its row less
the one before:

1. ``StreamingDataset(dir, shuffle=True)`` iterated: read the chunks, deserialize each item;
2. then the benchmark's item function (``_work.bytes_item``: ``.cls`` to ``int``, ``.json``
   parsed, ``.bin`` as ``bytes``) on each sample;
3. then ``StreamingDataLoader(batch_size=64, num_workers=0)`` with the item function in its
   collate function: what ``bench.py`` runs as the ``litdata`` peer in-process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _work


def _collate(batch: list[dict]) -> list[dict]:
    return [_work.bytes_item(s) for s in batch]


def _read(root: str) -> int:
    import litdata as ld

    return sum(1 for _ in ld.StreamingDataset(root, shuffle=True, seed=0))


def _item(root: str) -> int:
    import litdata as ld

    return sum(1 for s in ld.StreamingDataset(root, shuffle=True, seed=0) if _work.bytes_item(s))


def _loader(root: str) -> int:
    import litdata as ld

    ds = ld.StreamingDataset(root, shuffle=True, seed=0)
    dl = ld.StreamingDataLoader(ds, batch_size=64, num_workers=0, collate_fn=_collate)
    return sum(len(b) for b in dl)


STAGES = [
    ("StreamingDataset(shuffle=True): read + deserialize", _read),
    ("+ item function (bytes_item)", _item),
    ("+ StreamingDataLoader(batch_size=64), item function in collate", _loader),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the litdata chunks of the small preset (native/litdata)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    before = 0.0
    print("| stage | CPU us per sample | its own |")
    print("|---|---|---|")
    for name, run in STAGES:
        run(args.root)  # warm-up: imports, page cache, litdata's index
        best = float("inf")
        for _ in range(args.rounds):
            t = time.process_time()
            n = run(args.root)
            best = min(best, (time.process_time() - t) / n * 1e6)
        print(f"| {name} | {best:.1f} | {best - before:+.1f} |")
        before = best


if __name__ == "__main__":
    main()
