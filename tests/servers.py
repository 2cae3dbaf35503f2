"""Real servers on 127.0.0.1 for the remote-storage tests, started and stopped by fixtures.

- ``s3``: moto's S3 server (``ThreadedMotoServer``, port 0, one per session, reset per test),
  reached through s3fs with dummy keys.
- ``gcs``: gcp-storage-emulator (in memory, port 0, one per session, wiped per test), reached
  through gcsfs with ``STORAGE_EMULATOR_HOST``.
- ``http_server``: a ``ThreadingHTTPServer`` serving files from memory that honours Range
  requests, with per-test behaviour: no Content-Length, no ranges, 401/403/404, 503 for the
  first K requests, a connection dropped after N bytes for the first K requests, a stall.
- ``fault_proxy``: a reverse proxy put in front of moto or the GCS emulator that counts
  requests and injects the same faults there.

Every server listens on 127.0.0.1; every URL points there.
"""

from __future__ import annotations

import os

# gcsfs reads this when it is imported: with the experimental zonal/HNS support on (its
# default), every bucket costs a 60 s gRPC time-out against the emulator.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import contextlib
import http.client
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fsspec
import pytest
import requests

from shardpipes.datapipes.iter import IterableWrapper

DUMMY_KEY = "AKIDSHARDPIPESTEST"
DUMMY_SECRET = "shardpipes-dummy-secret-0123456789"

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
}


# --- fault injection shared by the HTTP server and the proxy ------------------------------------


@dataclass
class Faults:
    """What to do to the next data responses (GETs with a body) whose path contains ``match``.

    Attributes:
        match: Substring of the request path that faults apply to ("" = every GET).
        methods: Methods faults apply to; ``fail`` alone also applies to HEAD if listed.
        after: Let this many matching GETs through before the faults start.
        fail_first: Answer this many matching GETs with ``fail_status`` instead.
        fail_status: Status of those answers.
        drop_first: Cut the connection of this many matching GETs after ``drop_after`` bytes
            of the body (the headers announce the full length).
        drop_after: Body bytes sent before the cut.
        stall_first: Stop for ``stall_seconds`` after ``drop_after`` body bytes in this many
            matching GETs, then send the rest.
        stall_seconds: Length of a stall.
    """

    match: str = ""
    methods: tuple[str, ...] = ("GET",)
    after: int = 0
    fail_first: int = 0
    fail_status: int = 503
    drop_first: int = 0
    drop_after: int = 0
    stall_first: int = 0
    stall_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, path: str, method: str = "GET") -> str | None:
        """Decide (and count) the fault for one request: ``fail``, ``drop``, ``stall`` or None."""
        if self.match not in path or method not in self.methods:
            return None
        with self._lock:
            if method != "GET":  # no body to cut or stall
                if self.fail_first > 0:
                    self.fail_first -= 1
                    return "fail"
                return None
            if self.after > 0:
                self.after -= 1
                return None
            if self.fail_first > 0:
                self.fail_first -= 1
                return "fail"
            if self.drop_first > 0:
                self.drop_first -= 1
                return "drop"
            if self.stall_first > 0:
                self.stall_first -= 1
                return "stall"
        return None


@dataclass
class Record:
    """One request as a server saw it."""

    method: str
    path: str
    range: str | None
    status: int
    sent: int  # body bytes written
    headers: dict[str, str]
    fault: str | None


class _Log:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def add(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)

    def gets(self, match: str = "") -> list[Record]:
        """Data requests (GET) whose path contains ``match``."""
        with self._lock:
            return [r for r in self.records if r.method == "GET" and match in r.path]

    def bytes_served(self, match: str = "") -> int:
        """Body bytes of complete, fault-free GET responses to paths containing ``match``."""
        return sum(r.sent for r in self.gets(match) if r.fault is None and r.status in (200, 206))


def _send_body(
    handler: BaseHTTPRequestHandler, body: bytes, fault: str | None, faults: Faults
) -> int:
    """Write ``body`` applying ``fault``; return the bytes written."""
    if fault == "drop":
        n = min(faults.drop_after, len(body))
        handler.wfile.write(body[:n])
        handler.wfile.flush()
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return n
    if fault == "stall":
        n = min(faults.drop_after, len(body))
        handler.wfile.write(body[:n])
        handler.wfile.flush()
        time.sleep(faults.stall_seconds)
        try:
            handler.wfile.write(body[n:])
        except OSError:  # the client gave up waiting and closed the connection
            handler.close_connection = True
            return n
        return len(body)
    handler.wfile.write(body)
    return len(body)


