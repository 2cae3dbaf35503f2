"""Checkpoints bound to the data and the plan; sample identities; the cross-rank check (issue 28)."""

from __future__ import annotations

import json
import os

import pytest

from _dist import run_ranks
from _graphs import indexed_graph
from _graphs import sample_id as global_id
from shardpipes.cli import main
from shardpipes.dataloader2 import DataLoader2, DistributedReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.index_sharding import IndexSharderIterDataPipe
from shardpipes.errors import AttestationError, StateMismatchError, WorkerError
from shardpipes.index import ShardIndex, build_index, default_index_url
from shardpipes.plan.mixture import Mixture
from shardpipes.storage.ranges import ShardRange
from shardpipes.synthetic import write_synthetic
from shardpipes.verify import verify


def _dataset(folder, counts):
    paths = write_synthetic(folder, shards=len(counts), samples=counts, payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))
    return paths


def _state_after(paths, batches=3):
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.seed(5)
        it = iter(dl)
        for _ in range(batches):
            next(it)
        return dl.state_dict()


def test_resume_refused_after_a_shard_is_added(tmp_path):
    """The issue's example (a): a shard added and the index rebuilt."""
    paths = _dataset(tmp_path, [10, 10, 10])
    state = _state_after(paths)
    paths = _dataset(tmp_path, [10, 10, 10, 10])
    with DataLoader2(indexed_graph(paths)) as dl, pytest.raises(ValueError, match="added"):
        dl.load_state_dict(state)


def test_resume_refused_after_a_shard_is_rewritten_smaller(tmp_path):
    """The issue's example (b): a shard rewritten with fewer samples under the same name."""
    paths = _dataset(tmp_path, [10, 10, 10])
    state = _state_after(paths)
    os.remove(default_index_url(paths))
    paths = _dataset(tmp_path, [10, 3, 10])
    with DataLoader2(indexed_graph(paths)) as dl, pytest.raises(ValueError, match="resized"):
        dl.load_state_dict(state)


def _all(paths, state, **kwargs):
    with DataLoader2(indexed_graph(paths, **kwargs)) as dl:
        dl.load_state_dict(state, on_change="restart_epoch")
        return [x for b in dl for x in b]


def test_on_change_restarts_the_epoch_on_the_new_data(tmp_path):
    paths = _dataset(tmp_path, [10, 10, 10])
    state = _state_after(paths)
    paths = _dataset(tmp_path, [10, 10, 10, 10])
    got = _all(paths, state)
    assert sorted(got) == list(range(40))  # the whole epoch of the new data, from its start
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.load_state_dict(state, on_change="next_epoch")
        assert dl.state_dict()["epoch"] == state["epoch"] + 1
    with (
        DataLoader2(indexed_graph(paths)) as dl,
        pytest.raises(ValueError, match="on_change 'ignore' is not known"),
    ):
        dl.load_state_dict(state, on_change="ignore")


def test_resume_refused_with_another_plan(tmp_path):
    paths = _dataset(tmp_path, [10, 10, 10])
    state = _state_after(paths)
    with (
        DataLoader2(indexed_graph(paths, buffer_size=32)) as dl,
        pytest.raises(StateMismatchError, match=r"Shuffler\(b=16\) -> Shuffler\(b=32\)"),
    ):
        dl.load_state_dict(state)


def test_unchanged_data_resumes_exactly(tmp_path):
    paths = _dataset(tmp_path, [10, 10, 10])
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.seed(5)
        full = [list(b) for b in dl]
    state = _state_after(paths)
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.load_state_dict(state)
        assert [list(b) for b in dl] == full[3:]


def test_seed_after_restore_would_restart_at_zero(tmp_path):
    """A second resume that silently restarts at zero (huggingface/datasets#8308's shape)."""
    paths = _dataset(tmp_path, [10, 10, 10])
    state = _state_after(paths)
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError, match=r"seed\(5\) would discard the position"):
            dl.seed(5)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"consumed": 0}, "reset to zero: a restart would repeat 3 items"),
        ({"consumed": 1}, "edited: a restart would repeat 2 items"),
    ],
    ids=["reset-to-zero", "moved-back"],
)
def test_state_whose_position_contradicts_itself(tmp_path, edit, match):
    paths = _dataset(tmp_path, [10, 10, 10])
    state = {**_state_after(paths), **edit}
    with DataLoader2(indexed_graph(paths)) as dl, pytest.raises(StateMismatchError, match=match):
        dl.load_state_dict(state)


