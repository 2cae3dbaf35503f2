"""One trial of one peer in this (fresh) process; prints one JSON line with the figures.

    python benchmarks/_runner.py --peer shardpipes --workers 2 --manifest M.json [--epochs 1]

The clock starts before the pipeline (and its loader and workers) is built, after the libraries
are imported, and stops at the last batch of the epoch (worker shutdown is not counted). With
``--epochs N`` each epoch is timed; the last one is the figure (workers that persist across
epochs, as DataLoader2's do, are then already running). Peak RSS: ``VmHWM`` of this process,
and ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` for the largest child (a worker, or ``cat``),
read after the loader has been shut down and its workers reaped. CPU seconds (user + system,
this process and its children) are reported per pass too (and per epoch, ``cpu_epochs_s``:
the first epoch holds building the loader, as its wall time does; workers' CPU counts only once
they are reaped, so per epoch it is exact for in-process rows only): on a shared machine they
move less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peers


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _cat(m: dict) -> dict:
    # One pass over warm files takes ~0.1 s, too short to time alone: repeat for >= 1 s.
    passes = 0
    t0 = time.perf_counter()
    while passes == 0 or time.perf_counter() - t0 < 1.0:
        subprocess.run(["cat", *m["paths"]], stdout=subprocess.DEVNULL, check=True)
        passes += 1
    seconds = (time.perf_counter() - t0) / passes
    return {
        "samples": m["samples"],
        "seconds": [seconds],
        "first_batch_s": None,
        "loader": "cat > /dev/null",
        "passes": passes,
    }


def _s3cat(m: dict) -> dict:
    import s3fs

    fs = s3fs.S3FileSystem()
    t0 = time.perf_counter()
    for url in m["paths"]:
        with fs.open(url, "rb") as f:
            while f.read(1 << 20):
                pass
    seconds = time.perf_counter() - t0
    loader = "s3fs: open + read(1 MiB) until EOF, object by object"
    return {"samples": m["samples"], "seconds": [seconds], "first_batch_s": None, "loader": loader}


def _children_rss_kb() -> list[int]:
    """VmRSS of this process's live children (the workers), read from /proc."""
    me, out = str(os.getpid()), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            if ppid == me:
                with open(f"/proc/{pid}/status") as f:
                    out += [int(x.split()[1]) for x in f if x.startswith("VmRSS:")]
        except (OSError, IndexError):
            continue  # exited meanwhile
    return out


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _iterate(m: dict, workers: int, cfg: dict, epochs: int, cpu_start: float) -> dict:
    make = _peers.PEERS[cfg["peer"]]
    t0 = time.perf_counter()
    iterable, close, loader = make(m, workers, cfg)
    seconds, first, counts, cpu = [], None, [], []
    rss, rss_children = [], []  # after each epoch: this process, and the sum over live workers
    c0 = cpu_start
    try:
        for _ in range(epochs):
            n = 0
            t_last = t0
            for batch in iterable:
                n += len(batch)
                t_last = time.perf_counter()
                if first is None:
                    first = t_last - t0
            seconds.append(t_last - t0)
            c1 = _cpu_s()
            cpu.append(c1 - c0)
            counts.append(n)
            if epochs > 1:  # reading /proc is not part of the timed work
                rss.append(_status_kb("VmRSS") / 1024)
                rss_children.append(sum(_children_rss_kb()) / 1024)
            t0 = time.perf_counter()
            c0 = _cpu_s()
    finally:
        close()
    if len(set(counts)) != 1:
        raise RuntimeError(f"sample counts differ between epochs: {counts}")
    return {
        "samples": counts[-1],
        "seconds": seconds,
        "first_batch_s": first,
        "loader": loader,
        "cpu_epochs_s": cpu,
        "rss_epochs_mb": rss,
        "rss_children_epochs_mb": rss_children,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, choices=[*_peers.PEERS, "cat", "s3cat"])
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--shuffle", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    with open(args.manifest) as f:
        m = json.load(f)
    cfg = {"peer": args.peer, "shuffle": args.shuffle, "batch": args.batch}
    _peers.preload(args.peer, m)
    rss_import = _status_kb("VmRSS")
    cpu0 = _cpu_s()
    if args.peer == "cat":
        out = _cat(m)
        passes = out["passes"]
    elif args.peer == "s3cat":
        out = _s3cat(m)
        passes = 1
    else:
        out = _iterate(m, args.workers, cfg, args.epochs, cpu0)
        passes = args.epochs
    # CPU time of this process and its reaped children (workers, cat) per pass over the data:
    # less sensitive than wall time to other work on the machine.
    out["cpu_s"] = (_cpu_s() - cpu0) / passes
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out.update(
        peer=args.peer,
        workers=args.workers,
        expected=m["samples"],
        bytes=m["bytes"],
        rss_main_mb=_status_kb("VmHWM") / 1024,
        rss_import_mb=rss_import / 1024,
        rss_children_mb=children_kb / 1024,
        versions=_peers.library_versions(args.peer),
    )
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