# --- the Range-honouring HTTP file server --------------------------------------------------------


@dataclass
class HTTPBehaviour:
    """How the test HTTP server answers; tests change it freely.

    Attributes:
        files: Path (``/name.tar``) to content.
        content_length: Send Content-Length (else the body ends when the connection closes).
        ranges: Honour Range headers (else always answer 200 with the whole body).
        advertise_no_ranges: Send ``Accept-Ranges: none``.
        status: Path to a status to answer instead (401, 403, 404, ...).
        require: Header name and value every request must carry, else 401.
        faults: Faults for GETs.
        latency: Seconds each GET of a file waits before its answer (an object store's
            first-byte latency; it changes what a reader measures, never what it gets).
    """

    files: dict[str, bytes] = field(default_factory=dict)
    content_length: bool = True
    ranges: bool = True
    advertise_no_ranges: bool = False
    status: dict[str, int] = field(default_factory=dict)
    require: tuple[str, str] | None = None
    faults: Faults = field(default_factory=Faults)
    latency: float = 0.0


class _FileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms ACK wait
    server: _FileServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _reply(self, status: int, headers: dict[str, str], body: bytes, fault: str | None) -> None:
        b = self.server.behaviour
        rec = Record(
            self.command, self.path, self.headers.get("Range"), status, 0, dict(self.headers), fault
        )
        self.server.log.add(rec)  # before answering: the client may act on the answer at once
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if b.content_length or status >= 400:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            rec.sent = len(body)  # counted before the client can see it (a fault corrects it)
            rec.sent = _send_body(self, body, fault, b.faults)

    def _serve(self, head: bool) -> None:
        b = self.server.behaviour
        path = self.path.split("?", 1)[0]
        if b.require is not None and self.headers.get(b.require[0]) != b.require[1]:
            return self._reply(401, {}, b"unauthorized", None)
        if path in b.status:
            return self._reply(b.status[path], {}, b"error", None)
        if path.endswith("/"):  # an HTML index of the files below, as web servers make
            names = sorted(p[len(path) :] for p in b.files if p.startswith(path))
            links = "".join(f'<a href="{n}">{n}</a>\n' for n in names if "/" not in n)
            html = f"<html><body>\n{links}</body></html>\n".encode()
            return self._reply(200, {"Content-Type": "text/html"}, html, None)
        data = b.files.get(path)
        if data is None:
            return self._reply(404, {}, b"not found", None)
        fault = b.faults.take(path, self.command)
        if fault == "fail":
            return self._reply(b.faults.fail_status, {}, b"unavailable", fault)
        headers = {"Content-Type": "application/x-tar"}
        if b.advertise_no_ranges:
            headers["Accept-Ranges"] = "none"
        elif b.ranges:
            headers["Accept-Ranges"] = "bytes"
        m = _RANGE.match(self.headers.get("Range", "")) if b.ranges else None
        if m is None:
            return self._reply(200, headers, data, fault)
        first, last = m.groups()
        if first == "":
            start, end = max(len(data) - int(last), 0), len(data)
        else:
            start, end = int(first), min(int(last) + 1 if last else len(data), len(data))
        if start >= len(data):
            headers["Content-Range"] = f"bytes */{len(data)}"
            return self._reply(416, headers, b"", None)
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self.server.flight.change(+1, end - start)
        try:
            if b.latency:
                time.sleep(b.latency)
            return self._reply(206, headers, data[start:end], fault)
        finally:
            self.server.flight.change(-1, -(end - start))


class _QuietServer(ThreadingHTTPServer):
    """A threading server that does not print clients hanging up (faults make them do that)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Connections:
    """Connections a server holds open now, and the most it held at once (one thread each)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self._lock = threading.Lock()

    def change(self, by: int) -> None:
        with self._lock:
            self.now += by
            self.peak = max(self.peak, self.now)

    def reset_peak(self) -> None:
        """Count the peak from now on (from the connections open now)."""
        with self._lock:
            self.peak = self.now


