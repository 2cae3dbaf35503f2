"""Shared fixtures. Server fixtures (S3, GCS, HTTP) live in tests/servers.py."""

from __future__ import annotations

import os

import fsspec
import pytest
from hypothesis import HealthCheck, settings

from _hyp import CI_EXAMPLES
from shardpipes.synthetic import write_synthetic

# S3, GCS and HTTP servers on 127.0.0.1 (tests/servers.py); a hang ends the run with every
# thread's stack instead of using up CI's time (tests/_watchdog.py)
pytest_plugins = ["servers", "_watchdog"]

# Hypothesis profiles. ``ci`` (the default, and what .ci/run uses) is derandomized: every run
# tries the same examples, so a test that passed once passes again and CI cannot fail by chance.
# Nothing depends on wall clock (no deadline, no too_slow health check: a loaded machine is not a
# bug) and no example database is read, so a failure seen elsewhere is not replayed here.
# ``explore`` (``tox -e explore``, or SHARDPIPES_HYPOTHESIS_PROFILE=explore) searches at random
# with more examples; every counterexample it finds is kept as an ``@example`` on its test.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=CI_EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    max_examples=10 * CI_EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# CI (CI=true) always runs ``ci``; elsewhere the variable may choose. ``pytest
# --hypothesis-profile=NAME`` wins over both: the plugin loads it after this file.
settings.load_profile(
    "ci"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes")
    else os.environ.get("SHARDPIPES_HYPOTHESIS_PROFILE", "ci")
)


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


def pytest_report_header(config: pytest.Config) -> str:
    """Say in the header which hypothesis settings this run uses (CI logs show it)."""
    s = settings.default
    return (
        f"shardpipes: hypothesis derandomize={s.derandomize} max_examples={s.max_examples} "
        f"database={'none' if s.database is None else 'on'}"
    )
