"""Streaming shards from GCS through gcsfs, against gcp-storage-emulator on 127.0.0.1.

``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set by tests/servers.py before gcsfs is
imported; with it on, every bucket costs a 60 s gRPC time-out against the emulator.
"""

from __future__ import annotations

import json
import os

import pytest

from servers import read_samples, requests_until_it_fails, retry_waits
from shardpipes.datapipes.iter import FSSpecFileLister, IterableWrapper
from shardpipes.datapipes.iter.fsspec import MissingShardError, open_url, read_shard_list

pytestmark = pytest.mark.gcs


def test_emulator_setup_keeps_gcsfs_experimental_features_off(gcs):
    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.endpoint


def test_brace_pattern_streams_every_sample_in_order(gcs, shards):
    gcs.put("data", shards.data)
    urls = list(IterableWrapper(["gs://data/train-{000000..000006}.tar"]).shard_expand())
    assert urls == [f"gs://data/{n}" for n in shards.names]
    assert read_samples(urls, storage_options=gcs.options()) == shards.expected


def test_small_blocks_are_range_reads_with_read_ahead(gcs, shards):
    urls = gcs.put("data", shards.data)
    got = read_samples(urls, storage_options=gcs.options(), block_size=8192, readahead=3)
    assert got == shards.expected


def test_list_files_by_fsspec_lists_a_bucket_with_masks(gcs, shards):
    gcs.put("data", {**shards.data, "README.txt": b"hello"})
    listed = list(FSSpecFileLister("gs://data", masks="*.tar", storage_options=gcs.options()))
    assert listed == [f"gs://data/{n}" for n in shards.names]


@pytest.mark.parametrize(
    "url", ["gs://data/no-such-object.tar", "gs://no-such-bucket/a.tar"], ids=["object", "bucket"]
)
def test_missing_object_or_bucket_fails_at_once_naming_the_url(gcs, fault_proxy, url, caplog):
    gcs.put("data", {"a.tar": b"x"})
    proxy = fault_proxy(gcs.endpoint)
    opts = gcs.options(endpoint_url=proxy.url)
    errors = []

    def fail(retries):
        with pytest.raises(MissingShardError, match=rf"^{url}: no such file or bucket") as info:
            open_url(url, storage_options=opts, retries=retries, backoff=10.0)
        errors.append(info.value)

    sent = requests_until_it_fails(proxy.log, fail)
    assert sent[0] == sent[1] > 0  # not retried: five retries cost no extra request
    assert retry_waits(caplog.records) == []
    assert [(e.url, e.offset) for e in errors] == [(url, 0)] * 2


def test_endpoint_url_in_storage_options_overrides_the_environment(gcs, fault_proxy, shards):
    urls = gcs.put("data", shards.data)
    proxy = fault_proxy(gcs.endpoint)
    opts = gcs.options(endpoint_url=proxy.url)
    assert read_samples(urls, storage_options=opts) == shards.expected
    downloads = {g.path.split("?")[0].rsplit("/", 1)[-1] for g in proxy.log.gets("alt=media")}
    assert downloads == set(shards.names)


def test_a_stalled_download_times_out_and_resumes(gcs, fault_proxy, shards):
    urls = gcs.put("data", shards.data)
    proxy = fault_proxy(gcs.endpoint)
    media = "train-000002.tar?alt=media"  # the data, not the metadata look-up
    # A stall far longer than the time-out; the time-out far longer than a block takes, even on
    # a loaded machine. Abandoning shows on the server: the stalled range is asked for again.
    proxy.set_faults(match=media, stall_first=1, drop_after=500, stall_seconds=60)
    opts = gcs.options(endpoint_url=proxy.url)
    got = read_samples(urls, storage_options=opts, block_size=8192, timeout=3, backoff=0.01)
    assert got == shards.expected
    gets = proxy.log.gets(media)
    (stalled,) = [g for g in gets if g.fault == "stall"]
    assert [g.range for g in gets].count(stalled.range) == 2  # abandoned, then asked again
    assert len(gets) == -(-len(shards.data["train-000002.tar"]) // 8192) + 1


def test_read_shard_list_from_a_gcs_descriptor(gcs, shards):
    gcs.put("data", {f"v1/shards/{n}": d for n, d in shards.data.items()})
    desc = {"base": "shards", "shardlist": [{"url": n, "nsamples": 0} for n in shards.names]}
    gcs.put("data", {"v1/dataset.json": json.dumps(desc).encode()})
    urls = read_shard_list("gs://data/v1/dataset.json", storage_options=gcs.options())
    assert urls == [f"gs://data/v1/shards/{n}" for n in shards.names]
    assert read_samples(urls, storage_options=gcs.options()) == shards.expected
