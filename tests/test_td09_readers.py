"""torchdata 0.9's HttpReader/OnlineReader (fsspec HTTP) and S3FileLister/S3FileLoader (s3fs), on local servers."""

from __future__ import annotations

import fsspec
import pytest

from servers import HTTPServerHandle, S3Env
from shardpipes.datapipes.iter import (
    HttpReader,
    IterableWrapper,
    OnlineReader,
    S3FileLister,
    S3FileLoader,
)


@pytest.mark.http
def test_http_reader_and_online_reader_stream_the_body(http_server: HTTPServerHandle):
    url = http_server.add("a.bin", b"hello http")
    assert [(u, s.read()) for u, s in HttpReader(IterableWrapper([url]))] == [(url, b"hello http")]
    assert [s.read() for _, s in IterableWrapper([url]).read_from_remote(timeout=30)] == [
        b"hello http"
    ]


@pytest.mark.http
def test_http_reader_skip_on_error_warns_and_goes_on(http_server: HTTPServerHandle):
    good = http_server.add("b.bin", b"ok")
    dp = OnlineReader(IterableWrapper([f"{http_server.url}/missing.bin", good]), skip_on_error=True)
    with pytest.warns(UserWarning, match="missing.bin"):
        assert [s.read() for _, s in dp] == [b"ok"]


@pytest.mark.s3
def test_s3_file_lister_and_loader_through_s3fs(s3: S3Env):
    opts = s3.options()
    fs = fsspec.filesystem("s3", **opts)
    fs.mkdir("td09")
    for name in ("d/x.tar", "d/y.tar", "d/z.txt", "other/w.tar"):
        fs.pipe(f"td09/{name}", name.encode())
    lister = S3FileLister(IterableWrapper(["s3://td09/d/"]), masks="*.tar", storage_options=opts)
    urls = list(lister)
    assert urls == ["s3://td09/d/x.tar", "s3://td09/d/y.tar"]
    loaded = S3FileLoader(IterableWrapper(urls), storage_options=opts)
    assert [(u, s.read()) for u, s in loaded] == [(urls[0], b"d/x.tar"), (urls[1], b"d/y.tar")]
