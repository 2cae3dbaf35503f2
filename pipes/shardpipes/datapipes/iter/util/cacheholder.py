"""torchdata 0.9's ``datapipes.iter.util.cacheholder`` module path, for code that imports or patches it.

``on_disk_cache`` (0.9's form) checks a cached file's hash with ``_hash_check`` of this module,
looked up at each check: replacing it (torchtext's tests patch it to accept any file) changes
what counts as cached, as it did in 0.9.
"""

from enum import IntEnum
from typing import TypeVar

from shardpipes.datapipes.iter import EndOnDiskCacheHolder as EndOnDiskCacheHolderIterDataPipe
from shardpipes.datapipes.iter import InMemoryCacheHolder as InMemoryCacheHolderIterDataPipe
from shardpipes.datapipes.iter import OnDiskCacheHolder as OnDiskCacheHolderIterDataPipe
from shardpipes.datapipes.td09.cache import _hash_check

T_co = TypeVar("T_co", covariant=True)

PROMISE_FILE_DELETE_TIMEOUT = 30  # 0.9's values: seconds, and seconds between retries
PROMISE_FILE_DELETE_RETRY_INTERVAL = 0.005


class CacheState(IntEnum):
    """What a check of an item's cached file found (0.9's values)."""

    UNCACHED = 0
    CACHED_SINGLE_ENTITY = 1
    CACHED_MULTIPLE_ENTITIES = 2


__all__ = [
    "PROMISE_FILE_DELETE_RETRY_INTERVAL",
    "PROMISE_FILE_DELETE_TIMEOUT",
    "CacheState",
    "EndOnDiskCacheHolderIterDataPipe",
    "InMemoryCacheHolderIterDataPipe",
    "OnDiskCacheHolderIterDataPipe",
    "T_co",
    "_hash_check",
]