def test_skip_at_an_epoch_boundary(tmp_path):
    """A state at an epoch boundary whose epoch jumped (verl-project/verl#7401's shape)."""
    paths = _dataset(tmp_path, [10, 10, 10])
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.seed(5)
        for _ in dl:
            pass
        state = dl.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    with DataLoader2(indexed_graph(paths)) as dl:
        dl.load_state_dict(state)  # the honest state loads
    with (
        DataLoader2(indexed_graph(paths)) as dl,
        pytest.raises(StateMismatchError, match="last epoch this run completed was epoch 0"),
    ):
        dl.load_state_dict({**state, "epoch": 2})


def test_a_state_and_its_binding_travel_as_json(tmp_path):
    paths = _dataset(tmp_path, [10, 10, 10])
    state = json.loads(json.dumps(_state_after(paths)))
    binding = state["binding"]
    assert binding["data"]["shards"] == 3 and binding["data"]["samples"] == 30
    assert binding["rank"] == 0 and len(binding["run"]) == 16
    assert binding["steps"] == 3 and binding["before"] == 0


# --- the ranks' check, on real gloo ranks -------------------------------------------------


def _rs():
    return DistributedReadingService(timeout=60)


def _plain(paths, *, sharded=True, index=True, dropping=False):
    """Batches of sample dicts (they keep ``__url__`` and ``__key__``: their identity).

    ``dropping``: a map replaces each sample by its global id (the usual pattern); the ids
    then travel beside the samples (``batch.ids``).
    """
    dp = IterableWrapper(paths).shuffle()
    if sharded:
        dp = dp.sharding_by_index() if index else dp.sharding_filter()
    return _tail(dp, dropping)


def _tail(dp, dropping):
    dp = dp.open_files_by_fsspec().load_from_tar().webdataset()
    if dropping:
        dp = dp.decode().map(global_id)
    return dp.batch(2)


def _keys(batch):
    return [s["__key__"] if isinstance(s, dict) else s for s in batch]


def rank_saves(rank, world, paths, k):
    """Each rank's state after k batches, and after 2k batches."""
    with DataLoader2(_plain(paths), reading_service=_rs()) as dl:
        dl.attest(every=2)
        dl.seed(1)
        it = iter(dl)
        states = []
        for _ in range(2):
            for _ in range(k):
                next(it)
            states.append(dl.state_dict())
    return states


def rank_resumes(rank, world, paths, states):
    """Load ``states[rank]`` (``None``: no state) and read the epoch; the error text if any."""
    try:
        with DataLoader2(_plain(paths), reading_service=_rs()) as dl:
            dl.attest(every=2)
            if states[rank] is not None:
                dl.load_state_dict(states[rank])
            else:
                dl.seed(1)
            it = iter(dl)
            return ("ok", [_keys(b) for b in it])
    except AttestationError as exc:
        return (exc.fault, str(exc))


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("nine"), [11, 13, 7])


def rank_saves_twice(rank, world, paths, k):
    """Two runs of the same job, one after the other: ``rank_saves`` of each."""
    return [rank_saves(rank, world, paths, k) for _ in range(2)]


def rank_resumes_each(rank, world, paths, cases):
    """``rank_resumes`` for each list of states in turn, on the same ranks."""
    return [rank_resumes(rank, world, paths, states) for states in cases]


@pytest.mark.distributed
def test_ranks_catch_faulty_resumes(nine, tmp_path):
    # Two jobs of 2 ranks (the saves, then every resume in turn), not six: the same checks.
    saved = run_ranks(rank_saves_twice, 2, nine, 2)
    first = [saved[0][0], saved[1][0]]  # one run: states after 2 and 4 batches
    other = [saved[0][1], saved[1][1]]  # another run of the same job
    cases = {
        "ok": [first[0][1], first[1][1]],  # the honest resume
        # a stale state file from another run on rank 1
        "other-run": [first[0][1], other[1][1]],
        # rank 1's state lost (e.g. when the number of ranks changed): it starts fresh
        "dropped-state": [first[0][1], None],
        # rank 1 resumes an older checkpoint of the same run: a restart of its stretch
        "out-of-step": [first[0][1], first[1][0]],
    }
    got = run_ranks(rank_resumes_each, 2, nine, list(cases.values()))
    for i, fault in enumerate(cases):
        for rank in range(2):
            kind, text = got[rank][i]
            assert kind == fault, (fault, rank, text)
            if fault != "ok":
                assert f"rank {rank}: epoch 0, step " in text


