"""The pure parts of the Ray reading service: leases, the dealer, a logical reader after k items.

No Ray here: these run in the default suite. The cluster tests are tests/test_raypool_cluster.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2._stats import merge_flows
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
@example(counts=[0, 2, 0, 0, 0], events=[("move", 2), ("move", 1), ("pull", 9)])
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
        marks = tuple((i + 1, i + 1) for i in range(at, stop))  # a count as of each item
        dealer.offer(lease, at, items, stop if stop == n else -1, marks)

    dealt: list[Any] = []
    script = iter(events)
    for _ in range(10_000):
        dealt.extend(dealer.deal())
        for r in range(readers):  # marks follow the items they were made with, once each
            assert (dealer.marks[r] or 0) == dealer.taken[r]
            assert (dealer.seen[r] or 0) == dealer.wanted(r)
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
            # the trainer pulls a lease only once it makes its reader's next item or one
            # before (a lease pulled before its start would drop what it sends, for good)
            ready = [le for le in leases if le.start <= dealer.wanted(le.reader)]
            if kind == "pull" and x % 3 == 0 and ready:
                lease = ready[x % len(ready)]
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


def test_reader_bundles_carry_the_skip_counters_as_of_each_item():
    from shardpipes.handlers import SkipStats

    counters = [SkipStats(), SkipStats()]

    def items() -> Any:
        for i in range(5):
            if i in (1, 3):  # a skip while making items 1 and 3 (the second, fourth)
                counters[i // 2].record("u", ValueError(str(i)))
            yield i
        counters[0].record("u", ValueError("tail"), shard=True)  # after the last item

    got = list(reader_bundles(items(), 0, 1, 10, 2, counters))
    marks = [(n, c["samples"], c["shards"]) for b in got for n, c in b.skips]
    assert marks == [(12, 1, 0), (14, 2, 0), (15, 2, 1)]
    assert [b.end for b in got] == [-1, -1, 15]


def test_dealer_keeps_the_marks_of_taken_items_only():
    table = LeaseTable(2)
    dealer = Dealer(table)
    a, b = table.grant(0, "x"), table.grant(1, "x")
    dealer.offer(a, 0, ["a0", "a1"], marks=((2, "a@2"),))
    assert dealer.seen == ["a@2", None] and dealer.marks == [None, None]
    assert list(dealer.deal()) == ["a0"]
    assert dealer.marks == [None, None]  # as of the items dealt: a1 is not yet
    dealer.offer(a, 0, ["a0", "a1"], marks=((1, "late"), (2, "late")))  # already taken
    assert dealer.seen[0] == "a@2"
    dealer.offer(b, 0, ["b0"], end=1, marks=((1, "b@1"),))
    assert list(dealer.deal()) == ["b0", "a1"]
    assert dealer.marks == ["a@2", "b@1"]
    fenced = table.replace(a, "y", 2)
    dealer.offer(a, 2, ["a2"], marks=((3, "fenced"),))  # a fenced lease: nothing of it
    dealer.offer(fenced, 2, [], end=2, marks=((2, "at the end"),))
    assert list(dealer.deal()) == [] and dealer.waiting_for() is None
    assert dealer.marks == ["at the end", "b@1"]


class _Record:
    """Records each sample id it passes under ``key`` (a module-level list: graphs are copied)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, sample: dict[str, Any]) -> int:
        sid = int(sample[".json"]["id"])
        _READS.setdefault(self.key, []).append(sid)
        return sid


_READS: dict[str, list[int]] = {}


def _recorded(paths: list[str], key: str, buffer_size: int) -> Any:
    return lean_graph(
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(_Record(key))
        .shuffle(buffer_size=buffer_size)
        .batch(3)
    )


