"""The reader's CPU per byte on S3: where it goes, from the S3 client up to the README graph.

    python benchmarks/s3_cpu.py                                   # 4 rounds, 3 passes each
    python benchmarks/s3_cpu.py --before /tmp/before/pipes        # + the graph of another tree

Starts moto's S3 server, uploads the ``large`` preset of ``object_store.py`` (8 shards of
~35 MB), and reads it with nothing between the reader and moto, each row in a fresh process
(every process imports torch, as a training process has), rounds interleaved. The figure is
the reading process's CPU-s per pass over the data (``time.process_time``: every thread of it),
over ``--passes`` passes after a warm one, so imports, the S3 session and the first
connections are not counted:

- ``graph``: ``open_files_by_fsspec -> load_from_tar -> webdataset -> decode -> shuffle ->
  batch`` (what ``object_store.py`` times);
- ``workers``: the same graph (after ``sharding_filter``) run by ``DataLoader2`` with 2 worker
  processes; its CPU is split per process: the trainer (this process), the workers (read
  from ``/proc`` while they live) and moto (the server), each per pass;
- ``stream``: ``open_files_by_fsspec`` alone, each shard ``read(1 MiB)`` to the end;
- ``s3fs``: plain s3fs, ``cat_file`` of the same 8 MiB ranges from 6 threads (the client's
  floor: every byte through s3fs, aiobotocore and aiohttp, and nothing else);
- ``presigned``: the same ranges as GETs of one presigned URL per object through fsspec's HTTP
  filesystem (botocore signs once per object instead of once per request).

Then the CPU of one request: ``--requests`` ranged GETs of one byte, one after the other, through
s3fs (``cat_file``), ``info`` look-ups, and presigned GETs. moto closes the connection after
each answer, so every request here also opens one; real S3 keeps them open.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

BLOCK = 8 << 20
ROWS = ["graph", "workers", "stream", "s3fs", "presigned"]


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# --- children ----------------------------------------------------------------------------------


def _pass_fn(row: str, paths: list[str]) -> Callable[[], int]:
    import fsspec
    import s3fs

    if row == "workers":
        from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
        from shardpipes.datapipes.iter import IterableWrapper

        dp = (
            IterableWrapper(paths)
            .sharding_filter()
            .open_files_by_fsspec(mode="rb")
            .load_from_tar()
            .webdataset()
            .decode()
            .shuffle(buffer_size=1000)
            .batch(64)
        )
        dl = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2))
        _LOADERS.append(dl)

        def one_pass_dl() -> int:
            return sum(len(b) for b in dl)

        return one_pass_dl
    if row in ("graph", "stream"):
        from shardpipes.datapipes.iter import IterableWrapper

        def one_pass() -> int:
            dp = IterableWrapper(paths).open_files_by_fsspec(mode="rb")
            if row == "stream":
                n = 0
                for _, f in dp:
                    while data := f.read(1 << 20):
                        n += len(data)
                    f.close()
                return n
            dp = dp.load_from_tar().webdataset().decode().shuffle(buffer_size=1000).batch(64)
            return sum(len(b) for b in dp)

        return one_pass
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    http = fsspec.filesystem("http", skip_instance_cache=True, encoded=True)
    sizes = {p: fs.size(p) for p in paths}
    urls = {p: fs.url(p, expires=3600) for p in paths} if row == "presigned" else {}

    def fetch(path: str, start: int, end: int) -> int:
        if row == "presigned":
            return len(http.cat_file(urls[path], start=start, end=end))
        return len(fs.cat_file(path, start=start, end=end))

    def one_pass() -> int:
        work: queue.Queue[tuple[str, int, int]] = queue.Queue()
        for p in paths:
            for start in range(0, sizes[p], BLOCK):
                work.put((p, start, min(sizes[p], start + BLOCK)))
        got: list[int] = []

        def run() -> None:
            while True:
                try:
                    job = work.get_nowait()
                except queue.Empty:
                    return
                got.append(fetch(*job))

        threads = [threading.Thread(target=run) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(got)

    return one_pass


_LOADERS: list = []


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children() -> list[int]:
    """Pids of this process's live children (the workers), from /proc."""
    me, out = str(os.getpid()), []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(pid))
            except (OSError, IndexError):
                continue
    return out


def _child(row: str, manifest: str, passes: int, requests: int) -> None:
    import torch  # noqa: F401  # a training process has it: the heap the collector walks

    with open(manifest) as f:
        paths = json.load(f)["paths"]
    if row == "requests":
        _requests(paths[0], requests)
        return
    one_pass = _pass_fn(row, paths)
    out = one_pass()  # warm: imports, session, connections, worker processes
    moto = int(os.environ.get("S3_CPU_MOTO_PID", "0"))
    kids = _children()
    k0, m0 = [_proc_cpu(k) for k in kids], _proc_cpu(moto) if moto else 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(passes):
        if one_pass() != out:
            raise RuntimeError(f"{row}: a pass read a different amount")
    cpu, wall = (time.process_time() - c0) / passes, (time.perf_counter() - t0) / passes
    workers = sum(_proc_cpu(k) - c for k, c in zip(kids, k0, strict=True)) / passes
    server = (_proc_cpu(moto) - m0) / passes if moto else 0.0
    fetch = {}
    if _LOADERS:
        fetch = _LOADERS[0].stats().get("fetch", {})
        _LOADERS[0].shutdown()
    else:
        from shardpipes.storage.pool import process_pool

        fetch = {"requests": process_pool().concurrency.requests}
    result = {
        "cpu_s": cpu + workers,
        "trainer_s": cpu,
        "workers_s": workers,
        "moto_s": server,
        "seconds": wall,
        "out": out,
        "fetch": fetch,
    }
    print("RESULT " + json.dumps(result), flush=True)