def rank_unsharded(rank, world, paths, dropping=False):
    try:
        with DataLoader2(
            _plain(paths, sharded=False, dropping=dropping), reading_service=_rs()
        ) as dl:
            dl.attest(every=4)
            dl.seed(1)
            return ("ok", len([b for b in dl]))
    except AttestationError as exc:
        return (exc.fault, str(exc))


@pytest.mark.distributed
@pytest.mark.parametrize("dropping", [False, True], ids=["samples", "dropping-map"])
def test_ranks_catch_every_rank_reading_the_same_samples(nine, dropping):
    """Every rank drew the same sequence (yaak-ai/rbyte PR 106's shape): the first window."""
    got = run_ranks(rank_unsharded, 2, nine, dropping)
    for rank, (kind, text) in enumerate(got):
        assert kind == "duplicate"
        assert f"rank {rank}: epoch 0, step 4: duplicate: ranks 0 and 1 yielded the same 8" in text


def rank_lists(rank, world, paths):
    try:
        with DataLoader2(_plain(paths[: 2 + rank]), reading_service=_rs()) as dl:
            dl.seed(1)
            return ("ok", len([b for b in dl]))
    except AttestationError as exc:
        return (exc.fault, str(exc))


@pytest.mark.distributed
def test_ranks_catch_different_shard_lists(nine):
    got = run_ranks(rank_lists, 2, nine)
    for kind, text in got:
        assert kind == "other-data"
        assert "other shard lists" in text and "rank(s) 0" in text and "rank(s) 1" in text


class FaultySharder(IndexSharderIterDataPipe):
    """A faulty sharder on one rank: it reads rank 0's range, or its own range wrong.

    ``fault``: ``"stuck"`` (whatever rank it is given, rank 0's range), ``"skip"`` (its first
    range without its first sample: a skipped stretch), ``"shift"`` (its first range one
    sample earlier: as many samples, one of them rank 0's, one of its own never read).
    """

    def __init__(self, source, fault, paths):
        super().__init__(source)
        self.fault = fault
        self.paths = paths

    def apply_sharding(self, num_of_instances, instance_id, sharding_group=None):
        stuck = 0 if self.fault == "stuck" else instance_id
        super().apply_sharding(num_of_instances, stuck, sharding_group)

    def __iter__(self):
        # The honest stage's generator, not its __iter__: torch's hook around that would count
        # a second iterator of this stage and invalidate the first.
        ranges = IndexSharderIterDataPipe.__iter__.__wrapped__(self)
        first = next(ranges, None)
        if first is None:
            return
        if self.fault in ("skip", "shift"):
            urls = [str(first)]
            index = ShardIndex.load(default_index_url(self.paths))
            entry = index.shards[int(index.positions(urls)[0])]
            start, stop = first.start + 1, first.stop
            if self.fault == "shift":
                start, stop = first.start - 1, first.stop - 1
            first = ShardRange(str(first), start, stop, *entry.byte_range(start, stop))
        yield first
        yield from ranges


FaultySharder.__name__ = "IndexSharderIterDataPipe"  # the same plan as the honest stage


def rank_whole_epoch(rank, world, paths, faulty_rank, fault="stuck", dropping=False):
    urls = IterableWrapper(paths).shuffle()
    sharded = FaultySharder(urls, fault, paths) if rank == faulty_rank else urls.sharding_by_index()
    dp = _tail(sharded, dropping)
    try:
        with DataLoader2(dp, reading_service=_rs()) as dl:
            dl.attest(every=100)  # longer than the epoch: only its end is checked
            dl.seed(1)
            return ("ok", [_keys(b) for b in dl])
    except AttestationError as exc:
        return (exc.fault, str(exc))


@pytest.fixture(scope="module")
def even(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("even"), [11, 13, 8])


def rank_whole_epochs(rank, world, paths, cases):
    """``rank_whole_epoch`` for each ``(faulty_rank, fault, dropping)`` in turn, on the same ranks."""
    return [rank_whole_epoch(rank, world, paths, *case) for case in cases]


#: Every whole-epoch case of the two tests below: (faulty rank, fault, dropping).
_WHOLE_EPOCHS = [
    (faulty, fault, dropping)
    for dropping in (False, True)
    for faulty, fault in [(-1, "stuck"), (1, "stuck"), (1, "skip"), (1, "shift")]
]