class Flight:
    """Range requests being answered now (and their bytes), and the most at once."""

    def __init__(self) -> None:
        self.requests = self.bytes = 0
        self.peak_requests = self.peak_bytes = 0
        self._lock = threading.Lock()

    def change(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.peak_requests = max(self.peak_requests, self.requests)
            self.peak_bytes = max(self.peak_bytes, self.bytes)


class _FileServer(_QuietServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FileHandler)
        self.behaviour = HTTPBehaviour()
        self.log = _Log()
        self.connections = Connections()
        self.flight = Flight()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        self.connections.change(+1)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.change(-1)


@dataclass
class HTTPServerHandle:
    """A running test HTTP server: its base URL, behaviour, request log and open connections."""

    url: str
    behaviour: HTTPBehaviour
    log: _Log
    connections: Connections = field(default_factory=Connections)
    flight: Flight = field(default_factory=Flight)

    def add(self, name: str, data: bytes) -> str:
        """Serve ``data`` at ``/name`` and return its URL."""
        self.behaviour.files["/" + name] = data
        return f"{self.url}/{name}"


def _serve(server: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return t


@contextlib.contextmanager
def serving_http() -> Iterator[HTTPServerHandle]:
    """Run a Range-honouring HTTP server on 127.0.0.1 (port 0) for the ``with`` block."""
    server = _FileServer()
    thread = _serve(server)
    host, port = server.server_address[:2]
    try:
        yield HTTPServerHandle(
            f"http://{host}:{port}",
            server.behaviour,
            server.log,
            server.connections,
            server.flight,
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def http_server() -> Iterator[HTTPServerHandle]:
    """A Range-honouring HTTP server on 127.0.0.1 (port 0), serving ``behaviour.files``."""
    with serving_http() as handle:
        yield handle


# --- a fault-injecting reverse proxy -------------------------------------------------------------


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            length_header = resp.getheader("Content-Length")
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            status = resp.status
        finally:
            conn.close()
        faults = self.server.faults
        fault = None
        if status in (200, 206) and (data or self.command == "HEAD"):
            fault = faults.take(self.path, self.command)
        if fault == "fail":
            status, data, out_headers = faults.fail_status, b"", []
        rec = Record(
            self.command, self.path, self.headers.get("Range"), status, 0, dict(self.headers), fault
        )
        self.server.log.add(rec)  # before answering: the client may act on the answer at once
        self.send_response(status)
        for k, v in out_headers:
            self.send_header(k, v)
        if self.command != "HEAD" or fault == "fail":
            self.send_header("Content-Length", str(len(data)))
        elif length_header is not None:
            self.send_header("Content-Length", length_header)  # HEAD: the object's size
        self.end_headers()
        if self.command != "HEAD":
            rec.sent = len(data)  # counted before the client can see it (a fault corrects it)
            rec.sent = _send_body(self, data, fault, faults)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _forward


class _ProxyServer(_QuietServer):
    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.faults = Faults()
        self.log = _Log()


@dataclass
class ProxyHandle:
    """A running proxy: its base URL, the faults it injects and its request log."""

    url: str
    faults: Faults
    log: _Log
    server: _ProxyServer

    def set_faults(self, **kwargs: Any) -> Faults:
        """Replace the faults with ``Faults(**kwargs)``."""
        self.server.faults = self.faults = Faults(**kwargs)
        return self.faults


@pytest.fixture
def fault_proxy() -> Any:
    """A factory: ``fault_proxy(upstream_url)`` starts a proxy to it on 127.0.0.1 (port 0)."""
    started: list[tuple[_ProxyServer, threading.Thread]] = []

    def start(upstream_url: str) -> ProxyHandle:
        host, _, port = upstream_url.split("://", 1)[1].rstrip("/").partition(":")
        if host != "127.0.0.1":
            raise ValueError(f"the proxy only forwards to 127.0.0.1, not {upstream_url}")
        server = _ProxyServer((host, int(port)))
        started.append((server, _serve(server)))
        h, p = server.server_address[:2]
        return ProxyHandle(f"http://{h}:{p}", server.faults, server.log, server)

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- S3: moto's server ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Any:
    """moto's S3 server on 127.0.0.1 (port 0) for the whole session; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class S3Env:
    """The S3 server of one test: endpoint, storage options for s3fs, and helpers."""

    endpoint: str

    def options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """s3fs storage options for the (or another, e.g. a proxy's) endpoint, dummy keys."""
        opts: dict[str, Any] = {
            "key": DUMMY_KEY,
            "secret": DUMMY_SECRET,
            "client_kwargs": {"endpoint_url": endpoint or self.endpoint},
        }
        opts.update(extra)
        return opts

    def fs(self) -> Any:
        """A fresh s3fs filesystem on the server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options())

    def put(self, bucket: str, files: dict[str, bytes]) -> list[str]:
        """Create ``bucket`` (if needed), upload ``{key: data}``, return the ``s3://`` URLs."""
        fs = self.fs()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for key, data in files.items():
            fs.pipe_file(f"{bucket}/{key}", data)
        return [f"s3://{bucket}/{key}" for key in files]


@pytest.fixture
def s3(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> S3Env:
    """A reset moto server, and an environment without real AWS credentials or config."""
    requests.post(f"{moto_server}/moto-api/reset", timeout=10).raise_for_status()
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.fspath(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.fspath(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return S3Env(moto_server)


# --- GCS: gcp-storage-emulator --------------------------------------------------------------------


@pytest.fixture(scope="session")
def gcs_server() -> Any:
    """gcp-storage-emulator in memory on 127.0.0.1 (port 0) for the session; yields (url, server)."""
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    # The emulator does not report the bound port; its API thread's HTTPServer knows it.
    host, port = server._api._httpd.server_address[:2]
    yield f"http://{host}:{port}", server
    server.stop()


@dataclass
class GCSEnv:
    """The GCS emulator of one test: endpoint, storage options for gcsfs, and helpers."""

    endpoint: str

    def options(self, **extra: Any) -> dict[str, Any]:
        """gcsfs storage options: anonymous token; the endpoint comes from STORAGE_EMULATOR_HOST."""
        opts: dict[str, Any] = {"token": "anon", "project": "shardpipes-test"}
        opts.update(extra)
        return opts

    def fs(self) -> Any:
        """A fresh gcsfs filesystem on the emulator."""
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True, **self.options())

    def put(self, bucket: str, files: dict[str, bytes]) -> list[str]:
        """Create ``bucket`` (if needed), upload ``{key: data}``, return the ``gs://`` URLs."""
        fs = self.fs()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for key, data in files.items():
            fs.pipe_file(f"{bucket}/{key}", data)
        return [f"gs://{bucket}/{key}" for key in files]


@pytest.fixture
def gcs(gcs_server: Any, monkeypatch: pytest.MonkeyPatch) -> GCSEnv:
    """A wiped emulator, with ``STORAGE_EMULATOR_HOST`` pointing at it."""
    url, server = gcs_server
    server.wipe()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return GCSEnv(url)


# --- shards and what they hold -------------------------------------------------------------------


@dataclass
class Shards:
    """The seven synthetic shards of ``shard_dir`` as bytes, and the samples they hold in order."""

    directory: str
    data: dict[str, bytes]  # name -> content, in shard order
    expected: list[tuple[str, str, int]]  # (shard name, key, id) for every sample, in order

    @property
    def names(self) -> list[str]:
        return list(self.data)


def read_samples(urls: list[str], **open_kwargs: Any) -> list[tuple[str, str, int]]:
    """``(shard name, key, id)`` of every sample read from ``urls`` through the whole pipeline."""
    dp = (
        IterableWrapper(urls)
        .open_files_by_fsspec(**open_kwargs)
        .load_from_tar()
        .webdataset()
        .decode()
    )
    return [(s["__url__"].rsplit("/", 1)[-1], s["__key__"], s[".json"]["id"]) for s in dp]


def requests_until_it_fails(
    log: _Log, fail: Callable[[int], object], retries: Sequence[int] = (0, 5)
) -> list[int]:
    """Requests the server logged while ``fail(n)`` ran (and raised), for each ``n`` in ``retries``.

    A permanent error (404, 403) must cost as many requests with five retries as with none:
    counted on the server, never timed. fsspec instances are dropped before each call, so
    no cache answers in place of the server.
    """
    counts = []
    for n in retries:
        fsspec.AbstractFileSystem.clear_instance_cache()
        for cls in fsspec.registry.values():
            cls.clear_instance_cache()
        before = len(log.records)
        fail(n)
        counts.append(len(log.records) - before)
    return counts


def retry_waits(records: Sequence[logging.LogRecord]) -> list[str]:
    """The waits shardpipes announced before its retries (``"0.05s"``...), from caplog records."""
    ours = "\n".join(r.getMessage() for r in records if r.name.startswith("shardpipes"))
    return re.findall(r"retrying in (\S+s)$", ours, re.M)


@pytest.fixture
def shards(shard_dir: str) -> Shards:
    """The ``shard_dir`` shards (40-100 KB each) as bytes, with the samples read locally."""
    names = sorted(n for n in os.listdir(shard_dir) if n.endswith(".tar"))
    paths = [os.path.join(shard_dir, n) for n in names]
    data = {}
    for name, path in zip(names, paths, strict=True):
        with open(path, "rb") as f:
            data[name] = f.read()
    return Shards(shard_dir, data, read_samples(paths))
