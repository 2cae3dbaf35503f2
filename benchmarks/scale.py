"""The index and the epoch plan at scale, simulated without the data (issue 18).

    python benchmarks/scale.py                                   # v2 (today's format), all sizes
    python benchmarks/scale.py --format v1 --out before.json     # the v1 format
    python benchmarks/scale.py --plot docs/images/scale.png --compare before.json after.json
    python benchmarks/scale.py --mixture --out mix.json           # 35 sources, 1M shards (issue 27)
    python benchmarks/scale.py --mixture-read                     # threads/connections of a read

For 10k, 100k and 1M shards of 1000 samples each (10^7 to 10^9 samples) it writes a dataset
descriptor as ``shardpipes index`` would (v1: every sample's key, offset and size in one JSON
file; v2: one line per shard, per-sample spans in per-shard sidecars), but no shards: only
the shards that the measured reader reads exist, as symbolic links to one real template
shard (with its sidecar copied, for v2). Then, each in a fresh process:

- **descriptor**: its size on disk;
- **load**: ``ShardIndex.load`` time, the process's RSS after it and the growth it caused
  (``index RSS``);
- **plan** (CPU seconds of the process: the machine may be shared), per topology (64x8, 512x8, 4096x8 readers): one epoch's shard order
  (``shard_order``) plus the ranges of one reader (the middle one) as ``sharding_by_index``
  makes them from the URLs in that order (given as a list; iterating them through a DataPipe
  is reported apart, as ``source_s``); and ``partition_samples`` for all readers (what
  ``shardpipes splits`` computes);
- **offsets memory**: the per-sample spans that reader holds after its plan (v1: every
  shard's, as Python lists; v2: its own shards' arrays);
- **first batch**: from the start of a fresh process (index load included) to the first
  batch of 32 samples of that reader, reading its local fake shards (wall and CPU seconds).

For the first batch the URLs reach ``sharding_by_index`` through ``IterableWrapper(urls,
deepcopy=False)``: the default deep copy of a million URLs per epoch is the wrapper's cost.

A measurement that would take longer than ``--budget`` seconds (60) is stopped (or, when its
estimate from the smaller sizes is over the budget or over 4 GB of memory, not started) and
reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import _scale_mix

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES_PER_SHARD = 1000
SHARDS = (10_000, 100_000, 1_000_000)
TOPOLOGIES = ((64, 8), (512, 8), (4096, 8))
BATCH = 32


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _name(i: int) -> str:
    return f"train-{i:07d}.tar"


# --- the fake dataset ---------------------------------------------------------------------------


def make_template(work: str) -> dict:
    """One real shard of SAMPLES_PER_SHARD samples and its index entry."""
    from shardpipes.index import index_shard
    from shardpipes.synthetic import write_synthetic

    [path] = write_synthetic(
        os.path.join(work, "template"), shards=1, samples=SAMPLES_PER_SHARD, payload_bytes=64
    )
    info = index_shard(path)
    return {
        "path": path,
        "total_bytes": info.total_bytes,
        "keys": list(info.keys),
        "offsets": [int(x) for x in info.offsets],
        "sizes": [int(x) for x in info.sizes],
    }


def write_descriptor(folder: str, shards: int, fmt: str, tpl: dict) -> str:
    """The descriptor of ``shards`` copies of the template, as ``shardpipes index`` writes it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.index.json")
    n, total = SAMPLES_PER_SHARD, tpl["total_bytes"]
    head = {
        "format": "shardpipes-index",
        "version": 1 if fmt == "v1" else 2,
        "num_shards": shards,
        "num_samples": shards * n,
        "total_bytes": shards * total,
    }
    if fmt == "v1":
        entry = {
            "url": "@URL@",
            "num_samples": n,
            "total_bytes": total,
            "keys": tpl["keys"],
            "offsets": tpl["offsets"],
            "sizes": tpl["sizes"],
        }
    else:
        head["samples"] = "train.index.samples"
        entry = {"url": "@URL@", "num_samples": n, "total_bytes": total}
    before, after = json.dumps(entry, separators=(",", ":")).split("@URL@")
    with open(path, "w") as f:
        f.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"shards":[\n')
        for i in range(shards):
            f.write(f"{before}{_name(i)}{after}{',' if i < shards - 1 else ''}\n")
        f.write("]}\n")
    return path


def template_sidecar(work: str, tpl: dict) -> str:
    """The v2 sidecar of the template shard, written by the library."""
    from shardpipes.index import build_index
    from shardpipes.index.sidecar import sidecar_path

    out = os.path.join(work, "template", "t.index.json")
    build_index([tpl["path"]], progress=False).save(out)
    return sidecar_path(out, 0)


def reader_shards(shards: int, readers: int, reader: int, order: list[int]) -> list[int]:
    """Shard numbers read by ``reader`` in the epoch whose shard order is ``order`` (drop)."""
    n = SAMPLES_PER_SHARD
    per = shards * n // readers
    a, b = reader * per, (reader + 1) * per
    return [order[p] for p in range(a // n, (b - 1) // n + 1)] if per else []


def fake_shards(folder: str, numbers: list[int], tpl: dict, sidecar: str | None) -> None:
    for i in numbers:
        link = os.path.join(folder, _name(i))
        if not os.path.lexists(link):
            os.symlink(tpl["path"], link)
        if sidecar:
            from shardpipes.index.sidecar import sidecar_path

            target = sidecar_path(os.path.join(folder, "train.index.json"), i)
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(sidecar, target)


# --- measurements, each in a fresh process ------------------------------------------------------


def _offsets_bytes(index, numbers: list[int]) -> int:
    """Per-sample spans held: v2, the cached arrays of its shards; v1, every shard's lists."""
    if hasattr(index.shards[0], "loaded_bytes"):
        return sum(index.shards[i].loaded_bytes for i in numbers)
    # v1: two lists of Python ints per shard; json makes one int object (32 B) per value.
    return sum(
        sys.getsizeof(s.offsets) + sys.getsizeof(s.sizes) + 64 * s.num_samples for s in index.shards
    )


def task(args: dict) -> dict:
    start = time.perf_counter()
    rss0 = _rss()
    from torch.utils.data.graph_settings import apply_sharding

    from shardpipes.datapipes.iter import IndexSharder, IterableWrapper
    from shardpipes.index import ShardIndex
    from shardpipes.plan.partition import partition_samples, shard_order

    rss_imports = _rss()
    t0, c0 = time.perf_counter(), time.process_time()
    index = ShardIndex.load(args["descriptor"])
    out: dict = {
        "load_s": time.perf_counter() - t0,
        "load_cpu_s": time.process_time() - c0,
        "rss_imports": rss_imports,
        "rss0": rss0,
    }
    out["rss_after_load"] = _rss()
    out["index_rss"] = out["rss_after_load"] - rss_imports
    kind = args["kind"]
    if kind == "load":
        return out
    world, workers = args["topology"]
    readers = world * workers
    reader = args["reader"]
    counts = index.counts
    if kind == "partition":
        t0, c0 = time.perf_counter(), time.process_time()
        p = partition_samples(counts, world_size=world, num_workers=workers, seed=0, epoch=1)
        out["partition_wall_s"] = time.perf_counter() - t0
        out["partition_s"] = time.process_time() - c0
        out["per_reader"] = p.per_reader
        return out
    folder = os.path.dirname(args["descriptor"])
    # Plan times are CPU seconds of this process (one core; the machine may be shared).
    t0, c0 = time.perf_counter(), time.process_time()
    order = shard_order(len(counts), seed=0, epoch=1)
    out["order_s"] = time.process_time() - c0
    out["order_wall_s"] = time.perf_counter() - t0
    urls = [os.path.join(folder, _name(i)) for i in order]
    if kind == "plan":
        # The sharder reads the URLs from a list here: what torch's DataPipe machinery costs
        # per item upstream (about 1 us a URL, the same for sharding_filter) is measured apart.
        c0 = time.process_time()
        list(IterableWrapper(urls, deepcopy=False))
        out["source_s"] = time.process_time() - c0
        dp = IndexSharder(urls, index)
        apply_sharding(dp, readers, reader)
        t0, c0 = time.perf_counter(), time.process_time()
        ranges = list(dp)
        out["ranges_s"] = time.process_time() - c0
        out["ranges_wall_s"] = time.perf_counter() - t0
        out["plan_s"] = out["order_s"] + out["ranges_s"]
        out["ranges"] = len(ranges)
        out["offsets_bytes"] = _offsets_bytes(index, args["numbers"])
        if out["ranges_s"] < 20:
            c0 = time.process_time()
            list(dp)  # a second epoch over the same order: caches warm
            out["ranges_warm_s"] = time.process_time() - c0
        return out
    dp = IterableWrapper(urls, deepcopy=False).sharding_by_index(index)
    apply_sharding(dp, readers, reader)
    graph = dp.open_files_by_fsspec().load_from_tar().webdataset().batch(BATCH)
    batch = next(iter(graph))
    out["first_batch_s"] = time.perf_counter() - start
    out["first_batch_cpu_s"] = time.process_time()
    out["batch_len"] = len(batch)
    return out


def run_task(args: dict, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "_task", json.dumps(args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"skipped": f"stopped after {timeout:.0f} s"}
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the driver ---------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=("v1", "v2"), default="v2")
    ap.add_argument("--shards", default=",".join(map(str, SHARDS)))
    ap.add_argument("--topologies", default=",".join(f"{w}x{k}" for w, k in TOPOLOGIES))
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per measurement")
    ap.add_argument("--max-rss", type=float, default=4e9, help="skip loads estimated above this")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the results as JSON")
    ap.add_argument("--plot", default=None, help="draw the growth curves to this PNG")
    ap.add_argument("--compare", nargs="*", default=(), help="result files to plot")
    ap.add_argument("--mixture", action="store_true", help="35 sources, 1M shards (issue 27)")
    ap.add_argument("--elastic-ranks", type=int, default=64, help="--mixture: restore from R x 8")
    ap.add_argument(
        "--mixture-read", action="store_true", help="only threads/connections of a 35-source read"
    )
    ap.add_argument("--latency-ms", type=float, default=20.0, help="--mixture: the HTTP server's")
    opts = ap.parse_args()
    if opts.mixture or opts.mixture_read:
        work = opts.work or tempfile.mkdtemp(prefix="mix-")
        result = {} if opts.mixture_read else _scale_mix.main(opts, run_task, work)
        result["read"] = _scale_mix.read_main(opts, run_task, work)
        if opts.out:
            with open(opts.out, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    if opts.compare and opts.plot:
        return plot([json.load(open(p)) for p in opts.compare], opts.plot)
    shard_sizes = [int(s) for s in opts.shards.split(",")]
    topologies = [tuple(int(x) for x in t.split("x")) for t in opts.topologies.split(",")]
    work = opts.work or tempfile.mkdtemp(prefix="shardpipes-scale-")
    from shardpipes.plan.partition import shard_order

    tpl = make_template(work)
    sidecar = template_sidecar(work, tpl) if opts.format == "v2" else None
    results: dict = {"format": opts.format, "budget": opts.budget, "rows": []}
    per_sample = {}  # extrapolation from the last size measured: load s, RSS, disk bytes
    for shards in shard_sizes:
        samples = shards * SAMPLES_PER_SHARD
        row: dict = {"shards": shards, "samples": samples, "topologies": {}}
        results["rows"].append(row)
        folder = os.path.join(work, f"{opts.format}-{shards}")
        if per_sample:
            est_disk = per_sample["disk"] * samples
            est_load = per_sample["load_s"] * samples
            est_rss = per_sample["rss"] * samples
            if est_load > opts.budget or est_rss > opts.max_rss:
                row["skipped"] = (
                    f"estimated {est_disk / 1e9:.1f} GB on disk, {est_load:.0f} s to load, "
                    f"{est_rss / 1e9:.1f} GB RSS per process (from {per_sample['from']} shards)"
                )
                row["estimate"] = {"disk": est_disk, "load_s": est_load, "index_rss": est_rss}
                print(f"{shards} shards: skipped, {row['skipped']}", flush=True)
                continue
        descriptor = write_descriptor(folder, shards, opts.format, tpl)
        row["descriptor_bytes"] = os.path.getsize(descriptor)
        load = run_task({"kind": "load", "descriptor": descriptor}, opts.budget + 60)
        row["load"] = load
        if "load_s" not in load:
            print(f"{shards} shards: load {load}", flush=True)
            continue
        per_sample = {
            "disk": row["descriptor_bytes"] / samples,
            "load_s": load["load_s"] / samples,
            "rss": max(load["index_rss"], 1) / samples,
            "from": shards,
        }
        print(
            f"{shards} shards: descriptor {row['descriptor_bytes'] / 1e6:.1f} MB, load "
            f"{load['load_s']:.2f} s ({load['load_cpu_s']:.2f} s CPU), RSS {load['rss_after_load'] / 1e6:.0f} MB "
            f"(index {load['index_rss'] / 1e6:.0f} MB)",
            flush=True,
        )
        order = shard_order(shards, seed=0, epoch=1)
        timeout = opts.budget + load["load_s"] + 30
        for world, workers in topologies:
            readers = world * workers
            reader = (world // 2) * workers
            numbers = reader_shards(shards, readers, reader, order)
            fake_shards(folder, numbers, tpl, sidecar)
            args = {
                "descriptor": descriptor,
                "topology": [world, workers],
                "reader": reader,
                "numbers": numbers,
            }
            cell: dict = {"reader": reader, "shards_read": len(numbers)}
            for kind in ("plan", "partition", "first_batch"):
                cell[kind] = run_task({**args, "kind": kind}, timeout)
            row["topologies"][f"{world}x{workers}"] = cell
            plan, part, first = cell["plan"], cell["partition"], cell["first_batch"]
            print(
                f"  {world}x{workers}: plan {_fmt(plan, 'plan_s')} CPU (order "
                f"{_fmt(plan, 'order_s')}, ranges {_fmt(plan, 'ranges_s')}, next epoch's "
                f"ranges {_fmt(plan, 'ranges_warm_s')}), partition_samples "
                f"{_fmt(part, 'partition_s')} CPU, offsets "
                f"{plan.get('offsets_bytes', 0) / 1e3:.0f} KB, first batch "
                f"{_fmt(first, 'first_batch_s')} ({_fmt(first, 'first_batch_cpu_s')} CPU)",
                flush=True,
            )
        if not opts.work:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(results, f, indent=1)
    if opts.plot:
        plot([results], opts.plot)
    return 0


def _fmt(d: dict, key: str) -> str:
    if key in d:
        return f"{d[key]:.2f} s"
    return f"[{d.get('skipped') or d.get('error') or 'not measured'}]"


def plot(runs: list[dict], path: str) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'shardpipes[bench]'): no plot")
        return 1
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    panels = [
        ("descriptor on disk (MB)", lambda r, t: r.get("descriptor_bytes", 0) / 1e6),
        ("index RSS per process (MB)", lambda r, t: r.get("load", {}).get("index_rss", 0) / 1e6),
        ("plan per epoch, one reader (s)", lambda r, t: t.get("plan", {}).get("plan_s")),
        ("first batch of a reader (s)", lambda r, t: t.get("first_batch", {}).get("first_batch_s")),
    ]
    targets = {0: 100, 1: 200, 2: 1}
    for k, (title, value) in enumerate(panels):
        ax = axes[k]
        for run in runs:
            topo_names = sorted(
                {t for r in run["rows"] for t in r.get("topologies", {})},
                key=lambda s: int(s.split("x")[0]),
            )
            for topo in topo_names if k >= 2 else [None]:
                xs, ys = [], []
                for r in run["rows"]:
                    cell = r.get("topologies", {}).get(topo, {}) if topo else {}
                    v = value(r, cell) if ("load" in r) else None
                    if v:
                        xs.append(r["shards"])
                        ys.append(v)
                label = run["format"] + (f" {topo}" if topo else "")
                if xs:
                    ax.plot(xs, ys, marker="o", label=label)
        if k in targets:
            ax.axhline(targets[k], color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shards (1000 samples each)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_task":
        job = json.loads(sys.argv[2])
        run = {"mixture": _scale_mix.task, "mixture-read": _scale_mix.read_task}.get(
            job["kind"], task
        )
        print(json.dumps(run(job)))
        sys.exit(0)
    sys.exit(main())
