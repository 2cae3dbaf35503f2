"""LightningLoader: the state Lightning checkpoints is that of the batches its steps used.

Lightning's fit loop fetches one batch ahead of the step it runs; these tests drive the wrapper
the same way with a plain loop (the Trainer runs are in docs/mixing.md and tests/test_examples.py).
"""

from __future__ import annotations

import pytest

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.lightning import LightningLoader


def _loader() -> DataLoader2:
    dl = DataLoader2(IterableWrapper(range(40)).shuffle(buffer_size=8).batch(4))
    dl.seed(7)
    return dl


def _one_ahead(wrapper: LightningLoader, steps: int) -> list:
    """Run ``steps`` steps as Lightning does: batch k+1 is fetched before step k runs."""
    it = iter(wrapper)
    taken, nxt = [], next(it)
    for _ in range(steps):
        batch, nxt = nxt, next(it, None)
        wrapper.step()  # on_before_batch_transfer: a step takes ``batch``
        taken.append(batch)
    return taken


def test_a_checkpoint_resumes_at_the_batch_after_the_last_step():
    whole = [list(b) for b in _loader()]
    first = LightningLoader(_loader())
    head = _one_ahead(first, 4)
    state = first.state_dict()  # the loader itself has handed out 5 batches
    assert first.loader.state_dict()["consumed"] != state["consumed"]
    resumed = LightningLoader(_loader())
    resumed.load_state_dict(state)
    tail = [list(b) for b in resumed]
    assert [list(b) for b in head] + tail == whole  # nothing skipped, nothing twice


def test_the_state_at_an_epochs_end_is_the_next_epochs_start():
    wrapper = LightningLoader(_loader())
    for _ in wrapper:
        wrapper.step()
    end = wrapper.state_dict()
    again = LightningLoader(_loader())
    again.load_state_dict(end)
    plain = _loader()
    list(plain)
    assert [list(b) for b in again] == [list(b) for b in plain]  # epoch 1, the same batches


def test_a_checkpoint_before_any_step_resumes_at_the_start():
    whole = [list(b) for b in _loader()]
    wrapper = LightningLoader(_loader())
    next(iter(wrapper))  # Lightning fetched the first batch; no step took it yet
    resumed = LightningLoader(_loader())
    resumed.load_state_dict(wrapper.state_dict())
    assert [list(b) for b in resumed] == whole


def test_batches_handed_out_and_none_marked_used_is_refused():
    wrapper = LightningLoader(_loader())
    it = iter(wrapper)
    next(it), next(it)
    with pytest.raises(RuntimeError, match="step\\(\\) marked none used"):
        wrapper.state_dict()


def test_a_step_without_a_batch_is_refused():
    with pytest.raises(RuntimeError, match="no batch handed out"):
        LightningLoader(_loader()).step()
