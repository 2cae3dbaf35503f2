"""A mixture at scale, simulated without the data (issue 27): ``python benchmarks/scale.py --mixture``.

35 sources with 1M shards in total (1000 samples each, sizes falling off as 1/k), each with a
version-2 descriptor as ``shardpipes index`` writes it. In a fresh process:

- **load**: all 35 descriptors (``ShardIndex.load``), the process's RSS growth (index memory);
- **plan** (CPU seconds of the process; the machine may be shared): what one reader (the
  middle one of 4096 ranks x 8 workers) does at the start of an epoch: each source's shard
  order, its sample layout from the URLs in that order (as ``sharding_by_index`` makes it), the
  mixture's counts, this reader's share of every source and its interleave, and the byte
  ranges of its pieces;
- **elastic plan**: the same after a restore on 2048 x 8 readers of a state taken 100 items
  into the epoch on a smaller job (R x 8, given by ``--elastic-ranks``): it recomputes what every
  reader of the earlier stretch read, so it grows with the readers and samples of that stretch;
- **index requests per rank** at job start: each reader process reading every descriptor
  (ranks x workers x sources), against rank 0 reading each once and broadcasting it
  (``DistributedReadingService``), plus the per-shard sample files the rank's readers touch.
"""

from __future__ import annotations

import os
import time
from typing import Any

SOURCES = 35
TOTAL_SHARDS = 1_000_000
WORLD, WORKERS = 4096, 8
BATCH = 32


def shard_counts(sources: int = SOURCES, total: int = TOTAL_SHARDS) -> list[int]:
    """Shards per source, proportional to 1/k, summing to ``total``."""
    raw = [1 / k for k in range(1, sources + 1)]
    counts = [max(1, int(total * r / sum(raw))) for r in raw]
    counts[0] += total - sum(counts)
    return counts


def weights(sources: int = SOURCES) -> list[float]:
    """Sampling weights: the square root of each source's share (a common up-weighting of small ones)."""
    return [(1 / k) ** 0.5 for k in range(1, sources + 1)]


def task(args: dict[str, Any]) -> dict[str, Any]:
    from scale import _name, _rss

    from shardpipes.index import ShardIndex
    from shardpipes.plan.mixture import Mixture, mix_reader
    from shardpipes.plan.partition import EpochLayout, shard_order
    from shardpipes.plan.resume import Segment, Shape

    rss0 = _rss()
    c0 = time.process_time()
    indexes = [ShardIndex.load(d) for d in args["descriptors"]]
    out: dict[str, Any] = {"load_cpu_s": time.process_time() - c0, "index_rss": _rss() - rss0}
    shape = Shape(BATCH, False, None, None)
    world, workers = args["topology"]
    reader = (world // 2) * workers

    def plan(segments: list[Segment], reader: int) -> dict[str, Any]:
        # The URLs reach the sharder from the user's DataPipe; making their strings here is
        # reported apart (source_s), as scale.py does for one stream.
        c0 = time.process_time()
        layouts = []
        source_s = 0.0
        for k, (index, folder) in enumerate(zip(indexes, args["folders"], strict=True)):
            order = shard_order(len(index), seed=k, epoch=1)
            c1 = time.process_time()
            urls = [os.path.join(folder, _name(i)) for i in order]
            source_s += time.process_time() - c1
            where = index.positions(urls)
            layouts.append((EpochLayout(index.count_array[where]), where))
        c_layout = time.process_time() - c0 - source_s
        mix = Mixture(len(indexes), weights=tuple(args["weights"]))
        sizes = [layout.total for layout, _ in layouts]
        counts = mix.counts(sizes, 1)
        mine = mix_reader(
            mix, counts, seed=0, epoch=1, segments=segments, reader=reader, shape=shape
        )
        ranges = shards = 0
        for (layout, where), piece in zip(layouts, mine.pieces, strict=True):
            for a, b in piece.runs:
                got = layout.ranges(a, b)
                ranges += len(got)
                shards += len({int(where[r.shard]) for r in got})
        return {
            "plan_s": time.process_time() - c0 - source_s,
            "source_s": source_s,
            "layouts_s": c_layout,
            "samples": mine.samples,
            "ranges": ranges,
            "shards_touched": shards,
        }

    out["plan"] = plan([Segment(world, workers, True, 0)], reader)
    if args.get("elastic_from"):
        ranks = args["elastic_from"]
        out["elastic"] = plan(
            [Segment(ranks, workers, True, 100), Segment(world // 2, workers, True, 0)],
            reader // 2,
        )
        out["elastic"]["from_readers"] = ranks * workers
    return out


def main(opts: Any, run_task: Any, work: str) -> dict[str, Any]:
    from scale import make_template, template_sidecar, write_descriptor

    tpl = make_template(work)
    template_sidecar(work, tpl)
    counts = shard_counts()
    folders, descriptors = [], []
    for k, n in enumerate(counts):
        folder = os.path.join(work, f"mix-{k:02d}")
        descriptors.append(write_descriptor(folder, n, "v2", tpl))
        folders.append(folder)
    disk = sum(os.path.getsize(d) for d in descriptors)
    args = {
        "kind": "mixture",
        "descriptors": descriptors,
        "folders": folders,
        "weights": weights(),
        "topology": [WORLD, WORKERS],
        "elastic_from": opts.elastic_ranks,
    }
    result = run_task(args, opts.budget * 4)
    result.update(
        {
            "sources": SOURCES,
            "shards": TOTAL_SHARDS,
            "topology": f"{WORLD}x{WORKERS}",
            "descriptor_bytes": disk,
        }
    )
    touched = result.get("plan", {}).get("shards_touched", 0)
    # Requests at job start, per rank: every reader process reads every descriptor, or rank 0
    # reads each once for the job (broadcast); the sample files of the shards its readers
    # read are needed either way (estimated from the measured reader x its rank's workers).
    result["requests_per_rank"] = {
        "descriptors_each_reader_reads": WORKERS * SOURCES,
        "descriptors_read_once_per_job": SOURCES / WORLD,
        "sample_files": touched * WORKERS,
        "descriptor_bytes_each_reader": WORKERS * disk,
        "descriptor_bytes_once_per_job": disk / WORLD,
    }
    plan = result.get("plan", {})
    print(
        f"mixture of {SOURCES} sources, {TOTAL_SHARDS} shards, {WORLD}x{WORKERS} readers: "
        f"descriptors {disk / 1e6:.0f} MB, index RSS {result.get('index_rss', 0) / 1e6:.0f} MB, "
        f"load {result.get('load_cpu_s', 0):.2f} s CPU; one reader's plan "
        f"{plan.get('plan_s', float('nan')):.2f} s CPU (layouts {plan.get('layouts_s', 0):.2f} s), "
        f"{plan.get('samples')} samples in {plan.get('ranges')} ranges over "
        f"{plan.get('shards_touched')} shards",
        flush=True,
    )
    if "elastic" in result:
        e = result["elastic"]
        print(
            f"  elastic restore from {e['from_readers']} readers: {e['plan_s']:.2f} s CPU",
            flush=True,
        )
    r = result["requests_per_rank"]
    print(
        f"  descriptor requests per rank at start: {r['descriptors_each_reader_reads']} "
        f"({r['descriptor_bytes_each_reader'] / 1e6:.0f} MB) if each reader reads them, "
        f"{r['descriptors_read_once_per_job']:.4f} ({r['descriptor_bytes_once_per_job'] / 1e3:.0f} KB) "
        f"read once per job; sample files {r['sample_files']}",
        flush=True,
    )
    return result
