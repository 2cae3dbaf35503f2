"""RayReadingService on a simulated 3-node Ray cluster (``ray.cluster_utils.Cluster`` on 127.0.0.1).

Marked ``ray``: outside the default run, run by ``tox -e ray`` (and CI, ``.ci/run``). One
cluster per session (about 600 MB, 20-40 s to start on a loaded 2-core machine), tiny shards.
Every run is compared with ``MultiProcessingReadingService(num_workers=V)`` batch by batch, by
the samples' ids (``batch.ids``, ``dl.attest``) and a digest of their content.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

# Before Ray is imported: its services bind 127.0.0.1 only (how it runs on macOS), no usage report.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ray = (
    pytest.importorskip("ray")
    if not os.environ.get("SHARDPIPES_REQUIRE_RAY")
    else __import__("ray")
)

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService  # noqa: E402
from shardpipes.dataloader2.telemetry import stage_labels  # noqa: E402
from shardpipes.datapipes.iter import IterableWrapper  # noqa: E402
from shardpipes.index import build_index, default_index_url  # noqa: E402
from shardpipes.raypool import RayReadingService, SeekRefused  # noqa: E402
from shardpipes.synthetic import write_synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
READER = {"num_cpus": 0.1}


@pytest.fixture(scope="session")
def cluster() -> Any:
    from ray.cluster_utils import Cluster

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
        shutil.rmtree(tmp, ignore_errors=True)


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


def _ids(batch: Any) -> list[int]:
    """The batch's sample ids as the loader carries them (``batch.ids``), else as the samples say."""
    ids = getattr(batch, "ids", None)  # a mix() is checked by what its samples hold
    return [int(i) for i in ids] if ids is not None else [sid for sid, _ in batch]


def run(dp: Any, rs: Any, events: dict[int, Any] | None = None, seed: int = 5) -> list[Any]:
    out = []
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.attest(every=4)
        dl.seed(seed)
        for i, batch in enumerate(dl):
            out.append((_ids(batch), list(batch)))
            if events and i in events:
                events[i]()
    return out


def test_refuses_a_graph_that_cannot_seek(cluster, shards):
    dp = IterableWrapper(shards).sharding_filter().open_files_by_fsspec().load_from_tar().batch(2)
    with pytest.raises(SeekRefused, match="cannot seek: .*sharding_by_index.*replay=True"):
        with DataLoader2(dp, reading_service=RayReadingService(2, pool="refuse")) as dl:
            next(iter(dl))


def test_a_graph_that_cannot_seek_runs_by_replay_when_asked(cluster, shards):
    def unindexed() -> Any:
        return (
            IterableWrapper(shards)
            .shuffle()
            .sharding_filter()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .decode()
            .map(Digest())
            .shuffle(buffer_size=8)
            .batch(3)
        )

    def flat(run_: list[Any]) -> list[Any]:
        return [b for _, b in run_]

    expected = run(unindexed(), MultiProcessingReadingService(2))
    rs = RayReadingService(
        2, pool="replay", readers=1, reader_options=READER, bundle=2, check_every=1, replay=True
    )
    got = run(unindexed(), rs, {3: lambda: rs.scale(2)})
    assert flat(got) == flat(expected)
    assert rs.stats["moved"] >= 1  # a reader moved, and replayed its way to the switch item


