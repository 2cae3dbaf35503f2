"""What a loader state is bound to: the data an index describes, the plan's parameters, the run.

``DataLoader2.state_dict()`` records, under ``"binding"``:

- ``data``: a summary and two hashes of the index entries of the shards the graph reads (URL,
  sample count, size in bytes, ETag where the index has one): ``names`` over the URLs alone,
  ``content`` over everything. Only for graphs with ``sharding_by_index``: without an index the
  loader does not know the samples of a shard before reading it.
- ``plan``: the parameters that decide the order and the split, one readable line per stage
  (``"ShufflerIterDataPipe(buffer_size=16)"``) and per reading service (policy, sync interval).
  The seed and the epoch are the state's own ``seed`` and ``epoch``.
- ``run``, ``rank``: the run the state belongs to (a random id made on the run's first epoch,
  the same on every rank) and the rank that saved it.
- ``steps``, ``before``, ``last``: items this rank yielded in the run, in epochs before the
  current one, and ``[seed, epoch, items]`` of the last completed epoch. ``steps == before +
  consumed`` holds in every state the loader writes; a state where it does not was edited or
  mixed (a position reset to zero, an epoch skipped).

:func:`changes` compares a saved binding with this loader's and says what differs.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import describe, stages_of
from shardpipes.index.document import ShardIndex, find_index
from shardpipes.plan.identity import MASK, digest

__all__ = [
    "KEY",
    "ON_CHANGE",
    "OnChange",
    "changes",
    "data_digest",
    "describe_data",
    "describe_plan",
    "position_faults",
]

KEY = "binding"
#: What ``load_state_dict(state, on_change=...)`` may do when the data or the plan changed.
ON_CHANGE = ("raise", "restart_epoch", "next_epoch")
OnChange = Literal["raise", "restart_epoch", "next_epoch"]
# Attributes that decide which samples come in which order; the topology (ranks, workers) is
# not among them: it may change under an elastic resume.
_PARAMS = ("buffer_size", "batch_size", "drop_last", "policy", "sync_every", "equalize")
# (Shorthands in the state: b=buffer_size or batch_size, d, p, s=sync_every, e.)


def _hash(lines: Iterable[str]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def _sharder(datapipe: IterDataPipe[Any]) -> Any:
    """The graph's one ``sharding_by_index`` (a sharding point that seeks its reads), or ``None``."""
    found = describe(datapipe).index_sharders()
    return found[0] if len(found) == 1 else None


def _shards(datapipe: IterDataPipe[Any]) -> tuple[list[str], ShardIndex] | None:
    """The sorted shard URLs the graph's ``sharding_by_index`` reads, and its index."""
    sharder = _sharder(datapipe)
    if sharder is None:
        return None
    urls = sorted({str(u) for u in copy.deepcopy(sharder.source_datapipe)})
    if isinstance(sharder.index, ShardIndex):
        return urls, sharder.index
    where = sharder.index or (
        find_index(urls, storage_options=sharder.storage_options) if urls else None
    )
    if where is None:
        return None  # the stage itself will say how to build one
    return urls, ShardIndex.load(where, storage_options=sharder.storage_options)


def data_digest(datapipe: IterDataPipe[Any], part: int, parts: int) -> tuple[int, int]:
    """``(digest, samples)`` of the shards ``part``, ``part + parts``, ... the graph reads.

    Reads those shards' keys from the index (its per-shard sample files): the ranks share the
    work, and the sums of their parts are the digest of the whole dataset.
    """
    found = _shards(datapipe)
    if found is None:
        return 0, 0
    urls, index = found
    positions = index.positions(urls).tolist()
    total, count = 0, 0
    for url, p in list(zip(urls, positions, strict=True))[part::parts]:
        keys = index.shards[p].keys
        total = (total + digest((url, k) for k in keys)) & MASK
        count += len(keys)
    return total, count


def describe_data(datapipe: IterDataPipe[Any]) -> dict[str, Any] | None:
    """The summary and hashes of the index entries the graph reads; ``None`` without an index.

    Reads the shard list (a copy of the stages before ``sharding_by_index``) and the index
    once; the loader keeps the result.
    """
    found = _shards(datapipe)
    if found is None:
        return None
    urls, index = found
    if not urls:
        return {"shards": 0, "samples": 0, "bytes": 0, "names": _hash(()), "content": _hash(())}
    entries = [index.shards[p] for p in index.positions(urls).tolist()]
    lines = [
        f"{url}\t{e.num_samples}\t{e.total_bytes}\t{e.etag or ''}"
        for url, e in zip(urls, entries, strict=True)
    ]
    return {
        "shards": len(urls),
        "samples": sum(e.num_samples for e in entries),
        "bytes": sum(e.total_bytes for e in entries),
        "names": _hash(urls),
        "content": _hash(lines),
    }


