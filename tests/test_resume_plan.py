"""The seek-resume planner, checked against a simulation of the loader on sample positions.

The simulation is written independently of ``shardpipes.plan.resume``: each reader takes its
contiguous piece of the epoch (``partition``'s rule), shuffles it with the counter-based buffer
shuffle, batches it, and each rank takes its workers' batches round-robin. A resume is then
checked item for item (same topology) or for coverage (elastic).
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import shardpipes.plan.seeds as seeds_module
from _hyp import budget
from shardpipes.plan.resume import Runs, Segment, Shape, reader_plan, worker_batches
from shardpipes.plan.seeds import buffered_shuffle, derive_seed


def reader_seed(path):
    return derive_seed([7, 3, 1, 1, *path])


def positions(runs: Runs) -> list[int]:
    return [p for a, b in runs.runs for p in range(a, b)]


def batches_of(samples, shape: Shape):
    size = shape.batch_size or 1
    out = [samples[i : i + size] for i in range(0, len(samples), size)]
    if shape.drop_last and out and len(out[-1]) < size:
        out.pop()
    return out if shape.batch_size else [s[0] for s in out]


def round_robin(streams):
    """torch's in-order pool: worker 0, 1, ...; a worker leaves the rotation when it runs out."""
    out, iters = [], [iter(s) for s in streams]
    done = object()
    while iters:
        alive = []
        for it in iters:
            item = next(it, done)
            if item is not done:
                out.append(item)
                alive.append(it)
        iters = alive
    return out


def path(seg: Segment, reader: int):
    return seg.path(reader)


def run(seg: Segment, readers_samples, seeds, shape: Shape, first_draws=None):
    """Per-rank item lists of a segment whose readers read ``readers_samples`` (lists)."""
    workers = max(seg.num_workers, 1)
    streams = []
    for i, samples in enumerate(readers_samples):
        if shape.buffer_size is None:
            order = list(samples)
        else:
            at = (seeds[i], *(first_draws[i] if first_draws else (0, [])))
            order = list(buffered_shuffle(samples, lambda at=at: at, shape.buffer_size))
        streams.append(batches_of(order, shape))
    return [round_robin(streams[r * workers : (r + 1) * workers]) for r in range(seg.world_size)]


def uninterrupted(total, seg: Segment, shape: Shape, policy):
    n = seg.readers
    per = total // n if policy == "drop" else -(-total // n)
    pieces = [[(i * per + j) % total for j in range(per)] if total else [] for i in range(n)]
    return run(seg, pieces, [reader_seed(path(seg, i)) for i in range(n)], shape)


def flat(items, shape: Shape):
    return [x for item in items for x in (item if shape.batch_size else [item])]


topologies = st.tuples(st.integers(1, 3), st.integers(0, 3), st.booleans()).map(
    lambda t: (1 if not t[2] else t[0], t[1], t[2])
)
shapes = st.builds(
    Shape,
    batch_size=st.one_of(st.none(), st.integers(1, 7)),
    drop_last=st.booleans(),
    buffer_size=st.one_of(st.none(), st.integers(1, 12)),
    shuffle_stage=st.just(1),
)


def resumed(total, policy, segments, shape):
    last = segments[-1]
    plans = [
        reader_plan(total, policy, segments, i, shape, reader_seed) for i in range(last.readers)
    ]
    # Read as the sharder does: the buffer's samples sorted, then the rest of the range; the
    # shuffle puts them back in their slots.
    samples = [p.read_order()[0] + positions(p.rest) for p in plans]
    starts = [(p.first_draw, p.read_order()[1]) for p in plans]
    items = run(last, samples, [p.seed for p in plans], shape, starts)
    return items, plans


@settings(max_examples=budget(300), deadline=None)
@given(
    total=st.integers(0, 120),
    topo=topologies,
    shape=shapes,
    policy=st.sampled_from(["drop", "pad"]),
    where=st.floats(0, 1),
)
def test_same_topology_resume_yields_exactly_the_rest(total, topo, shape, policy, where):
    seg = Segment(*topo, consumed=0)
    full = uninterrupted(total, seg, shape, policy)
    assert len({len(items) for items in full}) == 1  # equal lengths on every rank
    k = round(where * len(full[0]))
    items, _ = resumed(total, policy, [Segment(*topo, consumed=k)], shape)
    assert items == [rank_items[k:] for rank_items in full]