@pytest.mark.parametrize("buffer_size", [1, 8])
def test_a_move_reads_again_at_most_one_shuffle_buffer(indexed, buffer_size):
    """Make-before-break: the new lease from switch item k reads again at most the shuffle buffer.

    The old lease made items ``[0, k)`` (what it had read then is counted); the new one seeks
    to item ``k``: the samples both read are what the move costs.
    """
    readers = 2
    plan = EpochPlan(3, 0)
    again = []
    for w in range(readers):
        _READS.clear()
        items = list(logical_items(_recorded(indexed, "all", buffer_size), plan, w, readers))
        for k in range(1, len(items)):
            _READS.pop("old", None), _READS.pop("new", None)
            old = logical_items(_recorded(indexed, "old", buffer_size), plan, w, readers)
            assert [next(old) for _ in range(k)] == items[:k]
            new = list(
                logical_items(_recorded(indexed, "new", buffer_size), plan, w, readers, after=k)
            )
            assert new == items[k:]
            both = set(_READS.get("old", [])) & set(_READS.get("new", []))
            again.append(len(both))
            assert len(_READS.get("new", [])) == len(set(_READS.get("new", [])))
    assert max(again) <= buffer_size, again
    assert max(again) > 0  # the buffer is read again (the count can see it)


class _Tag:
    """Tags each item with a name (what a user's worker hook adds to the graph)."""

    def __init__(self, *tag: Any) -> None:
        self.tag = tag

    def __call__(self, item: Any) -> Any:
        return (item, *self.tag)


def _init_fn(dp: Any, info: Any) -> Any:
    return dp.map(_Tag("init", int(info), info.num_workers))


def _reset_fn(dp: Any, info: Any, seeds: Any) -> Any:
    return dp.map(_Tag("reset", info.worker_id, seeds.generate_seed()))


def test_worker_hooks_run_for_each_logical_reader_as_in_a_worker(indexed):
    """worker_init_fn and worker_reset_fn: a logical reader's items equal the worker pool's with them."""
    from shardpipes.raypool.reader import logical_reader

    readers = 2
    rs = MultiProcessingReadingService(readers, worker_init_fn=_init_fn, worker_reset_fn=_reset_fn)
    with DataLoader2(_graph(indexed), reading_service=rs) as dl:
        dl.seed(4)
        pool = list(dl)
    core = lean_graph(_graph(indexed))
    plan = EpochPlan(4, 0)
    full = []
    for w in range(readers):
        items, _ = logical_reader(core, plan, w, readers, init_fn=_init_fn, reset_fn=_reset_fn)
        full.append(list(items))
        k = len(full[-1]) // 2
        later, _ = logical_reader(
            core, plan, w, readers, after=k, init_fn=_init_fn, reset_fn=_reset_fn
        )
        assert list(later) == full[-1][k:]
    dealt = []
    for i in range(max(len(x) for x in full)):
        dealt.extend(x[i] for x in full if i < len(x))
    assert dealt == pool
    # each batch went through both hooks of its own reader, once each (one epoch)
    tags = {(item[0][1:], item[1], item[2]) for item in pool}
    assert tags == {(("init", w, readers), "reset", w) for w in range(readers)}
    seeds = {w: {item[3] for item in pool if item[2] == w} for w in range(readers)}
    assert all(len(s) == 1 for s in seeds.values()) and seeds[0] != seeds[1]


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


def test_the_wait_window_feeds_the_policy_the_share_of_time_waited():
    """The trainer's wait per step, over a window of items, is what the sizing policy decides on."""
    from shardpipes.raypool import SizingPolicy
    from shardpipes.raypool.sizing import WaitWindow

    policy = SizingPolicy(window=4, grow_above=0.2, shrink_below=0.05)
    window = WaitWindow(policy.window)
    # (clock, total wait, items): 8 steps of 10 ms, waiting 5 ms per step, then 0.1 ms
    steps = [(0.01 * i, 0.005 * i, i) for i in range(5)]
    steps += [(0.04 + 0.01 * i, 0.02 + 0.0001 * i, 4 + i) for i in range(1, 5)]
    shares = [x for x in (window.add(*s) for s in steps) if x is not None]
    assert shares == pytest.approx([0.5, 0.01])
    assert [policy.next_size(4, waited=x) for x in shares] == [8, 3]


# --- what the readers' stages dropped, and telemetry's figures, travel with the bundles ----------


def _odd(i: int) -> bool:
    return i % 2 == 1


