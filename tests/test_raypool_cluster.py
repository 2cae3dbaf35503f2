"""RayReadingService on a simulated 3-node Ray cluster (``ray.cluster_utils.Cluster`` on 127.0.0.1).

Marked ``ray``: outside the default run, run by ``tox -e ray`` (and CI, ``.ci/run``). One
cluster per session (about 600 MB, 20-40 s to start on a loaded 2-core machine), tiny shards.
Every run is compared with ``MultiProcessingReadingService(num_workers=V)`` batch by batch, by
the samples' ids (``batch.ids``, ``dl.attest``) and a digest of their content.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

ray = (
    pytest.importorskip("ray")
    if not os.environ.get("SHARDPIPES_REQUIRE_RAY")
    else __import__("ray")
)

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService  # noqa: E402
from shardpipes.datapipes.iter import IterableWrapper  # noqa: E402
from shardpipes.index import build_index, default_index_url  # noqa: E402
from shardpipes.raypool import RayReadingService, SeekRefused  # noqa: E402
from shardpipes.synthetic import write_synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
READER = {"num_cpus": 0.1}


@pytest.fixture(scope="session")
def cluster() -> Any:
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # services on 127.0.0.1
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # the actors import the tests' helpers (this module) and the package under test
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), str(ROOT / "pipes"), os.environ.get("PYTHONPATH", "")]
    )
    tmp = tempfile.mkdtemp(prefix="sp-ray-")  # short: Ray's sockets live under it
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"))
    fast = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 4,
    }
    store = 80 << 20
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "object_store_memory": store,
            "temp_dir": tmp,
            "_system_config": fast,
        },
    )
    nodes = [
        c.add_node(num_cpus=2, object_store_memory=store, resources={f"node{i}": 1}) for i in (1, 2)
    ]
    ray.init(address=c.address, namespace="shardpipes-tests", log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("raypool")
    paths = write_synthetic(d, shards=6, samples=[23, 17, 31, 11, 29, 19], payload_bytes=64)
    build_index(paths, progress=False).save(default_index_url(paths))
    return paths


class Digest:
    """A sample's id and a digest of its content; exits its process at one sample when armed."""

    def __init__(self, exit_at: int = -1, marker: str = "") -> None:
        self.exit_at = exit_at
        self.marker = marker

    def __call__(self, sample: dict[str, Any]) -> tuple[int, str]:
        sid = int(sample[".json"]["id"])
        if sid == self.exit_at and self.marker and os.path.exists(self.marker):
            os.unlink(self.marker)  # once: the reader that takes over reads it again
            os._exit(1)
        return sid, hashlib.sha1(bytes(sample[".bin"])).hexdigest()[:12]


def graph(paths: list[str], digest: Digest | None = None) -> Any:
    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(digest or Digest())
        .shuffle(buffer_size=8)
        .batch(3)
    )


def run(dp: Any, rs: Any, events: dict[int, Any] | None = None, seed: int = 5) -> list[Any]:
    out = []
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.attest(every=4)
        dl.seed(seed)
        for i, batch in enumerate(dl):
            out.append((list(batch.ids), list(batch)))
            if events and i in events:
                events[i]()
    return out


def test_refuses_a_graph_that_cannot_seek(cluster, shards):
    dp = IterableWrapper(shards).sharding_filter().open_files_by_fsspec().load_from_tar().batch(2)
    with pytest.raises(SeekRefused, match="cannot seek: .*sharding_by_index.*replay=True"):
        with DataLoader2(dp, reading_service=RayReadingService(2, pool="refuse")) as dl:
            next(iter(dl))


def test_one_rank_readers_join_leave_die_and_the_pool_restarts(cluster, shards, tmp_path):
    c, nodes = cluster
    V = 4
    expected = run(graph(shards), MultiProcessingReadingService(V))
    marker = tmp_path / "exit-once"
    marker.touch()
    victim = expected[9][1][0][0]  # a sample of batch 9: its reader exits when it reads it
    rs = RayReadingService(V, pool="one", readers=2, reader_options=READER, bundle=2)

    def kill_pool() -> None:
        ray.kill(ray.get_actor("one-pool", namespace="shardpipes"), no_restart=False)

    events = {2: lambda: rs.scale(4), 6: kill_pool, 12: lambda: rs.scale(1)}
    got = run(graph(shards, Digest(victim, str(marker))), rs, events)
    assert not marker.exists(), "the reader never exited"
    assert got == expected
    ids = [i for b, _ in got for i in b]
    assert len(ids) == len(set(ids)) == sum([23, 17, 31, 11, 29, 19]) // V * V
    assert rs.stats["released"] >= 1 and rs.stats["moved"] >= 1
