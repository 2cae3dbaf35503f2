"""The graphs most loader tests run (synthetic shards -> sample ids, shuffled and batched), and
helpers that run a loader uninterrupted or resumed from a state."""

from __future__ import annotations

import pickle
from typing import Any

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper


def sample_id(sample: dict[str, Any]) -> int:
    """The global id that ``write_synthetic`` stores in each sample's ``.json``."""
    return int(sample[".json"]["id"])


def id_graph(
    pattern: str | list[str],
    *,
    batch_size: int = 4,
    buffer_size: int = 16,
    index: bool = False,
) -> Any:
    """expand -> shard shuffle -> sharding_filter -> open -> tar -> group -> decode -> id -> shuffle -> batch.

    ``pattern`` is a brace pattern or a list of shard paths; ``index=True`` puts
    ``sharding_by_index`` (the sidecar index must exist) in place of ``sharding_filter``.
    """
    urls = (
        IterableWrapper([pattern]).shard_expand()
        if isinstance(pattern, str)
        else IterableWrapper(pattern)
    )
    shuffled = urls.shuffle()
    sharded = shuffled.sharding_by_index() if index else shuffled.sharding_filter()
    return (
        sharded.open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .shuffle(buffer_size=buffer_size)
        .batch(batch_size)
    )


def indexed_graph(pattern: str | list[str], **kwargs: Any) -> Any:
    """``id_graph`` with ``sharding_by_index``."""
    return id_graph(pattern, index=True, **kwargs)


def uninterrupted(dp: Any, rs: Any, epochs: int = 2, seed: int = 3) -> tuple[list[Any], list[Any]]:
    """All batches of ``epochs`` epochs, with the state taken after each batch and each epoch."""
    batches, states = [], []
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.seed(seed)
        states.append(dl.state_dict())
        for _ in range(epochs):
            for b in dl:
                batches.append(list(b))
                states.append(dl.state_dict())
            states[-1] = dl.state_dict()  # after the epoch ends: the next epoch's start
    return batches, states


def resumed(dp: Any, rs: Any, state: dict[str, Any], n: int) -> list[Any]:
    """The first ``n`` batches of a new loader restored from ``state`` (crossing epochs)."""
    out: list[Any] = []
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.load_state_dict(pickle.loads(pickle.dumps(state)))
        while len(out) < n:
            got = [list(b) for b in dl]
            if not got:
                break
            out.extend(got)
    return out[:n]
