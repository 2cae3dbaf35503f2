"""A TCP relay on 127.0.0.1 that makes a local HTTP server behave like an object store far away.

Each connection to the relay gets its own connection to the upstream server (moto, in the
benchmarks). Two things are added to what flows back to the client:

- **first-byte latency**: the first bytes of each HTTP response are held ``--latency-ms``
  before they are forwarded (a response is what the server sends after a request; HTTP/1.1
  clients such as aiohttp and botocore do not pipeline, so request and response alternate);
- **a per-connection bandwidth cap**: each response is paced at ``--conn-mbps`` MB/s from its
  first byte, so one connection reads at most that fast, and throughput grows only with the
  number of connections, as with S3 or GCS over a real network;
- **a cap on the sum** (``--link-mbps``, 0: none): every connection's bytes together are paced
  at that rate, as a host's network link paces them: the link, not the CPU, is then the limit
  once enough connections are open.

Bounded: at most ``--max-connections`` at once (more wait in the listen backlog), at most one
256 KiB chunk buffered per direction and connection (reads wait for the writer to drain). It
stops by itself after ``--max-seconds``, when its parent process exits, or on SIGTERM.

    python benchmarks/relay.py --upstream 127.0.0.1:5000 --latency-ms 50 --conn-mbps 50
    # prints "RELAY 127.0.0.1:<port>" once it listens (port 0 = a free port)

From Python: ``with Relay("127.0.0.1:5000", latency_ms=50, conn_mbps=50) as r: r.endpoint``.

``--link-mbps`` paces each chunk (256 KiB) as it is written: a connection waits for its turn
on the link, so the sum holds over any stretch longer than a few chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["Relay", "main"]

CHUNK = 256 << 10


class _Conn:
    """One client connection: two pumps, and the state that ties a response to its request."""

    def __init__(
        self, latency: float, rate: float, stats: dict[str, int], link: _Link | None = None
    ) -> None:
        self.latency = latency
        self.rate = rate  # bytes/s per connection; 0 = no cap
        self.stats = stats
        self.link = link
        self.awaiting = False  # a request went up; its response's first byte not yet seen

    async def up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK):
            if not self.awaiting:
                self.awaiting = True
                self.stats["requests"] += 1
                method = data[:8].split(b" ", 1)[0].decode("ascii", "replace")
                self.stats[method] = self.stats.get(method, 0) + 1
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        t0, sent = loop.time(), 0
        while data := await reader.read(CHUNK):
            if self.awaiting:  # the first bytes of a new response
                self.awaiting = False
                if self.latency:
                    await asyncio.sleep(self.latency)
                t0, sent = loop.time(), 0
            writer.write(data)
            await writer.drain()
            sent += len(data)
            self.stats["bytes"] += len(data)
            ahead = t0 + sent / self.rate - loop.time() if self.rate else 0.0
            if self.link is not None:
                ahead = max(ahead, self.link.take(len(data), loop.time()))
            if ahead > 0:
                await asyncio.sleep(ahead)
        writer.close()


class _Link:
    """The sum of every connection's bytes, paced at ``rate`` bytes/s (one event loop: no lock)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0  # when the link has sent everything handed to it so far

    def take(self, nbytes: int, now: float) -> float:
        """Seconds the sender of ``nbytes`` (handed over ``now``) waits for the link."""
        self.free_at = max(self.free_at, now) + nbytes / self.rate
        return self.free_at - now


async def _serve(args: argparse.Namespace) -> None:
    host, port = args.upstream.rsplit(":", 1)
    stats: dict[str, int] = {"connections": 0, "requests": 0, "bytes": 0}
    slots = asyncio.Semaphore(args.max_connections)
    link = _Link(args.link_mbps * 1e6) if args.link_mbps else None
    live: set[asyncio.Task[None]] = set()  # strong references: asyncio keeps only weak ones

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            live.add(me)  # type: ignore[arg-type]
            me.add_done_callback(live.discard)
        async with slots:
            stats["connections"] += 1
            try:
                u_reader, u_writer = await asyncio.open_connection(host, int(port), limit=CHUNK)
            except OSError:
                c_writer.close()
                return
            conn = _Conn(args.latency_ms / 1e3, args.conn_mbps * 1e6, stats, link)
            pumps = [
                asyncio.ensure_future(conn.up(c_reader, u_writer)),
                asyncio.ensure_future(conn.down(u_reader, c_writer)),
            ]
            live.update(pumps)
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
                await asyncio.gather(*pumps, return_exceptions=True)
            finally:
                for p in pumps:
                    p.cancel()
                    live.discard(p)
                for w in (u_writer, c_writer):
                    w.close()

    server = await asyncio.start_server(
        handle, "127.0.0.1", args.port, limit=CHUNK, backlog=args.max_connections
    )
    sock = server.sockets[0].getsockname()
    print(f"RELAY {sock[0]}:{sock[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: print(f"RELAY-STATS {stats}", file=sys.stderr, flush=True)
    )
    parent, deadline = os.getppid(), time.monotonic() + args.max_seconds
    async with server:
        while not stop.is_set() and time.monotonic() < deadline and os.getppid() == parent:
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:  # noqa: PERF203  # the periodic check
                pass
        server.close()
        for task in asyncio.all_tasks():  # connections still open: end them quietly
            if task is not asyncio.current_task():
                task.cancel()
    print(f"RELAY-STATS {stats}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--upstream", required=True, help="host:port of the HTTP server to relay")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="added before each response")
    ap.add_argument("--conn-mbps", type=float, default=50.0, help="MB/s per connection (0: none)")
    ap.add_argument(
        "--link-mbps", type=float, default=0.0, help="MB/s of all connections (0: none)"
    )
    ap.add_argument("--max-connections", type=int, default=256)
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(parse_args(argv)))


class Relay:
    """The relay as a child process (its own interpreter: it never shares the reader's GIL)."""

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float,
        conn_mbps: float,
        link_mbps: float = 0.0,
        max_seconds: float = 3600.0,
    ) -> None:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            f"--upstream={upstream}",
            f"--latency-ms={latency_ms}",
            f"--conn-mbps={conn_mbps}",
            f"--link-mbps={link_mbps}",
            f"--max-seconds={max_seconds}",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("RELAY "):
            self.proc.kill()
            raise RuntimeError(f"the relay did not start: {line!r}")
        self.endpoint = "http://" + line.split()[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    main()