def _filtered(paths: list[str]) -> Any:
    from tests._graphs import sample_id

    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .filter(_odd)
        .shuffle(buffer_size=4)
        .batch(3)
    )


def test_the_drop_totals_at_a_readers_end_are_the_worker_pools_from_any_lease(indexed):
    """Each reader's last bundle carries its filter's totals; summed, they are the worker pool's.

    A lease started by replay from item k (a moved or re-leased reader of a graph with a
    filter, which cannot seek) reports the reader's whole epoch, so whichever lease ends the
    reader, the totals are the same.
    """
    from shardpipes.raypool.reader import logical_reader

    readers = 3
    rs = MultiProcessingReadingService(readers)
    with DataLoader2(_filtered(indexed), reading_service=rs) as dl:
        dl.seed(11)
        assert all(x % 2 for b in dl for x in b)
        want = rs.flows()
    assert want is not None and want[0][0].name == "filter"
    core = lean_graph(_filtered(indexed))
    plan = EpochPlan(11, 0)
    ends = []
    for w in range(readers):
        per_start = []
        for k in (0, 2):
            items, found = logical_reader(core, plan, w, readers, after=k, replay=True)
            got = list(reader_bundles(items, w, 1, k, 2, found.counters, flows=found.flows))
            assert [b.flows is not None for b in got] == [False] * (len(got) - 1) + [True]
            per_start.append(got[-1].flows)
        assert per_start[0] == per_start[1], w
        ends.append(per_start[0])
    assert merge_flows(ends) == want[0]
    assert want[0][0].dropped > 0 and want[0][0].passing == readers


def test_the_dealer_keeps_the_end_value_of_the_lease_whose_end_it_took():
    table = LeaseTable(1)
    dealer = Dealer(table)
    old = table.grant(0, "a")
    new = table.replace(old, "b", 0)
    dealer.offer(old, 0, ["x"], end=1, at_end="fenced")
    assert dealer.at_end == [None]
    dealer.offer(new, 0, ["x"], end=1, at_end="current")
    assert dealer.at_end == ["current"] and dealer.ready(0) == 1


def test_reader_bundles_carry_a_report_with_the_first_and_last_bundles():
    from shardpipes.dataloader2.telemetry import WorkerReporter

    dp = IterableWrapper(range(9))
    reporter = WorkerReporter(dp, None)  # counted figures only: no stack sampler
    got = list(reader_bundles(iter(dp), 0, 1, 0, 2, report=reporter.report))
    assert got[0].figures is not None and got[0].figures["items"] == 2
    last = got[-1].figures
    assert last is not None and last["items"] == 9 and last["busy"] <= last["wall"]


def _report(items: int, busy: float, nbytes: int, stage: float) -> dict[str, Any]:
    return {
        "wall": 2 * busy,
        "busy": busy,
        "cpu": busy,
        "items": items,
        "stages": {"decode": stage},
        "ticks": 1,
        "sampler_cpu": 0.0,
        "storage": {"bytes_read": nbytes, "opened": 0, "closed": 0, "retries": {"503": 1}},
    }


def test_reader_figures_add_up_a_readers_leases_over_epochs():
    from shardpipes.raypool.figures import ReaderFigures

    figs = ReaderFigures()
    figs.take(0, 1, _report(2, 1.0, 10, 0.5))
    got = figs.take(0, 1, _report(4, 2.0, 30, 1.0))  # the same lease, later: replaces
    assert (got["items"], got["storage"]["bytes_read"]) == (4, 30)
    got = figs.take(0, 2, _report(1, 0.5, 5, 0.25))  # a move: a second lease of reader 0
    assert (got["items"], got["busy"], got["stages"]) == (5, 2.5, {"decode": 1.25})
    figs.take(1, 3, _report(3, 1.0, 7, 0.0))
    figs.close()  # the epoch ended
    got = figs.take(0, 4, _report(6, 1.0, 1, 0.0))  # the next epoch's lease starts from zero
    assert (got["items"], got["storage"]["bytes_read"]) == (11, 36)
    assert got["storage"]["retries"] == {"503": 3} and got["wall"] == 7.0
    assert figs.of(1)["items"] == 3
