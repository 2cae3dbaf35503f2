"""The mixture plan (shardpipes.plan.mixture): exact counts, exact splits, elastic remainders, weights followed."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardpipes.plan.mixture import Mixture, apportion, interleave, mix_reader
from shardpipes.plan.resume import Segment, Shape, worker_batches
from shardpipes.plan.seeds import buffered_shuffle, derive_seed


def _read(mix: Mixture, counts: list[int], topologies: list[tuple[int, int, int]], batch: int):
    """Every (source, position) read in an epoch run under ``topologies`` (ranks, workers, items per rank before the next)."""
    shape = Shape(batch, False, None, None)
    read: collections.Counter[tuple[int, int]] = collections.Counter()
    segments: list[Segment] = []
    for s, (world, workers, consumed) in enumerate(topologies):
        last = s == len(topologies) - 1
        current = [*segments, Segment(world, workers, True, 0)]
        readers = world * max(workers, 1)
        plans = [
            mix_reader(mix, counts, seed=5, epoch=1, segments=current, reader=r, shape=shape)
            for r in range(readers)
        ]
        lengths = [p.samples for p in plans]
        assert len(set(lengths)) == 1  # every reader the same number of samples
        per_worker = [shape.batches(n) for n in lengths[: max(workers, 1)]]
        done = worker_batches(consumed, per_worker) if not last else per_worker
        for r, p in enumerate(plans):
            o = lengths[r] if last else min(done[r % max(workers, 1)] * batch, lengths[r])
            used = np.bincount(p.sequence[:o], minlength=len(counts))
            for i, piece in enumerate(p.pieces):
                for a, b in piece.slice(0, int(used[i])).runs:
                    read.update((i, x) for x in range(a, b))
        segments.append(Segment(world, workers, True, consumed))
    return read


@pytest.mark.parametrize(
    "topologies",
    [
        [(2, 2, 0)],
        [(2, 2, 5), (3, 1, 0)],  # 2x2 -> 3x1
        [(4, 2, 3), (2, 3, 0)],  # 4x2 -> 2x3
        [(4, 2, 3), (2, 3, 4), (1, 0, 0)],  # a second resume
        [(1, 0, 17), (3, 2, 0)],
    ],
    ids=["2x2", "2x2-3x1", "4x2-2x3", "4x2-2x3-1x0", "1x0-3x2"],
)
@pytest.mark.parametrize("kind", ["proportions", "weights", "schedule"])
def test_elastic_epochs_read_each_position_at_most_once_and_miss_fewer_than_the_readers(
    topologies, kind
):
    sizes = [300, 120, 45]
    mix = {
        "proportions": Mixture(3, repeat=(1, 2.5, None), choose=(None, None, 30)),
        "weights": Mixture(3, weights=(0.5, 0.3, 0.2), samples_per_epoch=400),
        "schedule": Mixture(3, schedule=[(0, (1, 0, 0)), (40, (0.2, 0.4, 0.4))], step_samples=4),
    }[kind]
    counts = mix.counts(sizes, 1)
    read = _read(mix, counts, topologies, batch=4)
    assert max(read.values()) == 1
    assert all(0 <= p < counts[i] for i, p in read)
    allowed = sum(w * max(k, 1) - 1 for w, k, _ in topologies)
    assert sum(counts) - len(read) <= allowed
    if kind == "proportions":  # the repeat-1 source is read whole: drops come from the others
        assert {p for i, p in read if i == 0} == set(range(300))


def test_proportions_are_exact_per_epoch():
    mix = Mixture(3, repeat=(1, 2, 0.5))
    assert mix.counts([100, 30, 41], 0) == [100, 60, 21]
    assert Mixture(2, choose=(7, None)).counts([10, 5], 3) == [7, 5]
    assert sum(Mixture(3, weights=(5, 3, 2)).counts([10, 10, 10], 0)) == 30


def test_a_source_asked_for_samples_it_does_not_have_is_refused():
    with pytest.raises(ValueError, match="source 1 has no samples"):
        Mixture(2, weights=(0.5, 0.5)).counts([10, 0], 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": (1, 2, 3)}, "3 weights for 2 sources"),
        ({"weights": (0, 0)}, "not all 0"),
        ({"weights": (1, 1), "repeat": (1, 1)}, "one of weights"),
        ({"schedule": [(5, (1, 1))]}, "start at 0"),
        ({"repeat": (1, None), "choose": (3, None)}, "source 0 has both"),
    ],
)
def test_bad_mixtures_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mixture(2, **kwargs)


WEIGHTS = (0.5, 0.3, 0.2)
CHI2_99 = 9.21  # the 99% point of chi-square with 2 degrees of freedom


def test_windows_follow_the_weights_within_a_chi_square_tolerance():
    """Windows of 80 samples over 100 seeds: Pearson chi-square below chi2(2)'s 99% point in every
    window, and on average no more than i.i.d. draws by weight give (mean <= 2 = df).

    The interleave spreads each source evenly (one arrival per stratum), so windows vary less
    than independent draws would; the test fails if a source clumps.
    """
    quotas = apportion(WEIGHTS, 2000)
    expected = np.asarray(WEIGHTS) * 80
    stats = []
    for seed in range(100):
        seq = interleave(quotas, seed)
        for start in range(0, 2000 - 80, 240):
            got = np.bincount(seq[start : start + 80], minlength=3)
            stats.append(float(((got - expected) ** 2 / expected).sum()))
    assert max(stats) < CHI2_99, max(stats)
    assert np.mean(stats) <= 2.0, np.mean(stats)
    assert len({interleave(quotas, s)[:40].tobytes() for s in range(20)}) == 20  # it is random


def test_a_schedule_changes_the_composition_where_its_step_falls():
    mix = Mixture(2, schedule=[(0, (0.9, 0.1)), (50, (0.1, 0.9))], step_samples=8)
    counts = mix.counts([1000, 1000], 0)
    assert counts == [360 + 160, 40 + 1440]  # 400 samples at 0.9/0.1, then 1600 at 0.1/0.9
    plan = mix_reader(
        mix,
        counts,
        seed=1,
        epoch=0,
        segments=[Segment(4, 0, True, 0)],
        reader=2,
        shape=Shape(None, False, None, None),
    )
    seq = plan.sequence  # 500 samples; the change at global sample 400 = local 100
    assert np.bincount(seq[:100], minlength=2)[0] >= 85
    assert np.bincount(seq[110:], minlength=2)[1] >= 0.85 * 390


def test_round_robin_alternates():
    assert interleave([3, 3, 3], 0, even=True).tolist() == [0, 1, 2] * 3


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    world=st.integers(1, 4),
    workers=st.integers(0, 3),
    world2=st.integers(1, 4),
    workers2=st.integers(0, 3),
    stop=st.integers(0, 12),
)
def test_any_elastic_resume_is_exact(sizes, world, workers, world2, workers2, stop):
    mix = Mixture(len(sizes), repeat=tuple(1 + (i % 2) for i in range(len(sizes))))
    counts = mix.counts(sizes, 1)
    readers = world * max(workers, 1)
    per = sum(counts) // readers
    consumed = min(stop, (-(-per // 2)) * max(workers, 1))
    read = _read(mix, counts, [(world, workers, consumed), (world2, workers2, 0)], batch=2)
    assert max(read.values(), default=1) == 1
    assert sum(counts) - len(read) <= readers - 1 + world2 * max(workers2, 1) - 1


@pytest.mark.parametrize("first", [0, 1, 5, 160, 161, 449, 450, 500])
def test_the_first_arrivals_are_those_of_the_whole_interleave(first):
    q = [300, 100, 50]
    assert (interleave(q, 3, first=first) == interleave(q, 3)[:first]).all()
    mix = Mixture(3, schedule=[(0, (1, 0, 0)), (40, (0.2, 0.4, 0.4))], step_samples=4)
    p = mix.profile(0, 450, q)
    assert (interleave(q, 5, p, first=first) == interleave(q, 5, p)[:first]).all()


def _shuffle_seed(path: tuple[int, ...]) -> int:
    return derive_seed([9, *path])


def _items(plan, seed: int, buffer: int) -> list[tuple[int, int]]:
    """What a reader yields: its mix, (source, position) per sample, through the shuffle after it."""
    where = [iter(p.at(range(len(p)))) for p in plan.pieces]
    mixed = [(int(i), next(where[i])) for i in plan.sequence.tolist()]
    start = plan.shuffle or (seed, 0, [])
    return list(buffered_shuffle(mixed, lambda: start, buffer))


@pytest.mark.parametrize(
    "topologies",
    [[(2, 2, 5), (2, 2, 0)], [(2, 2, 5), (3, 1, 0)], [(4, 2, 3), (2, 3, 4), (1, 0, 0)]],
    ids=["same", "2x2-3x1", "4x2-2x3-1x0"],
)
@pytest.mark.parametrize("kind", ["proportions", "schedule"])
def test_a_shuffle_after_the_mix_resumes_exactly(topologies, kind):
    sizes = [300, 120, 45]
    mix = {
        "proportions": Mixture(3, repeat=(1, 2.5, None), choose=(None, None, 30)),
        "schedule": Mixture(3, schedule=[(0, (1, 0, 0)), (40, (0.2, 0.4, 0.4))], step_samples=4),
    }[kind]
    counts = mix.counts(sizes, 1)
    buffer, batch = 7, 4
    shape = Shape(batch, False, buffer, 0)
    read: collections.Counter[tuple[int, int]] = collections.Counter()
    segments: list[Segment] = []
    for s, (world, workers, consumed) in enumerate(topologies):
        last = s == len(topologies) - 1
        same = bool(segments) and (segments[-1].world_size, segments[-1].num_workers) == (
            world,
            workers,
        )
        current = (
            [*segments[:-1], Segment(world, workers, True, segments[-1].consumed)]
            if same
            else [*segments, Segment(world, workers, True, 0)]
        )
        readers = world * max(workers, 1)
        per_worker = None
        for r in range(readers):
            plan = mix_reader(
                mix,
                counts,
                seed=5,
                epoch=1,
                segments=current,
                reader=r,
                shape=shape,
                shuffle_seed=_shuffle_seed,
            )
            items = _items(plan, 0, buffer)
            if per_worker is None:
                total = len(items) + (plan.shuffle[1] if plan.shuffle else 0)
                per_worker = [-(-total // batch)] * max(workers, 1)
            o = (
                len(items)
                if last
                else worker_batches(consumed, per_worker)[r % max(workers, 1)] * batch
            )
            read.update(items[:o])
        segments = current[:-1] + [
            Segment(world, workers, True, consumed + (current[-1].consumed if same else 0))
        ]
    assert max(read.values()) == 1
    allowed = sum(w * max(k, 1) - 1 for w, k, _ in topologies)
    assert sum(counts) - len(read) <= allowed


@pytest.mark.parametrize("o", [0, 4, 8, 60, 62])
def test_a_reader_resumed_with_its_shuffle_yields_what_it_would_have(o):
    mix = Mixture(3, weights=(0.5, 0.3, 0.2), samples_per_epoch=500)
    counts = mix.counts([300, 120, 45], 0)
    shape = Shape(4, False, 7, 0)

    def plan(consumed: int):
        return mix_reader(
            mix,
            counts,
            seed=2,
            epoch=0,
            segments=[Segment(2, 0, True, consumed)],
            reader=1,
            shape=shape,
            shuffle_seed=_shuffle_seed,
        )

    whole = _items(plan(0), 0, 7)
    assert whole[o * 4 :] == _items(plan(o), 0, 7)
