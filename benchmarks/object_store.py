"""Readers of an object store far away, side by side: moto behind a latency/bandwidth relay.

    python benchmarks/object_store.py                         # 0/20/50 ms, 50 MB/s, 3 trials
    python benchmarks/object_store.py --latencies 50 --presets large --trials 2
    python benchmarks/object_store.py --plot docs/images/object_store.png --json out.json
    python benchmarks/object_store.py --latencies 50 --presets large --conn-mbps 10 \
        --link-mbps 80                                        # the link, not the CPU, the limit

One run starts moto's S3 server (a child process), uploads two datasets (``large``: ~35 MB
shards of 100 KB samples; ``small``: ~6.7 MB shards of 2 KB samples), and starts one
``relay.py`` per latency in front of it (first-byte latency before every response,
``--conn-mbps`` per connection). Then, through the relays, each in a fresh process, with every
trial going round-robin over latencies, presets and readers (so that other work on the
machine hits all rows alike):

- ``s3fs x1``: plain s3fs, each object ``open()`` + ``read(1 MiB)`` to the end, one after the
  other: one connection, what any sequential reader gets;
- ``s3fs xN``: plain s3fs, ``N`` threads taking 8 MiB ranges of the objects from one queue
  (``fs.cat_file(path, start, end)``): what the link allows, with no parsing at all (the
  *link* the other rows are given as a fraction of);
- ``webdataset``: 1.0.2 over ``fsspec.open`` (the usual way to give it ``s3://`` URLs), in
  process and with ``WebLoader(num_workers=2)``;
- ``shardpipes``: ``open_files_by_fsspec`` with its defaults -> tar -> webdataset -> decode ->
  shuffle -> batch, in process and with ``DataLoader2`` + 2 worker processes (``_peers.py``).

The figure is MB/s of shard bytes (the datasets' total size over the time to the last sample;
with ``--epochs 2`` the second epoch, so worker start-up is not counted). Reported per row:
the best of the trials, and the spread ((max - min) / max). Each trial's line on stderr also
gives the CPU seconds of the reader (with its workers), of moto and of the relay, and the load
average: on a shared 2-core machine the three compete for the same cores. The report gives
each row's CPU use: the CPU-seconds of reader, moto and relay per pass over the data, over the
pass's seconds and the machine's cores; a row well below 100% was limited by the link, not
the CPU. ``--link-mbps`` caps the relay's sum over every connection (a host's network link):
with it low enough, the link row (``s3fs xN``) fills it with CPU to spare.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _data  # noqa: E402

PRESETS = {
    # 8 shards of ~35 MB (100 KB samples): bandwidth bound.
    "large": _data.Preset("os-large", shards=8, samples=2_800, payload_bytes=100_000, spread=0.15),
    # 16 shards of ~6.7 MB (2 KB samples): many small shards, per-sample work.
    "small": _data.Preset("os-small", shards=16, samples=23_200, payload_bytes=2_000, spread=0.15),
}
BUCKET = "shardpipes-relay"
KEY, SECRET = "bench", "bench-secret"
READERS = [
    ("s3fs_1", 0),
    ("s3fs_n", 0),
    ("webdataset", 0),
    ("webdataset", 2),
    ("shardpipes", 0),
    ("shardpipes", 2),
]


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# --- children: the plain s3fs readers ----------------------------------------------------------


def _plain(mode: str, urls: list[str], parallel: int) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    # Clock and CPU count from here, as the loader rows count from after their imports
    # (``_peers.preload`` imports s3fs for them): no side counts importing s3fs.
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0
    if mode == "s3fs_1":
        for url in urls:
            with fs.open(url, "rb") as f:
                while data := f.read(1 << 20):
                    total += len(data)
    else:
        work: queue.Queue[tuple[str, int, int]] = queue.Queue()
        sizes = {}  # from one listing per folder, before the clock starts again
        for folder in sorted({u.rsplit("/", 1)[0] for u in urls}):
            sizes.update({"s3://" + e["name"]: e["size"] for e in fs.ls(folder, detail=True)})
        t0, c0 = time.perf_counter(), time.process_time()
        for url in urls:
            size = sizes[url]
            for start in range(0, size, 8 << 20):
                work.put((url, start, min(size, start + (8 << 20))))
        got: list[int] = []

        def run() -> None:
            while True:
                try:
                    url, start, end = work.get_nowait()
                except queue.Empty:
                    return
                got.append(len(fs.cat_file(url, start=start, end=end)))

        threads = [threading.Thread(target=run) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(got)
    seconds = time.perf_counter() - t0
    print(
        "RESULT "
        + json.dumps({"bytes": total, "seconds": seconds, "cpu_s": time.process_time() - c0})
    )


# --- the run -----------------------------------------------------------------------------------


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            requests.get(url + "/moto-api/", timeout=1)
            return proc, url
        except requests.ConnectionError:  # noqa: PERF203  # not up yet
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto did not start")


_AWS_CONFIG: list[str] = []


def _aws_config() -> str:
    """An AWS config file asking for SigV4 on S3, presigned URLs included (written once).

    In us-east-1 botocore presigns with SigV2 unless asked for s3v4, and shardpipes then reads
    ranges through s3fs (``storage/remote.py``): S3 refuses SigV2 on buckets made after June
    2020. A user sets the same in ``~/.aws/config`` or with ``config_kwargs``.
    """
    if not _AWS_CONFIG:
        fd, path = tempfile.mkstemp(prefix="shardpipes-aws-", suffix=".cfg")
        with os.fdopen(fd, "w") as f:
            f.write("[default]\ns3 =\n    signature_version = s3v4\n")
        atexit.register(os.unlink, path)
        _AWS_CONFIG.append(path)
    return _AWS_CONFIG[0]


def _env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": _aws_config(),
    }


def _upload(endpoint: str, manifests: dict[str, dict]) -> dict[str, dict]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    out = {}
    for name, m in manifests.items():
        urls = []
        for path in m["paths"]:
            key = f"{name}/{os.path.basename(path)}"
            client.upload_file(path, BUCKET, key)
            urls.append(f"s3://{BUCKET}/{key}")
        out[name] = {**m, "paths": urls, "transport": "s3"}
    return out


def _trial(
    reader: str, workers: int, m: dict, env: dict[str, str], args: argparse.Namespace, py: dict
) -> dict:
    if reader.startswith("s3fs"):
        cmd = [sys.executable, __file__, "--child", reader, f"--parallel={args.parallel}"]
        cmd += m["paths"]
        try:
            p = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=args.timeout,
                env=dict(os.environ, **env),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout} s"}
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                if r["bytes"] != m["bytes"]:
                    return {"error": f"read {r['bytes']} bytes of {m['bytes']}"}
                return {"seconds": r["seconds"], "cpu_s": r["cpu_s"]}
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    import bench

    if reader == "before":  # shardpipes from another source tree (--before)
        reader, env = "shardpipes", {**env, "PYTHONPATH": args.before}
    ns = argparse.Namespace(
        shuffle=1000, batch=64, epochs=args.epochs, timeout=args.timeout, omp_threads="1"
    )
    with open(args.manifest_tmp, "w") as f:
        json.dump(m, f)
    r = bench.run_trial(py[reader], reader, workers, args.manifest_tmp, ns, env)
    if "error" in r:
        return {"error": r["error"]}
    if r["samples"] != r["expected"]:
        return {"error": f"{r['samples']} samples of {r['expected']}"}
    return {"seconds": r["seconds"][-1], "cpu_s": r["cpu_s"], "rss_mb": r["rss_main_mb"]}


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _name(reader: str, workers: int, parallel: int) -> str:
    if reader == "s3fs_1":
        return "s3fs x1 (one connection)"
    if reader == "s3fs_n":
        return f"s3fs x{parallel} range readers"
    if reader == "before":
        return f"shardpipes before, {'in-process' if not workers else f'{workers} workers'}"
    return f"{reader} {'in-process' if not workers else f'{workers} workers'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--latencies", default="0,20,50", help="ms before each response (comma list)")
    ap.add_argument("--conn-mbps", type=float, default=50.0, help="MB/s per connection")
    ap.add_argument(
        "--link-mbps", type=float, default=0.0, help="MB/s of all connections together (0: none)"
    )
    ap.add_argument("--presets", default="large,small")
    ap.add_argument("--readers", default=",".join(f"{r}:{w}" for r, w in READERS))
    ap.add_argument("--parallel", type=int, default=16, help="threads of the s3fs xN reader")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="epochs per loader run, the last one timed (2: without worker start-up)",
    )
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--cache-dir", default=os.path.join(REPO, ".bench", "data"))
    ap.add_argument("--venv", default=os.path.join(REPO, ".bench", "venv-peers"))
    ap.add_argument(
        "--before",
        default=None,
        help="a pipes/ folder of another shardpipes source: adds its rows ('before')",
    )
    ap.add_argument("--relay-stats", action="store_true", help="relay prints counts per trial")
    ap.add_argument("--json", default=None, help="write every trial's figures here")
    ap.add_argument("--plot", default=None, help="write a PNG of MB/s against latency here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.child:
        _plain(args.child, rest, args.parallel)
        return 0
    import _venv
    from relay import Relay

    readers = []
    for item in args.readers.split(","):
        r, _, w = item.partition(":")
        readers.append((r, int(w or 0)))
    latencies = [float(x) for x in args.latencies.split(",")]
    presets = [p for p in args.presets.split(",") if p]
    if args.before:
        readers += [("before", 0), ("before", 2)]
    py = {"shardpipes": sys.executable, "before": sys.executable}
    if any(r == "webdataset" for r, _ in readers):
        wpy, why = _venv.ensure_peers_venv(args.venv, os.path.join(REPO, "constraints.txt"), log)
        if wpy is None:
            log(f"webdataset not measured: {why}")
            readers = [x for x in readers if x[0] != "webdataset"]
        py["webdataset"] = wpy
    local = {p: _data.ensure_dataset(PRESETS[p], args.cache_dir, log) for p in presets}
    args.manifest_tmp = os.path.join(REPO, ".bench", f"object_store-{os.getpid()}.json")
    moto, endpoint = _start_moto()
    results: list[dict] = []
    relays: dict[float, Relay] = {}
    try:
        remote = _upload(endpoint, local)
        for lat in latencies:  # all at once: trials go round-robin over latencies and readers
            relays[lat] = Relay(
                endpoint.split("//")[1],
                latency_ms=lat,
                conn_mbps=args.conn_mbps,
                link_mbps=args.link_mbps,
            )
        for trial in range(args.trials):
            for lat in latencies:
                relay = relays[lat]
                env = _env(relay.endpoint)
                for p in presets:
                    m = remote[p]
                    for reader, workers in readers:
                        t0 = time.perf_counter()
                        c0 = (_cpu(moto.pid), _cpu(relay.proc.pid))
                        r = _trial(reader, workers, m, env, args, py)
                        if args.relay_stats:
                            relay.proc.send_signal(signal.SIGUSR1)
                            time.sleep(0.2)
                        r["server_cpu_s"] = _cpu(moto.pid) - c0[0]
                        r["relay_cpu_s"] = _cpu(relay.proc.pid) - c0[1]
                        r.update(
                            preset=p,
                            latency_ms=lat,
                            reader=reader,
                            workers=workers,
                            trial=trial,
                            bytes=m["bytes"],
                            loadavg=os.getloadavg()[0],
                        )
                        if "seconds" in r:
                            r["mb_per_s"] = m["bytes"] / r["seconds"] / 1e6
                            r["cpu_use"] = _cpu_use(r, reader, args)
                        results.append(r)
                        what = r.get("error") or (
                            f"{r['mb_per_s']:.1f} MB/s; cpu s: client "
                            f"{r.get('cpu_s', float('nan')):.2f} moto {r['server_cpu_s']:.2f} "
                            f"relay {r['relay_cpu_s']:.2f} (cpu use {r['cpu_use']:.0%}); "
                            f"load {r['loadavg']:.1f}"
                        )
                        log(
                            f"[{lat:g} ms {trial + 1}/{args.trials}] {p:<5} "
                            f"{_name(reader, workers, args.parallel):<28} {what} "
                            f"({time.perf_counter() - t0:.1f} s)"
                        )
    finally:
        for relay in relays.values():
            relay.stop()
        moto.terminate()
        moto.wait(10)
        if os.path.exists(args.manifest_tmp):
            os.unlink(args.manifest_tmp)
    _report(results, readers, presets, latencies, local, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results}, f)
    if args.plot:
        _plot(results, readers, presets, latencies, args)
    return 0


def _cpu_use(r: dict, reader: str, args: argparse.Namespace) -> float:
    """CPU-seconds of reader, moto and relay per pass, over the pass's seconds and the cores.

    A loader row runs ``--epochs`` passes (its ``cpu_s`` is already per pass; moto's and the
    relay's are for the whole trial), a plain s3fs row one.
    """
    passes = 1 if reader.startswith("s3fs") else args.epochs
    cpu = r.get("cpu_s", 0.0) + (r["server_cpu_s"] + r["relay_cpu_s"]) / passes
    return cpu / r["seconds"] / (os.cpu_count() or 1)


def _best(results: list[dict], **key: object) -> tuple[float | None, float, int]:
    got = [
        r["mb_per_s"] for r in results if "mb_per_s" in r and all(r[k] == v for k, v in key.items())
    ]
    if not got:
        return None, 0.0, 0
    return max(got), (max(got) - min(got)) / max(got), len(got)


def _table(results, preset, readers, latencies, args, needs: str, cell) -> None:
    """One table of ``preset``: a row per reader, a column per latency, ``cell(trials)`` in each.

    ``trials``: that row's and latency's results that have ``needs`` (a failed trial has not).
    """
    print("\n| reader | " + " | ".join(f"{lat:g} ms" for lat in latencies) + " |")
    print("|---|" + "---:|" * len(latencies))
    for reader, workers in readers:
        cells = []
        for lat in latencies:
            key = (preset, reader, workers, lat)
            got = [
                r
                for r in results
                if needs in r and (r["preset"], r["reader"], r["workers"], r["latency_ms"]) == key
            ]
            cells.append(cell(got))
        print(f"| {_name(reader, workers, args.parallel)} | " + " | ".join(cells) + " |")


def _report(results, readers, presets, latencies, local, args) -> None:
    link = f", {args.link_mbps:g} MB/s for all together" if args.link_mbps else ""
    print(
        f"\nmoto behind relay.py: first-byte latency as given, {args.conn_mbps:g} MB/s per "
        f"connection{link}; MB/s of shard bytes, best of {args.trials} (spread)"
    )
    for p in presets:
        m = local[p]
        print(
            f"\n### {p}: {len(m['paths'])} shards of {min(m['sizes']) / 1e6:.1f}-"
            f"{max(m['sizes']) / 1e6:.1f} MB, {m['samples']:,} samples of "
            f"{m['preset']['payload_bytes']:,} B, {m['bytes'] / 1e6:.0f} MB"
        )

        def best_cell(got: list[dict]) -> str:
            if not got:
                return "failed"
            mbs = [r["mb_per_s"] for r in got]
            return f"{max(mbs):.0f} ({(max(mbs) - min(mbs)) / max(mbs):.0%})"

        _table(results, p, readers, latencies, args, "mb_per_s", best_cell)
        print(
            "\nCPU seconds per trial, median (reader with its workers / moto / relay): "
            "moto, the relay and the reader share the machine's cores"
        )
        _table(
            results, p, readers, latencies, args, "mb_per_s",
            lambda got: " / ".join(
                f"{statistics.median(r.get(k, float('nan')) for r in got):.2f}"
                for k in ("cpu_s", "server_cpu_s", "relay_cpu_s")
            ) if got else "-",
        )  # fmt: skip
        print(
            f"\nCPU use, median: reader + moto + relay CPU-s per pass / the pass's seconds / "
            f"{os.cpu_count()} cores (other work on the machine is not counted: see the load)"
        )
        _table(
            results, p, readers, latencies, args, "cpu_use",
            lambda got: f"{statistics.median(r['cpu_use'] for r in got):.0%}" if got else "-",
        )  # fmt: skip
        print()
        for lat in latencies:
            one, _, _ = _best(results, preset=p, reader="s3fs_1", workers=0, latency_ms=lat)
            many, _, _ = _best(results, preset=p, reader="s3fs_n", workers=0, latency_ms=lat)
            parts = []
            for reader, workers in readers:
                if reader.startswith("s3fs"):
                    continue
                best, _, _ = _best(
                    results, preset=p, reader=reader, workers=workers, latency_ms=lat
                )
                if best and many:
                    vs_one = f"{best / one:.1f}x one connection, " if one else ""
                    parts.append(
                        f"{_name(reader, workers, args.parallel)} {vs_one}{best / many:.0%} "
                        f"of the link (x{args.parallel})"
                    )
            if parts:
                print(f"- {lat:g} ms: " + "; ".join(parts))


def _plot(results, readers, presets, latencies, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.2), squeeze=False)
    for ax, p in zip(axes[0], presets, strict=True):
        for reader, workers in readers:
            ys = [
                _best(results, preset=p, reader=reader, workers=workers, latency_ms=lat)[0]
                for lat in latencies
            ]
            style = "--" if reader.startswith("s3fs") else "-"
            ax.plot(
                latencies,
                [y or 0 for y in ys],
                style,
                marker="o",
                label=_name(reader, workers, args.parallel),
            )
        ax.set_title(f"{p} preset, {args.conn_mbps:g} MB/s per connection")
        ax.set_xlabel("first-byte latency (ms)")
        ax.set_ylabel(f"MB/s (best of {args.trials})")
        ax.set_xticks(latencies)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    log(f"wrote {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
