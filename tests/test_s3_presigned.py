"""S3 ranges read as GETs of a presigned URL (``storage/remote.py``): the same bytes, the same retries.

Real moto behind the fault-injecting proxy; requests are counted at the proxy, never timed.
"""

from __future__ import annotations

import pytest

from servers import DUMMY_KEY
from shardpipes.datapipes.iter.fsspec import open_url
from shardpipes.errors import RetriesExhaustedError
from shardpipes.storage.counters import COUNTERS
from shardpipes.storage.remote import presign_ok
from shardpipes.storage.source import resolve

pytestmark = pytest.mark.s3

DATA = bytes(range(256)) * 1024  # 256 KiB: 4 blocks of 64 KiB
BLOCK = 64 << 10


def _read(url, options, **kw):
    with open_url(url, storage_options=options, block_size=BLOCK, backoff=0.01, **kw) as f:
        return f.read(), f.attempts


def _presigned(gets):
    return [g for g in gets if "Signature=" in g.path]


def _v4(s3, endpoint):
    """Options whose client presigns with SigV4 (botocore's default here, us-east-1, is SigV2)."""
    return s3.options(endpoint, config_kwargs={"signature_version": "s3v4"})


def test_ranges_are_presigned_gets_of_the_same_bytes(s3, fault_proxy):
    (url,) = s3.put("data", {"a.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    data, attempts = _read(url, _v4(s3, proxy.url))
    assert data == DATA and attempts == 4
    gets = proxy.log.gets("a.bin")
    assert len(_presigned(gets)) == len(gets) == 4  # every range, one GET each
    assert sorted(g.range for g in gets) == sorted(
        f"bytes={i}-{i + BLOCK - 1}" for i in range(0, len(DATA), BLOCK)
    )
    assert all(f"X-Amz-Credential={DUMMY_KEY}%2F" in g.path for g in gets)  # SigV4, our key


def test_a_503_is_retried_at_the_same_range_and_counted(s3, fault_proxy):
    (url,) = s3.put("data", {"b.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match="b.bin", fail_first=1, fail_status=503)
    before = COUNTERS.totals()["retries"].get("HTTP 503", 0)
    data, attempts = _read(url, _v4(s3, proxy.url))
    assert data == DATA and attempts == 5
    assert COUNTERS.totals()["retries"].get("HTTP 503", 0) == before + 1
    gets = proxy.log.gets("b.bin")
    failed = [g for g in gets if g.fault == "fail"]
    assert len(failed) == 1 and [g.range for g in gets].count(failed[0].range) == 2
    assert len(_presigned(gets)) == 5  # the retry is presigned too


def test_a_cut_answer_is_asked_again_at_the_same_range(s3, fault_proxy):
    (url,) = s3.put("data", {"c.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match="c.bin", drop_first=1, drop_after=1000)
    data, attempts = _read(url, _v4(s3, proxy.url))
    assert data == DATA and attempts == 5
    gets = proxy.log.gets("c.bin")
    cut = [g for g in gets if g.fault == "drop"]
    assert len(cut) == 1 and [g.range for g in gets].count(cut[0].range) == 2


def test_what_a_presigned_get_cannot_settle_is_read_through_s3fs(s3, fault_proxy):
    (url,) = s3.put("data", {"d.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match="d.bin", fail_first=1, fail_status=400)
    data, _ = _read(url, _v4(s3, proxy.url), readahead=0)
    assert data == DATA
    gets = proxy.log.gets("d.bin")
    assert gets[0].fault == "fail" and "Signature=" in gets[0].path
    # From then on signed by botocore, in the header: the stream no longer presigns.
    assert [g.range for g in gets[1:]] == [
        f"bytes={i}-{i + BLOCK - 1}" for i in range(0, len(DATA), BLOCK)
    ]
    assert not _presigned(gets[1:])
    assert all("Credential=" in g.headers.get("Authorization", "") for g in gets[1:])


def test_errors_name_the_s3_url_never_the_signed_one(s3, fault_proxy):
    (url,) = s3.put("data", {"e.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(match="e.bin", fail_first=100, fail_status=503)
    with pytest.raises(RetriesExhaustedError) as err:
        _read(url, _v4(s3, proxy.url), retries=1, readahead=0)
    message = str(err.value)
    assert message.startswith(url) and "HTTP 503" in message
    assert "Signature" not in message and DUMMY_KEY not in message and "?" not in message


def test_presigning_is_left_to_botocore_where_it_would_add_to_the_request(s3, monkeypatch):
    url = "s3://data/a.bin"
    assert presign_ok(resolve(url, s3.options()).fs, "data/a.bin")
    assert not presign_ok(resolve(url, s3.options(requester_pays=True)).fs, "data/a.bin")
    assert not presign_ok(resolve(url, s3.options(version_aware=True)).fs, "data/a.bin")
    sse_c = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}
    assert not presign_ok(resolve(url, s3.options(s3_additional_kwargs=sse_c)).fs, "data/a.bin")
    opts = s3.options()
    opts["client_kwargs"] = {**opts["client_kwargs"], "verify": False}
    assert not presign_ok(resolve(url, opts).fs, "data/a.bin")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert not presign_ok(resolve(url, s3.options()).fs, "data/a.bin")
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("SHARDPIPES_S3_PRESIGNED", "0")
    assert not presign_ok(resolve(url, s3.options()).fs, "data/a.bin")


def test_where_botocore_would_presign_with_sigv2_ranges_go_through_s3fs(s3, fault_proxy):
    # S3 refuses SigV2 on buckets created after June 24, 2020: a SigV2 URL would cost each
    # stream a refused GET, so none is sent; the ranges are s3fs's own signed requests.
    (url,) = s3.put("data", {"a.bin": DATA})
    proxy = fault_proxy(s3.endpoint)
    data, attempts = _read(url, s3.options(proxy.url))
    assert data == DATA and attempts == 4
    gets = proxy.log.gets("a.bin")
    assert len(gets) == 4 and not _presigned(gets)
    assert all("Credential=" in g.headers.get("Authorization", "") for g in gets)
    # The client's configuration decides it: remembered for the filesystem, so the next
    # streams do not presign again (0.4-0.8 ms of CPU each).
    assert not presign_ok(resolve(url, s3.options(proxy.url)).fs, "data/a.bin")
    assert presign_ok(resolve(url, _v4(s3, proxy.url)).fs, "data/a.bin")
