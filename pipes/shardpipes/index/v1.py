"""Version 1 of the index file: every sample's key, offset and size inline, checked on load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardpipes.index.shard import ShardInfo, check_layout, fail
from shardpipes.storage.urls import absolute, parent, resolve

__all__ = ["validate_v1"]


def _int(doc: Mapping[str, Any], name: str, url: str, where: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise fail(url, f"{where}{name}", f"should be an int >= 0, got {value!r}")
    return value


def _int_array(doc: Mapping[str, Any], name: str, n: int, url: str, where: str) -> np.ndarray:
    value = doc.get(name)
    fld = f"{where}{name}"
    if not isinstance(value, list) or len(value) != n:
        got = f"a list of {len(value)}" if isinstance(value, list) else repr(type(value).__name__)
        raise fail(url, fld, f"should be a list of {n} ints (num_samples), got {got}")
    for j, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
            raise fail(url, f"{fld}[{j}]", f"should be an int >= 0, got {v!r}")
    return np.asarray(value, dtype=np.int64)


def validate_v1(doc: Mapping[str, Any], url: str) -> list[ShardInfo]:
    """The shards of a version-1 document ``doc`` (every sample inline), checked field by field."""
    shards_doc = doc.get("shards")
    if not isinstance(shards_doc, list):
        raise fail(url, "shards", f"should be a list, got {type(shards_doc).__name__}")
    base_dir = parent(absolute(url))
    shards: list[ShardInfo] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(shards_doc):
        where = f"shards[{i}]."
        if not isinstance(s, dict):
            raise fail(url, f"shards[{i}]", f"should be an object, got {type(s).__name__}")
        rel = s.get("url")
        if not isinstance(rel, str) or not rel:
            raise fail(url, f"{where}url", f"should be a non-empty string, got {rel!r}")
        shard_url = resolve(rel, base_dir)
        if shard_url in seen:
            raise fail(url, f"{where}url", f"{rel!r} repeats shards[{seen[shard_url]}]")
        seen[shard_url] = i
        n = _int(s, "num_samples", url, where)
        total = _int(s, "total_bytes", url, where)
        keys = s.get("keys")
        if not isinstance(keys, list) or len(keys) != n:
            got = f"a list of {len(keys)}" if isinstance(keys, list) else repr(type(keys).__name__)
            raise fail(
                url, f"{where}keys", f"should be a list of {n} strings (num_samples), got {got}"
            )
        for j, k in enumerate(keys):
            if not isinstance(k, str) or not k:
                raise fail(url, f"{where}keys[{j}]", f"should be a non-empty string, got {k!r}")
        if len(set(keys)) != n:
            first: dict[str, int] = {}
            j = next(j for j, k in enumerate(keys) if first.setdefault(k, j) != j)
            raise fail(url, f"{where}keys[{j}]", f"{keys[j]!r} repeats an earlier key of the shard")
        offsets = _int_array(s, "offsets", n, url, where)
        sizes = _int_array(s, "sizes", n, url, where)
        check_layout(offsets, sizes, total, url, where)
        shards.append(ShardInfo(shard_url, total, keys, offsets.tolist(), sizes.tolist()))
    for name, want in (
        ("num_shards", len(shards)),
        ("num_samples", sum(x.num_samples for x in shards)),
    ):
        if name in doc and doc[name] != want:
            raise fail(url, name, f"is {doc[name]!r} but the shards hold {want}")
    return shards