def _requests(path: str, n: int) -> None:
    import fsspec
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    http = fsspec.filesystem("http", skip_instance_cache=True, encoded=True)
    url = fs.url(path, expires=3600)
    fs.cat_file(path, start=0, end=1)
    http.cat_file(url, start=0, end=1)
    got = {}
    for what, call in (
        ("s3fs cat_file, 1 byte", lambda i: fs.cat_file(path, start=i, end=i + 1)),
        ("s3fs info (look-up)", lambda i: fs.info(path, refresh=True)),
        ("presigned GET, 1 byte", lambda i: http.cat_file(url, start=i, end=i + 1)),
        ("presigning a URL", lambda i: fs.url(path, expires=3600)),
    ):
        c0 = time.process_time()
        for i in range(n):
            call(i)
        got[what] = (time.process_time() - c0) / n * 1e3
    print("RESULT " + json.dumps(got), flush=True)


# --- the run -----------------------------------------------------------------------------------


def _run_child(row: str, args: argparse.Namespace, env: dict[str, str], pipes: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", row, "--manifest", args.manifest_tmp]
    cmd += [f"--passes={args.passes}", f"--requests={args.requests}"]
    child_env = dict(os.environ, **env, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    child_env["S3_CPU_MOTO_PID"] = str(args.moto_pid)
    if pipes:
        child_env["PYTHONPATH"] = pipes
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=args.timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list of: " + ", ".join(ROWS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3, help="timed passes per process")
    ap.add_argument("--requests", type=int, default=200, help="requests of the per-request row")
    ap.add_argument("--before", default=None, help="a pipes/ folder: adds its graph/stream rows")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--cache-dir", default=os.path.join(REPO, ".bench", "data"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--manifest", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.manifest, args.passes, args.requests)
        return 0
    import _data
    import object_store

    rows = [(r, None) for r in args.rows.split(",") if r]
    if args.before:
        rows += [(r, args.before) for r, _ in list(rows) if r in ("graph", "workers", "stream")]
    local = _data.ensure_dataset(object_store.PRESETS["large"], args.cache_dir, log)
    moto, endpoint = object_store._start_moto()
    args.moto_pid = moto.pid
    env = object_store._env(endpoint)
    results: dict[str, list[float]] = {}
    split: dict[str, list[tuple[float, float, float]]] = {}
    try:
        remote = object_store._upload(endpoint, {"large": local})["large"]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(remote, f)
            args.manifest_tmp = f.name
        log(f"large: {remote['bytes'] / 1e6:.0f} MB in {len(remote['paths'])} shards")
        for rnd in range(args.rounds):
            for row, pipes in rows:
                name = f"{row} (before)" if pipes else row
                r = _run_child(row, args, env, pipes)
                if "error" in r:
                    log(f"[{rnd + 1}/{args.rounds}] {name}: {r['error']}")
                    continue
                results.setdefault(name, []).append(r["cpu_s"])
                split.setdefault(name, []).append((r["trainer_s"], r["workers_s"], r["moto_s"]))
                log(
                    f"[{rnd + 1}/{args.rounds}] {name:<18} {r['cpu_s']:.3f} CPU-s per pass "
                    f"(trainer {r['trainer_s']:.3f}, workers {r['workers_s']:.3f}; moto "
                    f"{r['moto_s']:.3f}), {remote['bytes'] / r['seconds'] / 1e6:.0f} MB/s; "
                    f"fetch {r.get('fetch')}; load {os.getloadavg()[0]:.1f}"
                )
        per_request = _run_child("requests", args, env, None)
    finally:
        moto.terminate()
        moto.wait(10)
        if getattr(args, "manifest_tmp", None):
            os.unlink(args.manifest_tmp)
    print(
        f"\nlarge preset, {remote['bytes'] / 1e6:.0f} MB per pass; CPU-s per pass of the "
        f"reading process, {args.passes} passes after a warm one; {args.rounds} rounds\n"
    )
    print("| reader | median | range | trainer | workers | moto |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, got in results.items():
        parts = [statistics.median(x[i] for x in split[name]) for i in range(3)]
        print(
            f"| {name} | {statistics.median(got):.3f} | {min(got):.3f}-{max(got):.3f} | "
            + " | ".join(f"{x:.3f}" for x in parts)
            + " |"
        )
    if "error" in per_request:
        print(f"\nper request: {per_request['error']}")
    else:
        print(f"\nCPU per request, {args.requests} one after the other (ms):\n")
        for what, ms in per_request.items():
            print(f"- {what}: {ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