@settings(max_examples=budget(300), deadline=None)
@given(
    total=st.integers(0, 120),
    old=topologies,
    new=topologies,
    shape=shapes,
    policy=st.sampled_from(["drop", "pad"]),
    where=st.floats(0, 1),
)
def test_elastic_resume_covers_what_was_not_yielded(total, old, new, shape, policy, where):
    first = Segment(*old, consumed=0)
    full = uninterrupted(total, first, shape, policy)
    k = round(where * len(full[0]))
    before = Counter(x for rank_items in full for x in flat(rank_items[:k], shape))
    epoch = Counter(x for rank_items in full for x in flat(rank_items, shape))
    # What the uninterrupted epoch would have yielded (with batch drop_last, what the readers
    # read but dropped in partial batches counts as read too: it is not yielded either way).
    n = first.readers
    per = total // n if policy == "drop" else -(-total // n)
    assigned = (
        Counter((i * per + j) % total for i in range(n) for j in range(per)) if total else Counter()
    )
    items, plans = resumed(
        total, policy, [Segment(*old, consumed=k), Segment(*new, consumed=0)], shape
    )
    assert len({len(rank_items) for rank_items in items}) == 1  # equal lengths on every new rank
    after = Counter(x for rank_items in items for x in flat(rank_items, shape))
    dropped, padded = plans[0].dropped, plans[0].padded
    read_after = Counter(x for p in plans for x in positions(p.runs))
    left = assigned - before
    if not dropped and not padded:
        assert read_after == left  # every sample not yet yielded is read exactly once
    elif dropped:
        assert sum((left - read_after).values()) == dropped and not read_after - left
    else:
        assert sum((read_after - left).values()) == padded and not left - read_after
    assert not after - read_after  # what is yielded after the resume was read after it
    if not padded:
        assert not (before + after) - assigned  # no sample yielded twice in the epoch
    if not dropped and not padded and not shape.drop_last:
        assert before + after == epoch  # the epoch's samples, each once, as uninterrupted


def test_state_after_resume_continues_the_same_segment():
    """Resuming twice in one stretch (k1, then k1 + k2) is the same as resuming once at k1 + k2."""
    shape = Shape(batch_size=3, drop_last=False, buffer_size=5, shuffle_stage=1)
    seg = Segment(2, 2, True, consumed=0)
    full = uninterrupted(57, seg, shape, "drop")
    for k in range(len(full[0]) + 1):
        items, _ = resumed(57, "drop", [Segment(2, 2, True, consumed=k)], shape)
        assert items == [r[k:] for r in full], k


def test_cost_does_not_grow_with_the_position(monkeypatch):
    """Planning reads no data and scans ~buffer*ln(buffer) draws wherever the epoch stopped.

    The cost is counted in draws (every random number the plan computes), not timed.
    """
    draws = 0
    real = seeds_module.shuffle_draws

    def counting(seed, start, count):
        nonlocal draws
        draws += count
        return real(seed, start, count)

    monkeypatch.setattr(seeds_module, "shuffle_draws", counting)
    buffer = 1000
    shape = Shape(batch_size=64, drop_last=False, buffer_size=buffer, shuffle_stage=1)
    total = 4_000_000  # 31,250 batches per rank
    seen = {}
    for k in (10, 3_000, 30_000):
        draws = 0
        plan = reader_plan(total, "drop", [Segment(2, 2, True, consumed=k)], 0, shape, reader_seed)
        seen[k] = draws
        assert len(plan.runs.runs) <= buffer + 1  # the buffer's samples, then one run: the rest
    # Coupon collecting over 1000 slots takes ~7,500 draws; the scan reads them in doubling
    # chunks (4,000 then 8,000). A cost growing with the position would be ~k * 64 / 2 draws.
    assert seen[10] <= seen[3_000] == seen[30_000] <= 16 * buffer


def test_worker_batches_round_robin():
    assert worker_batches(0, [2, 2]) == [0, 0]
    assert worker_batches(3, [2, 2]) == [2, 1]
    assert worker_batches(4, [1, 3, 0]) == [1, 3, 0]
    for counts in itertools.product(range(4), repeat=3):
        order = round_robin([[w] * c for w, c in enumerate(counts)])
        for k in range(len(order) + 1):
            assert worker_batches(k, counts) == [order[:k].count(w) for w in range(3)]


@settings(max_examples=budget(200), deadline=None)
@given(
    total=st.integers(0, 100),
    topos=st.lists(topologies, min_size=2, max_size=3),
    shape=shapes,
    where=st.lists(st.floats(0, 1), min_size=3, max_size=3),
)
def test_several_elastic_resumes_in_one_epoch(total, topos, shape, where):
    """Each stretch continues exactly (checked against its own uninterrupted run), and over the
    whole epoch no sample is yielded twice; without drops, every one is yielded."""
    policy = "drop"
    segments: list[Segment] = []
    yielded: Counter = Counter()
    any_drop = False
    for s, topo in enumerate(topos):
        start = [*segments, Segment(*topo, consumed=0)]
        items, plans = resumed(total, policy, start, shape)
        any_drop |= bool(plans[0].dropped)
        k = round(where[s] * len(items[0])) if s < len(topos) - 1 else len(items[0])
        if k:  # resuming inside this stretch gives exactly the rest of it
            again, _ = resumed(total, policy, [*segments, Segment(*topo, consumed=k)], shape)
            assert again == [r[k:] for r in items]
        yielded += Counter(x for r in items for x in flat(r[:k], shape))
        segments.append(Segment(*topo, consumed=k))
    assert max(yielded.values(), default=1) == 1
    n = segments[0].readers
    if not any_drop and not shape.drop_last and total % n == 0:
        assert sorted(yielded) == list(range(total))