@pytest.fixture(scope="module")
def whole_epochs(even):
    """Each case's per-rank results, all from one job of 2 gloo ranks (eight jobs before)."""
    got = run_ranks(rank_whole_epochs, 2, even, _WHOLE_EPOCHS)
    return {case: [got[rank][i] for rank in range(2)] for i, case in enumerate(_WHOLE_EPOCHS)}


@pytest.mark.distributed
@pytest.mark.parametrize("dropping", [False, True], ids=["samples", "dropping-map"])
def test_epoch_check_against_the_plan(whole_epochs, dropping):
    honest = whole_epochs[(-1, "stuck", dropping)]
    assert [kind for kind, _ in honest] == ["ok", "ok"]
    keys = [k for _, batches in honest for b in batches for k in b]
    assert len(keys) == len(set(keys)) == 32  # the check passed a run that is right
    stuck = whole_epochs[(1, "stuck", dropping)]  # rank 0's range on 1
    for rank, (kind, text) in enumerate(stuck):
        assert kind == "duplicate", text
        assert f"rank {rank}: epoch 0, step 8: duplicate: ranks 0 and 1 yielded the same 16" in text


@pytest.mark.distributed
@pytest.mark.parametrize("dropping", [False, True], ids=["samples", "dropping-map"])
@pytest.mark.parametrize(
    ("fault", "verdict", "what"),
    [
        ("skip", "skipped", "yielded 31 samples this epoch, the plan 32: 1 of the dataset's"),
        ("shift", "other-range", "yielded 32 samples this epoch, the plan 32: as many samples"),
    ],
    ids=["skipped-stretch", "wrong-range"],
)
def test_epoch_end_verdicts(whole_epochs, fault, verdict, what, dropping):
    """A rank reads a stretch too few, or a range one sample off: found at the epoch's end."""
    got = whole_epochs[(1, fault, dropping)]
    for rank, (kind, text) in enumerate(got):
        assert kind == verdict, text
        assert f"rank {rank}: epoch 0, step 8: {verdict}: the ranks together {what}" in text


# --- shardpipes verify ------------------------------------------------------------------------


def _states_and_log(paths, log_dir, faulty, dropping=False):
    """A run saving states after 2 and 4 batches; ``faulty``: the resume restarts at zero."""
    states = []
    with DataLoader2(_plain(paths, sharded=True, dropping=dropping)) as dl:
        dl.attest(log_dir=log_dir)
        dl.seed(1)
        it = iter(dl)
        for _ in range(2):
            next(it)
        states.append(dl.state_dict())
    with DataLoader2(_plain(paths, sharded=True, dropping=dropping)) as dl:
        dl.attest(log_dir=log_dir)
        if faulty:
            dl.seed(1)  # the bug: the state is not loaded, the epoch starts over
            dl._attest.restore(states[0]["binding"])  # but the run's counters carry on
        else:
            dl.load_state_dict(states[0])
        it = iter(dl)
        for _ in range(2):
            next(it)
        states.append(dl.state_dict())
        for _ in it:
            pass
        states.append(dl.state_dict())
    return states


@pytest.mark.parametrize("faulty", [False, True], ids=["honest", "restart-at-zero"])
@pytest.mark.parametrize("dropping", [False, True], ids=["samples", "dropping-map"])
def test_verify_replays_states_and_logs(nine, tmp_path, faulty, dropping):
    index = ShardIndex.load(default_index_url(nine))
    states = _states_and_log(nine, str(tmp_path / "ids"), faulty, dropping)
    by_states = verify(index, world=1, workers=0, batch_size=2, states=states)
    by_logs = verify(index, world=1, workers=0, batch_size=2, log_dir=str(tmp_path / "ids"))
    assert [(r.seed, r.epoch, r.expected) for r in by_logs] == [(1, 0, 31)]
    log = by_logs[0]
    if not faulty:
        assert (log.read, log.duplicated, log.missing) == (31, 0, 0) and log.ok
        assert all(r.ok for r in by_states)
    else:
        assert (log.read, log.duplicated, log.missing) == (35, 4, 0) and not log.ok
        assert by_states[0].duplicated == 4
        assert "a restart read 2 again" in by_states[0].line()


def test_verify_on_the_command_line(nine, tmp_path, capsys):
    states = _states_and_log(nine, str(tmp_path / "ids"), faulty=True)
    files = []
    for i, state in enumerate(states):
        files.append(str(tmp_path / f"state-{i}.json"))
        with open(files[-1], "w") as f:
            json.dump(state, f)
    args = ["verify", default_index_url(nine), *files, "--world", "1", "--batch-size", "2"]
    assert main([*args, "--logs", str(tmp_path / "ids")]) == 1
    out = capsys.readouterr().out
    assert "seed 1 epoch 0: expected 31, read 35, duplicated 4, missing 0" in out


