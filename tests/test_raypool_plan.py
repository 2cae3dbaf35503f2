"""The pure parts of the Ray reading service: leases, the dealer, a logical reader after k items.

No Ray here: these run in the default suite. The cluster tests are tests/test_raypool_cluster.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.graph import lean_graph
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.plan.epoch import EpochPlan
from shardpipes.plan.resume import Segment, lease_start, worker_batches
from shardpipes.raypool.lease import Dealer, LeaseTable
from shardpipes.raypool.reader import logical_items, reader_bundles, seek_refusal

# --- lease_start ------------------------------------------------------------------------------------


@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    data=st.data(),
)
def test_lease_start_is_the_readers_own_count_plus_after(counts, data):
    consumed = data.draw(st.integers(0, sum(counts)))
    worker = data.draw(st.integers(0, len(counts) - 1))
    after = data.draw(st.integers(0, 12))
    role, done = lease_start(consumed, counts, worker, after)
    base = lease_start(consumed, counts, worker)[1]
    assert done == min(base + after, counts[role])
    assert base == worker_batches(consumed, counts)[role]
    # the roles of a rank's workers are a rotation: every part is run by one worker
    roles = sorted(lease_start(consumed, counts, w)[0] for w in range(len(counts)))
    assert roles == list(range(len(counts)))


def test_lease_start_refuses_a_worker_out_of_range():
    with pytest.raises(ValueError, match=r"worker 3 should be in \[0, 2\)"):
        lease_start(0, [1, 1], 3)


# --- leases and the dealer under faults ------------------------------------------------------------


def _round_robin(counts: list[int]) -> list[tuple[int, int]]:
    out = []
    for i in range(max(counts, default=0)):
        out.extend((r, i) for r, n in enumerate(counts) if i < n)
    return out


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=5),
    events=st.lists(
        st.tuples(st.sampled_from(["pull", "stale", "kill", "move"]), st.integers(0, 99)),
        max_size=120,
    ),
)
def test_dealer_deals_the_no_fault_sequence_whatever_the_leases_do(counts, events):
    """Random pulls, late items of fenced leases, deaths and moves: each item dealt once, in order."""
    readers = len(counts)
    table = LeaseTable(readers)
    dealer = Dealer(table)
    cursor: dict[int, int] = {}  # fence -> next index its process makes (it runs past `until`)
    fenced: list[Any] = []
    for r in range(readers):
        cursor[table.grant(r, "a").fence] = 0

    def deliver(lease: Any, size: int) -> None:
        at = cursor[lease.fence]
        n = counts[lease.reader]
        stop = min(at + size, n)
        items = [(lease.reader, i) for i in range(at, stop)]
        cursor[lease.fence] = stop
        dealer.offer(lease, at, items, stop if stop == n else -1)

    dealt: list[Any] = []
    script = iter(events)
    for _ in range(10_000):
        dealt.extend(dealer.deal())
        waiting = dealer.waiting_for()
        if waiting is None:
            break
        kind, x = next(script, ("pull", 1))  # then: the waited-for lease
        leases = list(table.all())
        if kind == "stale" and fenced:
            deliver(fenced[x % len(fenced)], 1 + x % 3)
        elif kind == "kill" and leases:
            old = leases[x % len(leases)]
            new = table.replace(old, f"m{x}", dealer.wanted(old.reader))
            fenced.append(old)
            cursor[new.fence] = new.start
        elif kind == "move" and leases:
            reader = leases[x % len(leases)].reader
            if len(table.leases(reader)) == 1:
                new = table.move(reader, f"m{x}", dealer.wanted(reader) + x % 4)
                cursor[new.fence] = new.start
        else:  # pull the lease the rotation waits for (or another, by x)
            if kind == "pull" and x % 3 == 0 and leases:
                lease = leases[x % len(leases)]
            else:
                lease = table.maker(waiting, dealer.wanted(waiting))
            if lease is not None:
                deliver(lease, 1 + x % 4)
    assert dealt == _round_robin(counts)
    assert dealer.waiting_for() is None


def test_a_fenced_lease_items_are_dropped():
    table = LeaseTable(1)
    dealer = Dealer(table)
    old = table.grant(0, "a")
    new = table.replace(old, "b", 0)
    assert dealer.offer(old, 0, ["x"]) == 0
    assert dealer.offer(new, 0, ["y"], end=1) == 1
    assert list(dealer.deal()) == ["y"]
    assert dealer.dropped == 1


# --- a logical reader after its own first k items ---------------------------------------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> Any:
    from shardpipes.index import build_index, default_index_url
    from shardpipes.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("raypool-plan")
    paths = write_synthetic(d, shards=5, samples=[9, 13, 4, 11, 7], payload_bytes=8)
    build_index(paths, progress=False).save(default_index_url(paths))
    return paths


def _graph(paths: list[str], kind: str = "plain") -> Any:
    from tests._graphs import indexed_graph, sample_id

    if kind == "plain":
        return indexed_graph(paths, batch_size=3, buffer_size=8)
    # a mix() of two indexed sources (the shards split in two datasets of their own index)
    a, b = (
        IterableWrapper(p)
        .shuffle()
        .sharding_by_index(index)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        for p, index in paths_and_indexes(paths)
    )
    return a.mix(b, names=["a", "b"], repeat=[1, 2]).shuffle(buffer_size=6).batch(3)


def paths_and_indexes(paths: list[str]) -> list[tuple[list[str], Any]]:
    from shardpipes.index import build_index

    return [(p, build_index(p, progress=False)) for p in (paths[:2], paths[2:])]


def _ids(batch: Any) -> list[int]:
    return [int(x) for x in batch]


@pytest.mark.parametrize("kind", ["plain", "mix"])
@pytest.mark.parametrize("resumed_at", [0, 5], ids=["fresh", "resumed"])
def test_logical_readers_after_k_items_give_the_worker_pool_batches(indexed, resumed_at, kind):
    """Reader w from item k == reader w's items [k:], and dealing the readers == MPRS(num_workers=V)."""
    readers = 3
    with DataLoader2(
        _graph(indexed, kind), reading_service=MultiProcessingReadingService(readers)
    ) as dl:
        dl.seed(11)
        it = iter(dl)
        for _ in range(resumed_at):
            next(it)
        pool = [_ids(b) for b in it]
    # The rank's plan as the loader hands it to its pool: resumed after `resumed_at` items.
    segments = (Segment(1, readers, False, resumed_at),) if resumed_at else ()
    plan = EpochPlan(11, 0, (), segments)
    core = lean_graph(_graph(indexed, kind))
    full = []
    for w in range(readers):
        items = [_ids(b) for b in logical_items(core, plan, w, readers)]
        for k in range(len(items) + 1):
            after = [_ids(b) for b in logical_items(core, plan, w, readers, after=k)]
            assert after == items[k:], (w, k)
            replayed = [
                _ids(b) for b in logical_items(core, plan, w, readers, after=k, replay=True)
            ]
            assert replayed == items[k:], (w, k)
        full.append(items)
    dealt = []
    for i in range(max(len(x) for x in full)):
        dealt.extend(x[i] for x in full if i < len(x))
    assert dealt == pool
    ids = [x for b in dealt for x in b]
    if kind == "plain":  # (the mixture repeats source b twice)
        assert len(ids) == len(set(ids))