class Fails:
    """Raises at one sample (a stage's own error, not a lost reader)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self, sample: tuple[int, str]) -> tuple[int, str]:
        if sample[0] == self.at:
            raise ValueError(f"bad sample {self.at}")
        return sample


def test_a_stage_error_reaches_the_trainer_with_its_type_and_reader(cluster, shards):
    dp = (
        IterableWrapper(shards)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(Digest())
        .map(Fails(40))
        .batch(3)
    )
    rs = RayReadingService(2, pool="fails", readers=1, reader_options=READER)
    with pytest.raises(ValueError, match="bad sample 40") as info:
        run(dp, rs)
    assert any("logical reader" in note for note in getattr(info.value, "__notes__", []))
    assert rs.stats["released"] == 0  # an error of the graph is not a lost reader


def test_one_rank_readers_join_leave_die_and_the_pool_restarts(cluster, shards, tmp_path):
    c, nodes = cluster
    V = 4
    expected = run(graph(shards), MultiProcessingReadingService(V))
    marker = tmp_path / "exit-once"
    marker.touch()
    victim = expected[9][1][0][0]  # a sample of batch 9: its reader exits when it reads it
    rs = RayReadingService(V, pool="one", readers=2, reader_options=READER, bundle=2, check_every=1)

    def kill_pool() -> None:
        ray.kill(ray.get_actor("one-pool", namespace="shardpipes"), no_restart=False)

    events = {2: lambda: rs.scale(4), 6: kill_pool, 12: lambda: rs.scale(1)}
    got = run(graph(shards, Digest(victim, str(marker))), rs, events)
    assert not marker.exists(), "the reader never exited"
    assert got == expected
    ids = [i for b, _ in got for i in b]
    assert len(ids) == len(set(ids)) == sum([23, 17, 31, 11, 29, 19]) // V * V
    assert rs.stats["released"] >= 1 and rs.stats["moved"] >= 1


# --- what the readers skip is counted; after a skip, a moved or lost reader starts by replay --------


def _corrupt_json(paths: list[str], ids: set[int]) -> None:
    """Overwrite the ``.json`` of the samples ``ids`` with bytes that are not JSON (same size)."""
    import json
    import tarfile

    for path in paths:
        with tarfile.open(path) as tar:
            spots = [
                (m.offset_data, m.size)
                for m in tar.getmembers()
                if m.name.endswith(".json") and json.loads(tar.extractfile(m).read())["id"] in ids  # type: ignore[union-attr]
            ]
        with open(path, "r+b") as f:
            for at, size in spots:
                f.seek(at)
                f.write(b"!" * size)


def skipping(paths: list[str], digest: Digest | None = None) -> Any:
    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode(handler="skip")
        .map(digest or Digest())
        .shuffle(buffer_size=8)
        .batch(3)
    )


def test_skips_in_reader_actors_are_counted_and_moves_after_them_replay(cluster, shards, tmp_path):
    """A sample skipped under a handler in a reader actor reaches dl.stats(), as under the worker pool.

    A skip shifts the items after it, so a reader that skipped is moved (and re-leased after
    its actor exits) by replay, not by a seek: the batches stay the worker pool's.
    """
    V = 2
    clean = run(skipping(shards), MultiProcessingReadingService(V))
    corrupt = {clean[0][1][0][0], clean[1][1][0][0]}  # early in readers 0 and 1
    d = tmp_path / "damaged"
    d.mkdir()
    paths = [shutil.copy(p, d) for p in shards]
    _corrupt_json(paths, corrupt)
    build_index(paths, progress=False).save(default_index_url(paths))

    def stats_of(dp: Any, rs: Any, events: dict[int, Any] | None = None) -> Any:
        out = []
        with DataLoader2(dp, reading_service=rs) as dl:
            dl.seed(5)
            for i, batch in enumerate(dl):
                out.append(list(batch))
                if events and i in events:
                    events[i]()
            return out, dl.stats()

    expected, want = stats_of(skipping(paths), MultiProcessingReadingService(V))
    assert want["skipped_samples"] == 2
    marker = tmp_path / "exit-once"
    marker.touch()
    victim = expected[len(expected) // 2][0][0]  # a later sample: its reader exits there
    rs = RayReadingService(
        V, pool="skips", readers=1, reader_options=READER, bundle=2, check_every=1
    )
    got, stats = stats_of(
        skipping(paths, Digest(victim, str(marker))), rs, {2: lambda: rs.scale(2)}
    )
    assert not marker.exists(), "the reader never exited"
    assert got == expected
    assert stats["skipped_samples"] == want["skipped_samples"] == 2
    assert sorted(stats["skipped_examples"]) == sorted(want["skipped_examples"])
    assert rs.stats["moved"] >= 1 and rs.stats["released"] >= 1
    assert rs.stats["replayed"] >= 2  # the move and the re-lease, each after a skip


class Tag:
    """Tags each item (what a user's worker hook adds to a reader's graph)."""

    def __init__(self, *tag: Any) -> None:
        self.tag = tag

    def __call__(self, item: Any) -> Any:
        return (item, *self.tag)


def init_hook(dp: Any, info: Any) -> Any:
    return dp.map(Tag("init", info.worker_id, info.num_workers))


def reset_hook(dp: Any, info: Any, seeds: Any) -> Any:
    return dp.map(Tag("reset", int(info), seeds.generate_seed()))


def test_worker_hooks_run_in_the_reader_actors_for_each_logical_reader(cluster, shards):
    """worker_init_fn and worker_reset_fn: the batches equal the worker pool's with the same hooks."""
    V = 3
    hooks = {"worker_init_fn": init_hook, "worker_reset_fn": reset_hook}

    def batches(rs: Any, events: dict[int, Any] | None = None) -> list[Any]:
        out = []
        with DataLoader2(graph(shards), reading_service=rs) as dl:
            dl.seed(5)
            for i, batch in enumerate(dl):
                out.append(batch)
                if events and i in events:
                    events[i]()
        return out

    expected = batches(MultiProcessingReadingService(V, **hooks))
    rs = RayReadingService(
        V, pool="hooks", readers=1, reader_options=READER, check_every=1, **hooks
    )
    got = batches(rs, {2: lambda: rs.scale(3)})
    assert got == expected
    assert rs.stats["moved"] >= 1
    # each batch went through both hooks of its own logical reader, once
    assert {(b[0][1:], b[1], b[2]) for b in got} == {(("init", w, V), "reset", w) for w in range(V)}