@pytest.mark.distributed
def test_ranks_catch_a_state_dropped_when_the_world_grows(nine):
    """Saved on 1 rank, resumed on 2 where rank 1 got no state (Megatron-Bridge PR 5637's shape)."""
    (saved,) = run_ranks(rank_saves, 1, nine, 2)
    # Rank 1 without a state, then the elastic resume done right: one job of 2 ranks.
    grown, both = zip(
        *run_ranks(rank_resumes_each, 2, nine, [[saved[0], None], [saved[0], saved[0]]]),
        strict=True,
    )
    for rank, (kind, text) in enumerate(grown):
        assert kind == "dropped-state", text
        assert f"rank {rank}: epoch 0, step " in text
        assert "rank(s) 1 start without a loader state while rank(s) 0 resume one" in text
    assert [kind for kind, _ in both] == ["ok", "ok"]


# --- shardpipes verify, per source of a mixture ------------------------------------------------


def _source(paths):
    return (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
    )


def _mixed_run(a, b, log_dir, runs=1):
    dp = _source(a).mix(_source(b), repeat=[1, 2], names=["a", "b"]).batch(4)
    for _ in range(runs):  # a second run of the same epoch: a restart at zero
        with DataLoader2(dp) as dl:
            dl.attest(log_dir=log_dir)
            dl.seed(2)
            for _ in dl:
                pass


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    a = _dataset(tmp_path_factory.mktemp("a"), [7, 6])
    b = _dataset(tmp_path_factory.mktemp("b"), [5, 4])
    return a, b


@pytest.mark.parametrize("runs", [1, 2], ids=["honest", "restart-at-zero"])
def test_verify_reports_each_source_of_a_mixture(two_sources, tmp_path, capsys, runs):
    a, b = two_sources
    _mixed_run(a, b, str(tmp_path / "ids"), runs)
    indexes = [ShardIndex.load(default_index_url(p)) for p in (a, b)]
    (r,) = verify(
        indexes,
        world=1,
        workers=0,
        batch_size=4,
        log_dir=str(tmp_path / "ids"),
        mixture=Mixture(2, repeat=(1, 2)),
        names=["a", "b"],
    )
    assert [(s.name, s.expected) for s in r.sources] == [("a", 13), ("b", 18)]
    assert [(s.read, s.duplicated, s.missing) for s in r.sources] == [
        (13 * runs, 13 * (runs - 1), 0),
        (18 * runs, 18 * (runs - 1), 0),
    ]
    assert (r.expected, r.read, r.ok) == (31, 31 * runs, runs == 1)
    args = ["verify", ",".join(default_index_url(p) for p in (a, b)), "--world", "1"]
    args += ["--batch-size", "4", "--logs", str(tmp_path / "ids"), "--repeat", "1", "2"]
    assert main([*args, "--names", "a,b"]) == (0 if runs == 1 else 1)
    out = capsys.readouterr().out
    assert (
        f"source a: expected 13, read {13 * runs}, duplicated {13 * (runs - 1)}, missing 0" in out
    )
    assert (
        f"source b: expected 18, read {18 * runs}, duplicated {18 * (runs - 1)}, missing 0" in out
    )


def rank_seeded_by_rank(rank, world):
    with DataLoader2(
        IterableWrapper(range(8)).sharding_filter(),
        reading_service=DistributedReadingService(timeout=60),
    ) as dl:
        dl.seed(rank)  # the bug: a seed that differs between ranks
        try:
            return ("ok", list(dl))
        except AttestationError as exc:  # the kind of error every other fault of the check is
            return (exc.fault, isinstance(exc, WorkerError), str(exc))


@pytest.mark.distributed
def test_ranks_seeded_differently_raise_an_attestation_error():
    """Issue 41: one kind of error per fault; still a WorkerError for code that catches that."""
    got = run_ranks(rank_seeded_by_rank, 2)
    for rank, (fault, is_worker_error, text) in enumerate(got):
        assert (fault, is_worker_error) == ("out-of-step", True)
        assert text.startswith(f"rank {rank}: epoch 0: out-of-step: the ranks disagree on the")
        assert "seeds across ranks 0..1" in text
