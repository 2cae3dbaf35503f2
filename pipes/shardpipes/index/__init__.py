"""The shard index: per-shard sample counts and byte spans, built once, read by the loader.

- :mod:`~shardpipes.index.document`: the index itself (``ShardIndex``, ``ShardInfo``), its file
  format, loading, saving and the sidecar location;
- :mod:`~shardpipes.index.scan`: a tar shard -> its samples' keys and byte spans;
- :mod:`~shardpipes.index.build`: scanning many shards in parallel (``build_index`` in
  memory, ``write_index`` streaming to disk, resumable);
- :mod:`~shardpipes.index.sidecar`, :mod:`~shardpipes.index.table`: the per-shard sample files
  of a version-2 index and the loaded index's columns and cache.

Byte-range reads of what the index describes are storage: :func:`shardpipes.storage.ranges.open_range`,
re-exported here.
"""

from shardpipes.index.build import IndexReport, build_index, index_shard, write_index
from shardpipes.index.document import (
    FORMAT,
    VERSION,
    IndexFormatError,
    ShardIndex,
    ShardInfo,
    default_index_url,
    find_index,
)
from shardpipes.index.scan import SampleSpan, scan_samples
from shardpipes.storage.ranges import RangeFile, open_range

__all__ = [
    "FORMAT",
    "VERSION",
    "IndexFormatError",
    "IndexReport",
    "RangeFile",
    "SampleSpan",
    "ShardIndex",
    "ShardInfo",
    "build_index",
    "default_index_url",
    "find_index",
    "index_shard",
    "open_range",
    "scan_samples",
    "write_index",
]