# --- checkpoints: a state resumes under another pool size, the worker pool, and back --------------


def take(dp: Any, rs: Any, k: int, state: dict[str, Any] | None = None) -> tuple[list[Any], Any]:
    """Batches after a resume from ``state`` (all, or the first ``k`` and the state after them)."""
    out = []
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.attest(every=4)
        if state is not None:
            dl.load_state_dict(state)
        else:
            dl.seed(5)
        it = iter(dl)
        for batch in it:
            out.append((_ids(batch), list(batch)))
            if len(out) == k:
                return out, dl.state_dict()
    return out, None


def test_checkpoints_move_between_pool_sizes_and_the_worker_pool(cluster, shards):
    V = 4
    full, _ = take(graph(shards), MultiProcessingReadingService(V), -1)
    rs = RayReadingService(V, pool="ckpt", readers=3, reader_options=READER)
    head, state = take(graph(shards), rs, 5)
    assert head == full[:5]
    rs.scale(1)  # the same pool, smaller: the state does not record it
    rest, _ = take(
        graph(shards), RayReadingService(V, pool="ckpt", reader_options=READER), -1, state
    )
    assert rest == full[5:]
    rest, _ = take(graph(shards), MultiProcessingReadingService(V), -1, state)
    assert rest == full[5:]
    _, mp_state = take(graph(shards), MultiProcessingReadingService(V), 8)
    rest, _ = take(
        graph(shards), RayReadingService(V, pool="ckpt", reader_options=READER), -1, mp_state
    )
    assert rest == full[8:]
    # Another number of logical readers: the elastic resume, as the worker pool does it.
    want, _ = take(graph(shards), MultiProcessingReadingService(2), -1, state)
    rest, _ = take(
        graph(shards), RayReadingService(2, pool="ckpt", reader_options=READER), -1, state
    )
    assert rest == want
    ids = [i for b, _ in head + rest for i in b]
    assert len(ids) == len(set(ids))


# --- 2 gloo ranks: joins, a reader's exit, a node removed, the pool actor killed ------------------


def mixture(paths: list[str], digest: Digest | None = None) -> Any:
    """A ``mix()`` of two indexed sources (the shards split in two datasets, each indexed)."""
    a, b = (
        IterableWrapper(p)
        .shuffle()
        .sharding_by_index(build_index(p, progress=False))
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(digest or Digest())
        for p in (paths[:3], paths[3:])
    )
    return a.mix(b, names=["a", "b"], weights=[0.6, 0.4]).shuffle(buffer_size=6).batch(3)


