"""torchdata 0.9's ``datapipes.iter.transform.bucketbatcher`` module path, for code that imports or patches it."""

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shardpipes.datapipes.iter import (
    BucketBatcher as BucketBatcherIterDataPipe,
)
from shardpipes.datapipes.iter import (
    InBatchShuffler as InBatchShufflerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    MaxTokenBucketizer as MaxTokenBucketizerIterDataPipe,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(order=True, frozen=True)
class PrioritizedItem(Generic[T_co]):
    """An item ordered by its ``length`` only (0.9's heap entry in ``max_token_bucketize``)."""

    length: int
    data: T_co = field(compare=False)


__all__ = [
    "BucketBatcherIterDataPipe",
    "InBatchShufflerIterDataPipe",
    "MaxTokenBucketizerIterDataPipe",
    "PrioritizedItem",
    "T",
    "T_co",
]