def test_seek_refusal_names_why(indexed):
    unindexed = IterableWrapper(indexed).sharding_filter().open_files_by_fsspec().load_from_tar()
    assert "sharding_by_index" in (seek_refusal(unindexed) or "")
    assert seek_refusal(_graph(indexed)) is None


def test_reader_bundles_mark_the_end():
    got = list(reader_bundles(iter(range(5)), 2, 7, 10, 2))
    assert [(b.start, b.items, b.end) for b in got] == [
        (10, [0, 1], -1),
        (12, [2, 3], -1),
        (14, [4], 15),
    ]


def test_without_ray_the_service_names_the_extra(tmp_path):
    """Ray absent (an import of it fails, as when it is not installed): the error names the extra."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from shardpipes.dataloader2 import DataLoader2\n"
        "from shardpipes.datapipes.iter import IterableWrapper\n"
        "from shardpipes.raypool import RayReadingService\n"
        "dp = IterableWrapper(range(4)).sharding_filter()\n"
        "try:\n"
        "    DataLoader2(dp, reading_service=RayReadingService(2)).__iter__()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "pip install 'shardpipes[ray]'" in out.stdout, out.stdout + out.stderr


def test_sizing_policy_grows_and_shrinks_within_bounds():
    from shardpipes.raypool import SizingPolicy

    p = SizingPolicy(min_readers=2, max_readers=10, grow_above=0.2, shrink_below=0.05)
    assert [p.next_size(n, waited=0.5) for n in (2, 4, 8)] == [4, 8, 10]
    assert [p.next_size(n, waited=0.0) for n in (3, 2)] == [2, 2]
    assert p.next_size(5, waited=0.1) == 5
    with pytest.raises(ValueError, match="shrink_below"):
        SizingPolicy(grow_above=0.01, shrink_below=0.1)
