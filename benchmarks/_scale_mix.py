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
- **threads and connections per process** (``--mixture-read`` alone runs only this): 35 small
  sources really read, over an HTTP server with Range support started here (each response
  held back ``--latency-ms``, as a store's first byte is), in a fresh reader process: once as
  ``mix()`` over indexed sources, once as 0.9's ``mux`` over shard lists without an index
  (whole shards streamed with read-ahead). Reported: the most threads of shardpipes alive
  after any sample (by name), the most connections the server held at once, the most remote
  streams holding a place, and the bound of each (``shardpipes.storage.pool``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


# --- threads and connections per reader process, measured -----------------------------------

READ_COUNTS = [40, 41]  # samples per shard of each source (two shards)
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        path = os.path.join(self.server.root, self.path.lstrip("/").split("?", 1)[0])
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        m = _RANGE.match(self.headers.get("Range", ""))
        start, end = (
            (0, len(data))
            if m is None
            else (int(m[1]), min(len(data), int(m[2] or len(data) - 1) + 1))
        )
        time.sleep(self.server.latency)  # the store's first byte
        self.send_response(200 if m is None else 206)
        self.send_header("Accept-Ranges", "bytes")
        if m is not None:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not head:
            self.wfile.write(data[start:end])


class _RangeServer(ThreadingHTTPServer):
    """Files under ``root`` with Range support; counts the connections it holds at once."""

    daemon_threads = True

    def __init__(self, root: str, latency: float) -> None:
        super().__init__(("127.0.0.1", 0), _RangeHandler)
        self.root, self.latency = root, latency
        self.now = self.peak = 0
        self.lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.now -= 1

    def reset_peak(self) -> None:
        with self.lock:
            self.peak = self.now


def read_task(args: dict[str, Any]) -> dict[str, Any]:
    """Read the mixture once; the threads, open streams and requests of this process."""
    import urllib.request

    from shardpipes.datapipes.iter import IterableWrapper
    from shardpipes.index import build_index

    try:
        from shardpipes.storage.pool import fetch_limits, process_pool
    except ImportError:  # a shardpipes from before the pool (PYTHONPATH=...): figures, no bound
        fetch_limits = process_pool = None

    base = args["base"]
    groups = [[f"{base}/{rel}" for rel in paths] for paths in args["sources"]]

    def peak_of(dp: Any) -> dict[str, Any]:
        urllib.request.urlopen(f"{base}/_reset").read()
        names: set[str] = set()
        peak = samples = 0
        for _ in dp:
            samples += 1
            ours = [t.name for t in threading.enumerate() if t.name.startswith("shardpipes-")]
            peak = max(peak, len(ours))
            names.update(ours)
        conns = int(urllib.request.urlopen(f"{base}/_peak").read())
        return {
            "samples": samples,
            "threads": peak,
            "thread_names": sorted(names),
            "connections": conns,
        }

    out: dict[str, Any] = {}
    sources = [
        IterableWrapper(urls).sharding_by_index(build_index(urls, progress=False))
        .open_files_by_fsspec().load_from_tar().webdataset()
        for urls in groups
    ]  # fmt: skip
    out["mix"] = peak_of(sources[0].mix(*sources[1:], repeat=[1] * len(sources)))
    pool = process_pool() if process_pool is not None else None
    streams_before = pool.peak_streams if pool is not None else 0
    plain = [
        IterableWrapper(urls).open_files_by_fsspec(mode="rb", block_size=1 << 16)
        .load_from_tar().webdataset()
        for urls in groups
    ]  # fmt: skip
    out["mux"] = peak_of(plain[0].mux(*plain[1:]))
    if pool is None or fetch_limits is None:
        return out
    out["mux"]["streams"] = max(pool.peak_streams, streams_before)
    out["mux"]["evictions"] = pool.evictions
    limits = fetch_limits()
    out["bound"] = {
        "threads": limits.threads + limits.openers,
        "connections": limits.threads + limits.openers + 1,
        "streams": limits.streams,
    }
    return out


class _ControlHandler(_RangeHandler):
    def _serve(self, head: bool) -> None:
        if self.path in ("/_reset", "/_peak"):
            if self.path == "/_reset":
                self.server.reset_peak()
            body = str(self.server.peak).encode()  # this request's connection included
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
            return
        super()._serve(head)


def read_main(opts: Any, run_task: Any, work: str) -> dict[str, Any]:
    """Serve 35 small sources over HTTP and read them in a fresh process (threads, connections)."""
    from shardpipes.synthetic import write_synthetic

    root = os.path.join(work, "http")
    rels = []
    for k in range(SOURCES):
        paths = write_synthetic(
            os.path.join(root, f"s{k:02d}"), shards=2, samples=READ_COUNTS, payload_bytes=4000
        )
        rels.append([os.path.relpath(p, root) for p in paths])
    server = _RangeServer(root, opts.latency_ms / 1000)
    server.RequestHandlerClass = _ControlHandler
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        host, port = server.server_address[:2]
        result = run_task(
            {"kind": "mixture-read", "base": f"http://{host}:{port}", "sources": rels},
            opts.budget * 4,
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    bound = result.get("bound", {})
    for name, what in (("mix", "mix() over indexed sources"), ("mux", "mux over shard lists")):
        r = result.get(name)
        if r is None:
            print(f"  {what}: {result.get('error') or result.get('skipped')}", flush=True)
            continue
        streams = (
            f", open streams {r['streams']} (bound {bound['streams']})" if "streams" in r else ""
        )
        print(
            f"  {SOURCES} sources read over HTTP ({opts.latency_ms:g} ms), {what}: {r['samples']} "
            f"samples; per process: shardpipes threads {r['threads']} (bound "
            f"{bound.get('threads')}), connections {r['connections']} (bound "
            f"{bound.get('connections')}){streams}",
            flush=True,
        )
    return result