GRAPHS = {"plain": graph, "mix": mixture}


def _wait_for(path: Path, seconds: float = 300) -> None:
    import time

    stop = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > stop:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.2)


def _rank(rank: int, world: int, address: str, paths: list[str], kind: str, signals: str) -> Any:
    from shardpipes.dataloader2 import DistributedReadingService, SequentialReadingService

    ray.init(address=address, namespace="shardpipes-tests", log_to_driver=False)
    V = 4
    make = GRAPHS[kind]
    expected = run(
        make(paths),
        SequentialReadingService(
            DistributedReadingService(),
            MultiProcessingReadingService(V, multiprocessing_context="fork"),
        ),
    )
    sig = Path(signals)
    victim = expected[7][1][0][0] if rank == 1 else -1  # rank 1's reader exits at batch 7
    pool = f"two-{kind}"
    rs = RayReadingService(
        V,
        pool=pool,
        readers=4,
        reader_options={**READER, "scheduling_strategy": "SPREAD"},
        bundle=2,
        check_every=1,  # membership looked at after every message: the moves happen at once
    )

    def remove_node() -> None:
        (sig / "remove").touch()
        _wait_for(sig / "removed")

    def kill_pool() -> None:
        ray.kill(ray.get_actor(f"{pool}-pool", namespace="shardpipes"), no_restart=False)

    events = (
        {2: lambda: rs.scale(8), 5: remove_node, 8: kill_pool, 11: lambda: rs.scale(2)}
        if rank == 0
        else {}
    )
    got = run(
        make(paths, Digest(victim, str(sig / "exit-once"))),
        SequentialReadingService(DistributedReadingService(), rs),
        events,
    )
    ray.shutdown()
    return expected, got, dict(rs.stats)


