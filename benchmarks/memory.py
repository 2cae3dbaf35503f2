"""Memory across epochs: RSS after every epoch of a long run, against the buffers' bound.

    python benchmarks/memory.py                    # small and large presets, 20 epochs
    python benchmarks/memory.py --presets large --epochs 5 --workers 2

For each preset, shardpipes runs the benchmark's pipeline (``_peers.py``: list -> open -> tar
-> group -> decode -> shuffle 1000 -> batch 64) for ``--epochs`` epochs in one process, once
in-process and once with ``DataLoader2`` + 2 workers, and records the resident set of the main
process and of the workers after each epoch (``_runner.py``). It prints, per run:

- **growth**: RSS after the last epoch against RSS after the first, main process and workers
  together (the target: within 5%);
- **held**: peak RSS less RSS after the imports (what the pipeline itself holds at most),
  against **bound**: the shuffle buffer (1000 samples) plus the batches that may be in flight
  (prefetched in each worker, in the shared-memory ring, in the main process), at the
  preset's sample size on disk.

The shards are generated (or reused) as ``bench.py`` does, under ``.bench/data``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _data  # noqa: E402
import bench  # noqa: E402


def run(manifest: str, workers: int, epochs: int) -> dict:
    """One trial through bench.py's own runner call (same command line and environment)."""
    opts = argparse.Namespace(shuffle=1000, batch=64, epochs=epochs, timeout=1800, omp_threads="1")
    r = bench.run_trial(sys.executable, "shardpipes", workers, manifest, opts)
    if "error" in r:
        raise RuntimeError(
            f"shardpipes with {workers} workers: {r['error']}\n{r.get('stderr', '')}"
        )
    return r


# What the bound does not count: the interpreter's own objects for the samples in the buffers
# (a dict, its keys, decoded ints and JSON per sample: about 8 MB for 1,000 small samples).
_SLACK_MB = 16


def bound_mb(m: dict, workers: int, shuffle: int = 1000, batch: int = 64) -> float:
    """Shuffle buffer + batches in flight, at the preset's bytes per sample (on disk)."""
    per_sample = m["bytes"] / m["samples"]
    buffers = max(workers, 1) * shuffle  # each worker has its own shuffle buffer
    # In flight with workers: prefetch 2 per worker, a ring of prefetch + 2 blocks per
    # worker (each sized 1.5 x the first batch), one batch being copied out in the main
    # process and one held by the loop. In-process: the batch being made and the one held.
    batches = workers * (2 + 4 * 1.5) + 2 if workers else 2
    return (buffers + batches * batch) * per_sample / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="small,large")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="the workers run (0: in-process only)")
    ap.add_argument("--cache-dir", default=os.path.join(os.path.dirname(HERE), ".bench", "data"))
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    rows, results = [], []
    for name in args.presets.split(","):
        m = _data.ensure_dataset(_data.PRESETS[name], args.cache_dir, print)
        manifest = os.path.join(m["directory"], "manifest.json")
        for workers in sorted({0, args.workers}):
            r = run(manifest, workers, args.epochs)
            total = [
                a + b for a, b in zip(r["rss_epochs_mb"], r["rss_children_epochs_mb"], strict=True)
            ]
            growth = total[-1] / total[0] - 1
            held = r["rss_main_mb"] - r["rss_import_mb"]
            if workers:  # the workers hold the pipeline; each started as a copy of the main
                held += max(0.0, r["rss_children_mb"] - r["rss_import_mb"]) * workers
            bound = bound_mb(m, workers)
            mode = f"{workers} workers" if workers else "in-process"
            verdict = "OK" if abs(growth) <= 0.05 and held <= bound * 1.05 + _SLACK_MB else "MISS"
            later = sorted(r["seconds"][1:] or r["seconds"])
            rate = r["samples"] / later[len(later) // 2]
            rows.append(
                f"| {name} | {mode} | {total[0]:,.0f} | {total[-1]:,.0f} | {growth:+.1%} | "
                f"{min(total):,.0f}-{max(total):,.0f} | {held:,.0f} | {bound:,.0f} | {verdict} "
                f"| {rate:,.0f} |"
            )
            results.append({"preset": name, "workers": workers, "bound_mb": bound, **r})
    print(
        f"\nRSS after each of {args.epochs} epochs, main process + workers (MB):\n\n"
        "| preset | mode | epoch 1 | last epoch | growth | range | held (peak - imports) "
        "| bound (shuffle + in flight) | | samples/s, epochs 2+ (median) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
