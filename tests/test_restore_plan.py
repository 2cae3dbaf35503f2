"""The restore decision (``shardpipes.plan.restore``), checked by properties over states and topologies.

What the readers then read is checked against the loader simulation of ``test_resume_plan``
(written independently of the planner): the same topology continues item for item; another one,
and a second resume after it, reads exactly what the earlier stretches had not yielded.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st

from _hyp import budget
from shardpipes.plan.restore import Decision, GraphFacts, Position, Refusal, Topology, restore
from shardpipes.plan.resume import Segment, Shape
from test_resume_plan import flat, positions, reader_seed, run, shapes, uninterrupted

topologies = st.builds(
    lambda ranks, workers, distributed: Topology(ranks if distributed else 1, workers, distributed),
    st.integers(1, 3),
    st.integers(0, 3),
    st.booleans(),
)
segments = st.lists(
    st.builds(lambda t, c: t.segment(c), topologies, st.integers(0, 9)), max_size=2
).map(tuple)
positions_ = st.builds(
    Position,
    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    seeded=st.booleans(),
    epoch=st.integers(0, 3),
    consumed=st.integers(0, 20),
    segments=segments,
    skipped=st.sampled_from([0, 0, 2]),
    epochs_run=st.integers(0, 3),
)
facts = st.builds(
    GraphFacts,
    seek_refusal=st.sampled_from([None, "the graph has no sharding_by_index"]),
    carries_across_epochs=st.booleans(),
)


@settings(max_examples=budget(400), deadline=None)
@given(position=positions_, graph=facts, old=topologies, new=topologies)
def test_a_refusal_exactly_when_the_epoch_must_seek_and_cannot(position, graph, old, new):
    found = restore(position, graph, old, new)
    carried = graph.carries_across_epochs and max(position.epoch, position.epochs_run) > 0
    cannot = graph.seek_refusal is not None or position.skipped > 0
    must_seek = position.started and (not old.same_split(new) or bool(position.segments))
    assert isinstance(found, Refusal) == (carried or (must_seek and cannot))
    if isinstance(found, Refusal):
        assert ("fixed_length" in found.reason) == carried
        return
    # Otherwise the epoch and its seed are the state's, and what the readers do follows.
    if position.seed is None:
        assert (found.seed, found.epoch, found.pending) == (None, 0, False)
    else:
        assert (found.seed, found.epoch) == (position.seed, position.epoch)
        assert found.pending == (not position.seeded)
    assert found.epochs_run == position.epochs_run
    if not position.started:
        assert (found.action, found.skip, found.segments) == ("fresh", 0, ())
    elif cannot:
        assert (found.action, found.skip, found.segments) == ("replay", position.consumed, ())
    else:
        assert found.action == "seek" and found.skip == 0
        here = old.segment(position.consumed)
        tail = (here,) if old.same_split(new) else (here, new.segment(0))
        assert found.segments == (*position.segments, *tail)
        assert found.segments[-1].readers == new.readers


@settings(max_examples=budget(100), deadline=None)
@given(
    position=positions_,
    old=topologies,
    new=topologies,
    change=st.sampled_from(["restart_epoch", "next_epoch"]),
)
def test_a_changed_dataset_restarts_the_epoch_or_starts_the_next(position, old, new, change):
    found = restore(position, GraphFacts("no index"), old, new, on_change=change)
    assert isinstance(found, Decision)
    assert (found.skip, found.segments) == (0, ())
    assert found.action == ("next_epoch" if change == "next_epoch" else "fresh")
    if position.seed is not None:
        assert found.epoch == position.epoch + (change == "next_epoch")


def _read(decision: Decision, total: int, policy: str, shape: Shape, topology: Topology):
    """Per-rank items of the readers of ``topology`` as the decision plans them (simulated)."""
    plans = [
        decision.reader_plan(i, total, policy, shape, reader_seed) for i in range(topology.readers)
    ]
    samples = [p.read_order()[0] + positions(p.rest) for p in plans]
    starts = [(p.first_draw, p.read_order()[1]) for p in plans]
    last = decision.segments[-1]
    return run(last, samples, [p.seed for p in plans], shape, starts), plans


@settings(max_examples=budget(300), deadline=None)
@given(
    total=st.integers(0, 100),
    old=topologies,
    shape=shapes,
    policy=st.sampled_from(["drop", "pad"]),
    where=st.floats(0, 1),
)
def test_the_same_topology_continues_item_for_item(total, old, shape, policy, where):
    full = uninterrupted(total, old.segment(0), shape, policy)
    k = round(where * len(full[0]))
    decision = restore(Position(3, True, 0, k), GraphFacts(), old, old)
    assert isinstance(decision, Decision)
    if k == 0:
        assert decision.action == "fresh"
        return
    items, _ = _read(decision, total, policy, shape, old)
    assert items == [rank_items[k:] for rank_items in full]


@settings(max_examples=budget(300), deadline=None)
@given(
    total=st.integers(1, 100),
    old=topologies,
    new=topologies,
    last=topologies,
    shape=shapes,
    policy=st.sampled_from(["drop", "pad"]),
    where=st.floats(0, 1),
    where2=st.floats(0, 1),
)
def test_what_the_new_readers_read_is_what_the_old_run_had_not_yielded(
    total, old, new, last, shape, policy, where, where2
):
    """Ranks and workers up and down, then a second resume on a third topology."""
    full = uninterrupted(total, old.segment(0), shape, policy)
    k = round(where * len(full[0]))
    n = old.readers
    per = total // n if policy == "drop" else -(-total // n)
    assigned = Counter((i * per + j) % total for i in range(n) for j in range(per))
    yielded = Counter(x for rank_items in full for x in flat(rank_items[:k], shape))
    first = restore(Position(3, True, 0, k), GraphFacts(), old, new)
    assert isinstance(first, Decision)
    if k == 0:  # nothing yielded: the new topology starts the epoch afresh
        assert first.action == "fresh"
        return
    items, plans = _read(first, total, policy, shape, new)
    left = assigned - yielded
    if plans[0].dropped or plans[0].padded or per * n > total:
        return  # an uneven split evens the ranks out (test_resume_plan checks by how much)
    if not old.same_split(new):
        assert Counter(x for p in plans for x in positions(p.runs)) == left
    # The second resume: the new topology yielded k2 items, then the state goes to `last`.
    k2 = round(where2 * len(items[0]))
    yielded += Counter(x for rank_items in items for x in flat(rank_items[:k2], shape))
    # (a stretch's count goes on from where it was restored: k + k2 on the same topology)
    state = Position(3, True, 0, first.segments[-1].consumed + k2, segments=first.segments[:-1])
    second = restore(state, GraphFacts(), new, last)
    assert isinstance(second, Decision)
    if not state.started:
        return
    got, plans = _read(second, total, policy, shape, last)
    if plans[0].dropped or plans[0].padded:
        return
    event("second resume checked")
    assert Counter(x for p in plans for x in positions(p.runs)) == assigned - yielded
    assert len({len(rank_items) for rank_items in got}) == 1  # equal items on every rank
    after = Counter(x for rank_items in got for x in flat(rank_items, shape))
    assert not (yielded & after)  # nothing yielded twice in the epoch


def test_segments_from_a_state_are_the_plan_values():
    """The state's list form is the plan's ``Segment``: ``[ranks, workers, distributed, consumed]``."""
    assert Topology(2, 3, True).segment(5) == Segment.from_list([2, 3, 1, 5])