def _line(obj: Any) -> str | None:
    params = []
    for name in _PARAMS:
        value = getattr(obj, name, None)
        if isinstance(value, bool | int | str):
            params.append(f"{name[0]}={value!r}" if name != "sync_every" else f"s={value!r}")
    if not params:
        return None
    return f"{type(obj).__name__.removesuffix('IterDataPipe')}({','.join(params)})"


def describe_plan(datapipe: IterDataPipe[Any], services: Sequence[Any]) -> list[str]:
    """One short line per stage and reading service with a parameter that decides the order.

    ``b``: buffer or batch size, ``d``: drop_last, ``p``: policy, ``s``: sync interval,
    ``e``: equalize. Stages without such parameters (``map``, ``decode``) are left out.
    """
    found = (_line(x) for x in [*stages_of(datapipe), *services])
    return [line for line in found if line is not None]


def _data_changes(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    if saved is None and now is None:
        return []
    if saved is None or now is None:
        had = "a graph with an index" if saved is not None else "a graph without an index"
        return [f"the state was taken by {had}; this loader's graph is not like it"]
    if saved["content"] == now["content"]:
        return []

    def size(d: dict[str, Any]) -> str:
        return f"{d['shards']} shards ({d['samples']} samples, {d['bytes']} bytes)"

    if saved["names"] != now["names"]:
        if now["shards"] > saved["shards"]:
            what = "shards added"
        elif now["shards"] < saved["shards"]:
            what = "shards removed"
        else:
            what = "shards replaced (other names)"
        return [f"{what}: the state was taken over {size(saved)}, this loader reads {size(now)}"]
    detail = (
        "the same sample counts and sizes, other ETags"
        if (saved["samples"], saved["bytes"]) == (now["samples"], now["bytes"])
        else f"{saved['samples']} -> {now['samples']} samples, {saved['bytes']} -> {now['bytes']} bytes"
    )
    return [f"shards resized or rewritten: the same {now['shards']} shard names, but {detail} "]


def _kind(line: str) -> str:
    return line.split("(", 1)[0]


def _plan_changes(saved: Sequence[str], now: Sequence[str]) -> list[str]:
    # A reading service that only one side has is topology, which an elastic resume may change
    # (a run on one process has no DistributedReadingService); one both have is compared.
    services = {_kind(x) for x in saved if "ReadingService(" in x}
    services ^= {_kind(x) for x in now if "ReadingService(" in x}
    saved = [x for x in saved if _kind(x) not in services]
    now = [x for x in now if _kind(x) not in services]
    if list(saved) == list(now):
        return []
    if len(saved) == len(now):
        return [f"the plan changed: {a} -> {b}" for a, b in zip(saved, now, strict=True) if a != b]
    return [
        f"the plan changed: the state's graph was [{', '.join(saved)}], this one is [{', '.join(now)}]"
    ]


def changes(saved: dict[str, Any], data: dict[str, Any] | None, plan: Sequence[str]) -> list[str]:
    """What differs between a saved binding and this loader's data and plan."""
    return _data_changes(saved.get("data"), data) + _plan_changes(saved.get("plan", plan), plan)


def position_faults(state: dict[str, Any]) -> list[str]:
    """Contradictions inside a state's position: a reset to zero, a skipped epoch."""
    binding = state.get(KEY) or {}
    if "steps" not in binding:
        return []
    faults = []
    consumed, epoch, seed = int(state["consumed"]), int(state["epoch"]), state["seed"]
    here = int(binding["steps"]) - int(binding["before"])
    if not state.get("segments") and here != consumed:
        faults.append(
            f"the state's position is batch {consumed} of epoch {epoch}, but this run had yielded "
            f"{here} items of that epoch when it was saved (a position "
            f"{'reset to zero' if consumed == 0 else 'edited'}: a restart would "
            f"{'repeat' if consumed < here else 'skip'} {abs(here - consumed)} items)"
        )
    last = binding.get("last")
    if seed is not None and last and last[0] == seed and epoch > last[1] + 1:
        faults.append(
            f"the state is in epoch {epoch} of seed {seed}, but the last epoch this run completed "
            f"was epoch {last[1]}: a skipped stretch (epochs lost at an epoch boundary)"
        )
    return faults
