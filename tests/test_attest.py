"""Checkpoints bound to the data and the plan; sample identities; the cross-rank check (issue 28)."""

from __future__ import annotations

import json
import os

import pytest

from _graphs import indexed_graph
from shardpipes.dataloader2 import DataLoader2
from shardpipes.errors import StateMismatchError
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic


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
