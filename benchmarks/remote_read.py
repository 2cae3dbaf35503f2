"""Sequential read throughput of one ~50 MB shard over loopback S3 (moto): s3fs vs our opener.

Starts moto's server in a child process on 127.0.0.1 (so it does not share the GIL with the
reader), uploads one synthetic shard of ~100 KB samples, and reports MB/s (median of N) for:

- plain s3fs ``fs.open().read(1 MiB)`` with its default (50 MiB read-ahead block) and 16 MiB blocks;
- our ``open_files_by_fsspec`` stream for several ``block_size`` x ``readahead``;
- the pipeline ``open -> load_from_tar -> webdataset`` on s3fs and on our opener with and
  without read-ahead, with no per-sample work, with ``--work-us`` of work in C that releases
  the GIL (as image decoders do), and with the same time of pure-Python work holding the GIL.

With ``--latency-ms`` and ``--conn-mbps`` the reads go through a shaping proxy (a child
process) that waits before each response and paces each connection, as a real object store
over a real network does (tens of ms to the first byte, ~100 MB/s per connection).

    python benchmarks/remote_read.py [--mb 50] [--repeat 5] [--work-us 1000]
    python benchmarks/remote_read.py --latency-ms 30 --conn-mbps 100
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.fsspec import open_url
from shardpipes.synthetic import write_synthetic

KEY, SECRET = "bench", "bench-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        if _answers(url + "/moto-api/"):
            return proc, url
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto did not start")


def _answers(url: str) -> bool:
    try:
        requests.get(url, timeout=1)
    except requests.ConnectionError:
        return False
    return True


_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _shaping_proxy(upstream: int, port: int, latency: float, rate: float) -> None:
    """Child process: forward to 127.0.0.1:upstream, wait ``latency`` s, pace at ``rate`` B/s."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn = http.client.HTTPConnection("127.0.0.1", upstream)
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            time.sleep(latency)  # time to first byte
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            if self.command == "HEAD":
                self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                self.end_headers()
                return
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            t0, step = time.perf_counter(), 256 << 10
            for i in range(0, len(data), step):
                self.wfile.write(data[i : i + step])
                ahead = (i + step) / rate - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)

        do_GET = do_HEAD = do_PUT = do_POST = forward

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def _start_proxy(
    endpoint: str, latency_ms: float, mbps: float
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    upstream = endpoint.rsplit(":", 1)[1]
    args = [
        sys.executable,
        __file__,
        "--proxy-child",
        upstream,
        str(port),
        str(latency_ms),
        str(mbps),
    ]
    proc = subprocess.Popen(args)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        if _answers(url + "/moto-api/"):
            return proc, url
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the shaping proxy did not start")


def _drain(f: Any) -> int:
    n = 0
    while b := f.read(1 << 20):
        n += len(b)
    return n


def _interleaved(
    rows: list[tuple[str, Callable[[], int], int]], repeat: int
) -> list[tuple[str, float]]:
    """MB/s (median) of each row; rounds run every row once, so load changes hit all alike."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for _ in range(repeat):
        for name, fn, nbytes in rows:
            t0 = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t0)
            if got != nbytes:
                raise RuntimeError(f"{name}: read {got} bytes, expected {nbytes}")
    return [(name, nbytes / statistics.median(times[name]) / 1e6) for name, _, nbytes in rows]


def _pipeline(pairs: Callable[[], Any], work: str, work_us: float) -> Callable[[], int]:
    """Read every sample, then spend ``work_us`` on it: ``gil`` in Python, ``nogil`` in C."""

    def run() -> int:
        n = 0
        for sample in IterableWrapper(pairs(), deepcopy=False).load_from_tar().webdataset():
            payload = sample[".bin"]
            n += len(payload)
            if work == "gil":  # Python code holding the GIL (per-sample logic, augmentations)
                end = time.perf_counter() + work_us / 1e6
                while time.perf_counter() < end:
                    pass
            elif work == "nogil":  # C code that releases the GIL (image decoders, hashing)
                end = time.perf_counter() + work_us / 1e6
                while time.perf_counter() < end:
                    hashlib.sha256(payload).digest()
        return n

    return run


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=int, default=50, help="shard size in MB (default 50)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work-us", type=float, default=1000.0, help="simulated work per sample")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="time to first byte (proxy)")
    ap.add_argument("--conn-mbps", type=float, default=0.0, help="MB/s per connection (proxy)")
    ap.add_argument("--proxy-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.proxy_child:
        up, port, lat, mbps = args.proxy_child
        _shaping_proxy(int(up), int(port), float(lat) / 1e3, float(mbps) * 1e6)
        return

    import s3fs

    proc, endpoint = _start_moto()
    procs = [proc]
    try:
        opts = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
        fs.mkdir("bench")
        with tempfile.TemporaryDirectory() as d:
            samples = args.mb * 10  # ~100 KB each
            (path,) = write_synthetic(d, shards=1, samples=samples, payload_bytes=100_000)
            with open(path, "rb") as f:
                data = f.read()
        fs.pipe_file("bench/shard.tar", data)
        shaped = args.latency_ms > 0 or args.conn_mbps > 0
        if shaped:
            proxy, endpoint = _start_proxy(endpoint, args.latency_ms, args.conn_mbps or 1e6)
            procs.append(proxy)
            opts = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
        url = "s3://bench/shard.tar"
        size = len(data)
        payload = samples * 100_000
        via = (
            f", via {args.latency_ms:g} ms / {args.conn_mbps:g} MB/s per connection"
            if shaped
            else ""
        )
        print(f"shard: {size / 1e6:.1f} MB, {samples} samples; moto{via}; median of {args.repeat}")
        print(f"{'reader':58s} {'MB/s':>8s}")

        def plain(**kw: Any) -> Callable[[], int]:
            return lambda: _drain(fs.open("bench/shard.tar", "rb", **kw))

        def ours(bs: int, ra: int) -> Callable[[], int]:
            return lambda: _drain(open_url(url, "rb", opts, block_size=bs, readahead=ra))

        rows: list[tuple[str, Callable[[], int], int]] = [
            ("s3fs open().read(1 MiB), default 50 MiB block", plain(), size),
            ("s3fs open(block_size=16 MiB).read(1 MiB)", plain(block_size=16 << 20), size),
        ]
        sizes = (8 << 20, 16 << 20) if shaped else (4 << 20, 8 << 20, 16 << 20, 32 << 20)
        rows.extend(
            (f"shardpipes block_size={bs >> 20} MiB readahead={ra}", ours(bs, ra), size)
            for bs in sizes
            for ra in (0, 1, 2, 4)
        )
        w = args.work_us
        openers: list[tuple[str, Callable[[], Any]]] = [
            ("s3fs default open", lambda: [(url, fs.open("bench/shard.tar", "rb"))]),
            (
                "shardpipes 16 MiB x 0",
                lambda: [(url, open_url(url, "rb", opts, block_size=16 << 20, readahead=0))],
            ),
            (
                "shardpipes 16 MiB x 2",
                lambda: [(url, open_url(url, "rb", opts, block_size=16 << 20, readahead=2))],
            ),
            ("shardpipes defaults", lambda: [(url, open_url(url, "rb", opts))]),
        ]
        for work in ("none", "nogil", "gil"):
            label = "no work" if work == "none" else f"{w:.0f} us/sample {work} work"
            rows.extend(
                (f"pipeline, {name}, {label}", _pipeline(pairs, work, w), payload)
                for name, pairs in openers
            )
        for name, mbs in _interleaved(rows, args.repeat):
            print(f"{name:58s} {mbs:8.1f}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
