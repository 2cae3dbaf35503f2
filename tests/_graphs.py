"""The graph most loader tests run: synthetic shards -> sample ids, shuffled and batched."""

from __future__ import annotations

from typing import Any

from shardpipes.datapipes.iter import IterableWrapper


def sample_id(sample: dict[str, Any]) -> int:
    """The global id that ``write_synthetic`` stores in each sample's ``.json``."""
    return int(sample[".json"]["id"])


def id_graph(pattern: str, *, batch_size: int = 4, buffer_size: int = 16) -> Any:
    """expand -> shard shuffle -> sharding_filter -> open -> tar -> group -> decode -> id -> shuffle -> batch."""
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_id)
        .shuffle(buffer_size=buffer_size)
        .batch(batch_size)
    )