@pytest.mark.parametrize("kind", ["plain", "mix"])
def test_two_ranks_get_the_worker_pool_batches_whatever_the_pool_does(
    cluster, shards, tmp_path, kind
):
    import pickle
    import time

    import torch.multiprocessing as mp

    c, nodes = cluster
    signals = tmp_path / "signals"
    signals.mkdir()
    (signals / "exit-once").touch()
    ctx = mp.get_context("spawn")
    store, out = tmp_path / "store", tmp_path / "out"
    procs = [
        ctx.Process(
            target=_entry,
            args=(r, 2, str(store), str(out), c.address, shards, kind, str(signals)),
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    removed = None
    try:
        stop = time.monotonic() + 800
        while any(p.is_alive() for p in procs) and time.monotonic() < stop:
            if (signals / "remove").exists() and removed is None:
                removed = nodes[1]
                c.remove_node(removed)
                (signals / "removed").touch()
            time.sleep(0.2)
        for p in procs:
            p.join(timeout=5)
            assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if removed is not None:  # the next tests get their 3 nodes back
            nodes[1] = c.add_node(num_cpus=2, object_store_memory=80 << 20, resources={"node2": 1})
    results = []
    for r in range(2):
        status, value = pickle.loads((tmp_path / f"out.{r}").read_bytes())
        assert status == "ok", value
        results.append(value)
    assert removed is not None, "rank 0 never asked for the node removal"
    assert not (signals / "exit-once").exists(), "the reader never exited"
    for expected, got, _ in results:
        assert got == expected  # ids (batch.ids) and content digests, batch by batch
    ids = [i for _, got, _ in results for b, _ in got for i in b]
    if kind == "plain":
        assert len(ids) == len(set(ids)) == sum([23, 17, 31, 11, 29, 19]) // 8 * 8
    assert sum(s["released"] for *_, s in results) >= 1  # the reader's exit, the node's readers
    assert results[0][2]["moved"] >= 1


def _entry(rank: int, world: int, store: str, out: str, *args: Any) -> None:
    import pickle
    import traceback

    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        try:
            fn = _RANK_FNS[args[0]] if args and args[0] in _RANK_FNS else _rank
            result: Any = ("ok", fn(rank, world, *(args[1:] if fn is not _rank else args)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(f"{out}.{rank}", "wb") as f:
        pickle.dump(result, f)


def test_a_sizing_policy_grows_the_pool_while_the_trainer_waits(cluster, shards):
    from shardpipes.raypool import SizingPolicy

    V = 4
    expected = run(graph(shards), MultiProcessingReadingService(V))
    # any wait at all is too much: the pool doubles every 4 items, up to 3 readers
    policy = SizingPolicy(min_readers=1, max_readers=3, grow_above=1e-9, shrink_below=0, window=4)
    rs = RayReadingService(
        V, pool="sized", readers=1, reader_options=READER, check_every=1, sizing=policy
    )
    assert run(graph(shards), rs) == expected
    pool = ray.get_actor("sized-pool", namespace="shardpipes")
    assert rs.stats["moved"] >= 1  # readers moved to the new actors mid-epoch
    assert rs.stats["wait_s"] > 0  # the trainer's wait, reported (the policy grew on it)
    assert ray.get(pool.state.remote())[0] == []  # the last trainer out stopped the readers


def _rank_head(rank: int, world: int, address: str, paths: list[str], k: int) -> Any:
    """``k`` batches on 2 ranks under the Ray pool, and the rank's state after them."""
    from shardpipes.dataloader2 import DistributedReadingService, SequentialReadingService

    ray.init(address=address, namespace="shardpipes-tests", log_to_driver=False)
    rs = RayReadingService(4, pool="ranks", readers=2, reader_options=READER)
    head, state = take(graph(paths), SequentialReadingService(DistributedReadingService(), rs), k)
    ray.shutdown()
    return head, state


_RANK_FNS = {"head": _rank_head}


def test_a_state_of_two_ranks_resumes_on_one_as_the_worker_pool_resumes_it(
    cluster, shards, tmp_path
):
    """Another number of trainer ranks: the existing elastic resume, the same under the Ray pool."""
    import pickle

    import torch.multiprocessing as mp

    c, _ = cluster
    ctx = mp.get_context("spawn")
    store, out = tmp_path / "store", tmp_path / "out"
    procs = [
        ctx.Process(target=_entry, args=(r, 2, str(store), str(out), "head", c.address, shards, 5))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    heads = []
    for r in range(2):
        status, value = pickle.loads((tmp_path / f"out.{r}").read_bytes())
        assert status == "ok", value
        heads.append(value)
    state = heads[0][1]
    want, _ = take(graph(shards), MultiProcessingReadingService(4), -1, state)
    got, _ = take(
        graph(shards), RayReadingService(4, pool="ranks", reader_options=READER), -1, state
    )
    assert got == want and got
    ids = [i for head, _ in heads for b, _ in head for i in b] + [i for b, _ in got for i in b]
    assert len(ids) == len(set(ids))  # nothing read twice across the two topologies


# --- what the readers' stages drop, and telemetry's worker figures, reach the trainer ------------


def odd(sample: tuple[int, str]) -> bool:
    return sample[0] % 2 == 1


def never(sample: Any) -> bool:
    return False


def filtered(paths: list[str], keep: Any) -> Any:
    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(Digest())
        .filter(keep)
        .shuffle(buffer_size=4)
        .batch(3)
    )


def _empty_epoch_warning(rs: Any, paths: list[str]) -> str:
    import warnings

    from shardpipes.errors import EmptyEpochWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DataLoader2(filtered(paths, never), reading_service=rs) as dl:
            dl.seed(5)
            assert list(dl) == []
    found = [str(w.message) for w in caught if issubclass(w.category, EmptyEpochWarning)]
    assert len(found) == 1, found
    return found[0]


def test_a_filter_in_the_reader_actors_is_counted_and_named_as_in_the_worker_pool(cluster, shards):
    """The drop totals of a filter in the actors: the same flows as the worker pool's, moves or not.

    A filter cannot seek, so the graph runs by replay; a reader moved in the middle of an
    epoch ends under its new lease, whose totals are the reader's whole epoch.
    """
    V = 2
    want = _empty_epoch_warning(MultiProcessingReadingService(V), shards)
    assert "filter received" in want and "dropped all of them" in want
    got = _empty_epoch_warning(
        RayReadingService(V, pool="drops-none", readers=1, reader_options=READER, replay=True),
        shards,
    )
    assert got == want  # the stage named, with the same count

    def two_epochs(rs: Any, events: dict[int, Any] | None = None) -> tuple[list[Any], Any]:
        out = []
        with DataLoader2(filtered(shards, odd), reading_service=rs) as dl:
            for epoch in range(2):
                dl.seed(epoch)
                for i, batch in enumerate(dl):
                    out.append(list(batch))
                    if epoch == 0 and events and i in events:
                        events[i]()
            return out, rs.flows()

    expected, flows = two_epochs(MultiProcessingReadingService(V))
    rs = RayReadingService(
        V, pool="drops", readers=1, reader_options=READER, bundle=2, check_every=1, replay=True
    )
    got_batches, got_flows = two_epochs(rs, {1: lambda: rs.scale(2)})
    assert got_batches == expected
    assert rs.stats["moved"] >= 1
    assert got_flows == flows  # over two epochs, a move in the first
    assert flows[0][0].name == "filter" and flows[0][0].dropped > 0


def _sampler_threads(actor: Any) -> int:
    import threading

    def count(self: Any) -> int:
        return sum(t.name == "shardpipes-stage-sampler" for t in threading.enumerate())

    return int(ray.get(actor.__ray_call__.remote(count)))


def test_telemetry_sees_each_logical_reader_as_a_worker(cluster, shards):
    """Under the Ray pool telemetry gets one worker per logical reader, with the worker pool's counts."""
    V = 2

    def watched(rs: Any) -> Any:
        dl = DataLoader2(graph(shards), reading_service=rs)
        telemetry = dl.watch(interval=0.002, budget=float("inf"))
        snaps = []
        with dl:
            for epoch in range(2):
                dl.seed(epoch)
                batches = sum(1 for _ in dl)
                snaps.append(telemetry.snapshot())
            return snaps, batches, _samplers_left(rs)

    (first, want), n, _ = watched(MultiProcessingReadingService(V))
    rs = RayReadingService(V, pool="watched", readers=2, reader_options=READER)
    (got_first, got), m, left = watched(rs)
    assert m == n and got.batches == want.batches
    assert [w.worker for w in got.workers] == [w.worker for w in want.workers] == [0, 1]
    assert [w.items for w in got.workers] == [w.items for w in want.workers]
    assert sum(w.items for w in got.workers) == got.batches  # no move: each item made once
    assert all(0 < w.busy <= w.wall and w.cpu > 0 for w in got.workers)
    # The same reads in an epoch. In the next, a worker's graph still holds the shards' sample
    # offsets it read (train.index.samples/), where each lease's graph is a fresh copy.
    assert got_first.storage.bytes_read == first.storage.bytes_read > 0
    assert got.storage.bytes_read >= want.storage.bytes_read
    assert got.storage.open_streams == 0
    # Which stages a stack sample catches is chance (a quick stage may be missed in one run and
    # caught in the other), so the readers' stages are checked against the graph's labels, not
    # against the worker pool's samples.
    labels = set(stage_labels(graph(shards)).values())
    for snap in (want, got):
        worker_stages = {s.name for s in snap.stages if s.where == "workers"}
        assert worker_stages and worker_stages <= labels | {"(loader)"}, worker_stages - labels
    assert got.ticks > 0
    assert left == 0  # the leases' stack samplers ended with their leases


def _samplers_left(rs: Any) -> int:
    """Stack-sampler threads left in the pool's reader actors once the leases ended (polled)."""
    import time

    if not isinstance(rs, RayReadingService):
        return 0
    actors = [ray.get_actor(name, namespace="shardpipes") for name in rs.scale(rs.readers)]
    left = -1
    # A lease's generator ends just after its last message is taken: polled for up to a minute
    # (a loaded machine may take seconds), returning as soon as none is left.
    deadline = time.monotonic() + 60
    while (left := sum(_sampler_threads(a) for a in actors)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
