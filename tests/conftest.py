"""Shared fixtures. Server fixtures (S3, GCS, HTTP) live in tests/servers.py."""

from __future__ import annotations

import os

import fsspec
import pytest

from shardpipes.synthetic import write_synthetic

pytest_plugins = ["servers"]  # S3, GCS and HTTP servers on 127.0.0.1 (tests/servers.py)


@pytest.fixture(autouse=True)
def _isolate_fsspec() -> None:
    """Each test gets fresh fsspec filesystem instances (no cached state between tests)."""
    fsspec.AbstractFileSystem.clear_instance_cache()
    for cls in fsspec.registry.values():
        if hasattr(cls, "clear_instance_cache"):
            cls.clear_instance_cache()


@pytest.fixture
def shard_dir(tmp_path) -> str:
    """Seven uneven shards (prime counts) of small synthetic samples; returns the directory."""
    write_synthetic(tmp_path, shards=7, samples=[11, 13, 17, 19, 23, 29, 31], payload_bytes=64)
    return os.fspath(tmp_path)


@pytest.fixture
def shard_pattern(shard_dir) -> str:
    """Brace pattern naming the seven shards of ``shard_dir``."""
    return f"{shard_dir}/train-{{000000..000006}}.tar"
