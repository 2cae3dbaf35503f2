"""Exact resume from DataLoader2.state_dict() (no shard index: deterministic replay)."""

from __future__ import annotations

import pickle

import pytest

from _dist import run_ranks
from _graphs import id_graph, resumed, uninterrupted
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_resume_continues_batch_for_batch(shard_pattern, workers):
    make_rs = lambda: MultiProcessingReadingService(num_workers=workers)  # noqa: E731
    batches, states = uninterrupted(id_graph(shard_pattern), make_rs())
    per_epoch = len(batches) // 2
    # start, middle, last batch of epoch 0, epoch boundary, middle of epoch 1
    for k in (0, per_epoch // 2, per_epoch - 1, per_epoch, per_epoch + per_epoch // 3):
        rest = batches[k:]
        got = resumed(id_graph(shard_pattern), make_rs(), states[k], len(rest))
        assert got == rest, f"resume after {k} batches diverged"


def test_state_is_small_and_strict(shard_pattern):
    _, states = uninterrupted(
        id_graph(shard_pattern), MultiProcessingReadingService(num_workers=0), epochs=1
    )
    assert len(pickle.dumps(states[5])) < 900  # the position, and its binding (docs/attestation.md)
    dl = DataLoader2(id_graph(shard_pattern))
    bad = dict(states[5])
    del bad["consumed"]
    with pytest.raises(KeyError, match="consumed"):
        dl.load_state_dict(bad)
    with pytest.raises(
        ValueError, match=r"saved with 1 rank\(s\) x 0 worker\(s\), this loader runs 1 x 2"
    ):
        DataLoader2(
            id_graph(shard_pattern), reading_service=MultiProcessingReadingService(num_workers=2)
        ).load_state_dict(states[5])
    with pytest.raises(ValueError, match="version"):
        dl.load_state_dict({**states[5], "version": 99})


def test_fixed_length_resume_after_first_epoch_is_refused():
    dp = IterableWrapper(range(10)).fixed_length(4)
    with DataLoader2(dp) as dl:
        list(dl)
        state = dl.state_dict()
    with pytest.raises(ValueError, match="fixed_length"):
        DataLoader2(dp).load_state_dict(state)


def rank_resume(rank, world, pattern, k):
    def rs():
        return SequentialReadingService(
            DistributedReadingService(timeout=60),
            MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork"),
        )

    batches, states = uninterrupted(id_graph(pattern), rs(), epochs=1)
    return batches[k:], resumed(id_graph(pattern), rs(), states[k], len(batches) - k)


@pytest.mark.distributed
def test_distributed_resume_mid_epoch(tmp_path):
    write_synthetic(tmp_path, shards=5, samples=[7, 11, 13, 17, 19], payload_bytes=16)
    pattern = f"{tmp_path}/train-{{000000..000004}}.tar"
    for expected, got in run_ranks(rank_resume, 2, pattern, 3):
        assert expected and got == expected


def test_state_right_after_restore_keeps_the_position(shard_pattern):
    _, states = uninterrupted(
        id_graph(shard_pattern), MultiProcessingReadingService(num_workers=0), epochs=1
    )
    dl = DataLoader2(id_graph(shard_pattern))
    dl.load_state_dict(states[4])
    assert dl.state_dict() == states[4]  # saved again before the next batch: still batch 4
