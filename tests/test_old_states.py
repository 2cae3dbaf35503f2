"""States written by shardpipes at 094ef5b still load, and the same batches follow them."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from _old_states import FIXTURE, GRAPHS, mp, write_data
from shardpipes.dataloader2 import DataLoader2
from shardpipes.dataloader2.state import LoaderState

with open(FIXTURE) as f:
    SAVED = json.load(f)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("old-states")
    with pytest.MonkeyPatch.context() as mp_:
        mp_.chdir(folder)
        write_data()
    return folder


@pytest.mark.parametrize("name", sorted(SAVED))
def test_a_state_of_094ef5b_loads_and_continues(name, data_dir, monkeypatch):
    monkeypatch.chdir(data_dir)
    case = SAVED[name]
    state = case["state"]
    # The typed value reads it and writes it back as it was.
    assert LoaderState.from_dict(state).to_dict() == state
    out = []
    with DataLoader2(GRAPHS[case["graph"]](), reading_service=mp(case["workers"])) as dl:
        dl.load_state_dict(state)
        while len(out) < len(case["after"]):
            got = [list(b) for b in dl]
            if not got:
                break
            out.extend(got)
    after = case["after"]
    if not state["seeded"]:  # the next epoch draws its seed from torch: compare this one's rest
        after = after[: 40 - state["consumed"]]
    out = out[: len(after)]
    if case["exact"]:
        assert out == after
    else:  # another topology: the rest of the epoch, each sample once
        assert Counter(x for b in out for x in b) == Counter(x for b in after for x in b)
