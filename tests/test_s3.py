"""Streaming shards from S3 through s3fs, against moto's server on 127.0.0.1."""

from __future__ import annotations

import json
import traceback

import pytest

from servers import (
    DUMMY_KEY,
    DUMMY_SECRET,
    read_samples,
    requests_until_it_fails,
    retry_waits,
)
from shardpipes.datapipes.iter import FSSpecFileLister, IterableWrapper
from shardpipes.datapipes.iter.fsspec import (
    ForbiddenShardError,
    MissingShardError,
    open_url,
    read_shard_list,
)

pytestmark = pytest.mark.s3


def test_brace_pattern_streams_every_sample_in_order(s3, shards):
    s3.put("data", shards.data)
    urls = list(IterableWrapper(["s3://data/train-{000000..000006}.tar"]).shard_expand())
    assert urls == [f"s3://data/{n}" for n in shards.names]
    assert read_samples(urls, storage_options=s3.options()) == shards.expected


def test_samples_carry_the_s3_url(s3, shards):
    (url,) = s3.put("data", {shards.names[0]: shards.data[shards.names[0]]})
    dp = IterableWrapper([url]).open_files_by_fsspec(storage_options=s3.options()).load_from_tar()
    dp = dp.webdataset()
    assert {s["__url__"] for s in dp} == {url}


def test_list_files_by_fsspec_lists_a_prefix_with_masks(s3, shards):
    s3.put("data", {**shards.data, "README.txt": b"hello"})
    listed = list(FSSpecFileLister("s3://data/", masks="*.tar", storage_options=s3.options()))
    assert listed == [f"s3://data/{n}" for n in shards.names]
    globbed = list(
        IterableWrapper(["s3://data/train-00000[0-2].tar"]).list_files_by_fsspec(
            storage_options=s3.options()
        )
    )
    assert globbed == [f"s3://data/{n}" for n in shards.names[:3]]


def test_listing_a_missing_bucket_names_it(s3):
    with pytest.raises(MissingShardError, match=r"^s3://no-such-bucket/: no such file"):
        list(FSSpecFileLister("s3://no-such-bucket/", storage_options=s3.options()))


@pytest.mark.parametrize(
    "url", ["s3://data/no-such-key.tar", "s3://no-such-bucket/a.tar"], ids=["key", "bucket"]
)
def test_missing_key_or_bucket_fails_at_once_naming_the_url(s3, fault_proxy, url, caplog):
    s3.put("data", {"a.tar": b"x"})
    proxy = fault_proxy(s3.endpoint)
    errors = []

    def fail(retries):
        with pytest.raises(MissingShardError, match=rf"^{url}: no such file or bucket") as info:
            open_url(url, storage_options=s3.options(proxy.url), retries=retries, backoff=10.0)
        errors.append(info.value)

    sent = requests_until_it_fails(proxy.log, fail)
    assert sent[0] == sent[1] > 0  # not retried: five retries cost no extra request
    assert retry_waits(caplog.records) == []
    for err in errors:
        assert (err.url, err.offset) == (url, 0)
        assert isinstance(err, FileNotFoundError)
        assert DUMMY_SECRET not in "".join(traceback.format_exception(err))


def test_403_fails_at_once_without_showing_the_secret(s3, fault_proxy):
    (url,) = s3.put("data", {"a.tar": b"x" * 100})
    proxy = fault_proxy(s3.endpoint)
    proxy.set_faults(methods=("HEAD", "GET"), fail_first=1000, fail_status=403)
    opts = s3.options(proxy.url, config_kwargs={"retries": {"total_max_attempts": 1}})
    with pytest.raises(ForbiddenShardError, match=rf"^{url}: access denied") as info:
        open_url(url, storage_options=opts, backoff=10.0)
    assert isinstance(info.value, PermissionError)
    assert DUMMY_SECRET not in "".join(traceback.format_exception(info.value))


def test_endpoint_in_storage_options_is_used(s3, fault_proxy, shards):
    urls = s3.put("data", shards.data)
    proxy = fault_proxy(s3.endpoint)
    assert read_samples(urls, storage_options=s3.options(proxy.url)) == shards.expected
    assert {g.path.split("?")[0] for g in proxy.log.gets()} == {f"/data/{n}" for n in shards.names}


def test_keys_in_storage_options_sign_the_requests(s3, fault_proxy, shards):
    urls = s3.put("data", shards.data)
    proxy = fault_proxy(s3.endpoint)
    read_samples(urls[:1], storage_options=s3.options(proxy.url))
    auth = [r.headers.get("Authorization", "") for r in proxy.log.records]
    assert auth and all(f"Credential={DUMMY_KEY}/" in a for a in auth)


def test_anonymous_access_to_a_public_bucket_sends_no_credentials(s3, fault_proxy, shards):
    urls = s3.put("data", shards.data)
    fs = s3.fs()
    for path in ["data", *(u[len("s3://") :] for u in urls)]:
        fs.chmod(path, acl="public-read")
    proxy = fault_proxy(s3.endpoint)
    opts = {"anon": True, "client_kwargs": {"endpoint_url": proxy.url}}
    assert read_samples(urls, storage_options=opts) == shards.expected
    assert proxy.log.records
    assert all("Authorization" not in r.headers for r in proxy.log.records)


def test_anonymous_access_to_a_private_bucket_is_forbidden(s3, shards):
    (url,) = s3.put("data", {"a.tar": b"x"})
    opts = {"anon": True, "client_kwargs": {"endpoint_url": s3.endpoint}}
    with pytest.raises(ForbiddenShardError, match=rf"^{url}: access denied"):
        open_url(url, storage_options=opts, backoff=10.0)


def test_profile_in_storage_options_selects_its_credentials(s3, fault_proxy, shards, tmp_path):
    (tmp_path / "aws-credentials").write_text(
        "[shardtest]\naws_access_key_id = AKIDFROMPROFILE\naws_secret_access_key = profile-secret\n"
    )
    urls = s3.put("data", shards.data)
    proxy = fault_proxy(s3.endpoint)
    opts = {"profile": "shardtest", "client_kwargs": {"endpoint_url": proxy.url}}
    assert read_samples(urls[:2], storage_options=opts) == shards.expected[:24]
    auth = [r.headers.get("Authorization", "") for r in proxy.log.records]
    assert auth and all("Credential=AKIDFROMPROFILE/" in a for a in auth)


def test_read_shard_list_from_an_s3_descriptor(s3, shards):
    s3.put("data", {f"shards/{n}": d for n, d in shards.data.items()})
    desc = {"shardlist": [{"url": f"../shards/{n}", "nsamples": 0} for n in shards.names]}
    s3.put("data", {"meta/dataset.json": json.dumps(desc).encode()})
    urls = read_shard_list("s3://data/meta/dataset.json", storage_options=s3.options())
    assert urls == [f"s3://data/shards/{n}" for n in shards.names]
    assert read_samples(urls, storage_options=s3.options()) == shards.expected


def test_a_50_block_shard_is_read_in_bounded_ranges(s3, fault_proxy):
    data = bytes(range(256)) * 3200  # 800 KiB
    (url,) = s3.put("data", {"big.bin": data})
    proxy = fault_proxy(s3.endpoint)
    with open_url(url, storage_options=s3.options(proxy.url), block_size=16384) as f:
        assert f.read() == data
    ranges = [g.range for g in proxy.log.gets("big.bin")]
    assert len(ranges) == 50
    assert all(int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) < 16384 for r in ranges)
