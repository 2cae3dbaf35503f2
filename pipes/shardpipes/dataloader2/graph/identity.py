"""Carry each sample's id from the reader to its batch, beside the sample (``datapipes/iter/_ids.py``).

:func:`carry_ids` rewrites the loader's own copy of a graph, after the lean stand-ins are in:
it finds the reader (the stage whose ``range_to_samples`` step yields samples: ``webdataset()``)
on the graph's one path from the output, and the first ``batch()`` above it. Every stage between
them must be one the rewrite knows how to carry ids through:

- stages that move items without looking at them (the sample ``shuffle``, ``prefetch``): the
  pairs of sample and id go through them as they are;
- one-to-one stages that yield each output before reading the next item (``map`` on whole
  items, ``decode``): fed the samples, their outputs paired again with the id of the sample
  they read last.

Any other stage there (``filter``, ``flatmap``, ``map`` with columns, a stage of the user's) may
drop, add or reorder items in a way the rewrite cannot follow, so it leaves the graph as it is
and says why (:data:`NOT_CARRIED`): the loader then checks what it checked before, the
samples' ``__url__`` and ``__key__`` where they keep them, else positions only. Never a wrong
id: a batch whose length is not the count of ids taken gets none.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher

from shardpipes.datapipes.iter._ids import (
    IdStampIterDataPipe,
    RetagIterDataPipe,
    Tape,
    UntagIterDataPipe,
)
from shardpipes.datapipes.iter._index_length import source_of
from shardpipes.datapipes.iter._lean import (
    LeanBatcherIterDataPipe,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
)
from shardpipes.datapipes.iter.base import is_one_to_one, range_step
from shardpipes.datapipes.iter.decode import DecoderIterDataPipe
from shardpipes.datapipes.iter.prefetch import PrefetcherIterDataPipe

__all__ = ["NOT_CARRIED", "carry_ids"]

#: The start of the note :func:`carry_ids` returns when it cannot carry the ids.
NOT_CARRIED = "sample ids are not carried to the batches"

# Stages that move items without looking at them, and one-to-one stages that yield each output
# before they read the next item (so the id of the item read last is the output's).
_MOVES = (LeanShufflerIterDataPipe, PrefetcherIterDataPipe)
_SYNCHRONOUS = (LeanMapperIterDataPipe, DecoderIterDataPipe)


def _set_source(dp: Any, new: Any) -> None:
    attr = "source_datapipe" if "source_datapipe" in vars(dp) else "datapipe"
    setattr(dp, attr, new)


def _path(datapipe: IterDataPipe[Any]) -> list[Any]:
    """The stages from the output down to the reader (the reader last), or ``[]`` if none."""
    path: list[Any] = []
    node: Any = datapipe
    while node is not None:
        path.append(node)
        step = range_step(node)
        if step is not None and step[1] == "samples":
            return path
        node = source_of(node)
    return []


def carry_ids(datapipe: IterDataPipe[Any]) -> tuple[IterDataPipe[Any], str | None]:
    """Return ``(root, note)``: the graph rewritten to set ``batch.ids``, or as it was and why not.

    Only for a graph the caller owns (the loader's deep copy): stages are rewired, not copied.
    ``note`` is ``None`` when the ids are carried, or when the graph has no reader on its one
    path or no ``batch()`` above it (its items are then samples, checked by their keys).
    """
    path = _path(datapipe)
    if not path:
        return datapipe, None
    reader = path[-1]
    above = list(reversed(path[:-1]))  # from the stage above the reader up to the output
    batch = next(
        (i for i, dp in enumerate(above) if isinstance(dp, Batcher | LeanBatcherIterDataPipe)),
        None,
    )
    if batch is None:
        return datapipe, None
    for dp in above[:batch]:
        if not isinstance(dp, _MOVES + _SYNCHRONOUS) or not is_one_to_one(dp):
            name = type(dp).__name__
            return datapipe, (
                f"{NOT_CARRIED}: {name} between webdataset() and batch() may drop, add or "
                "reorder samples in a way the loader cannot follow; batches are checked by their "
                "samples' __url__ and __key__ where they keep them, else by position only"
            )
    stamp = IdStampIterDataPipe(reader)
    below: Any = stamp
    root: Any = datapipe
    for i, dp in enumerate(above[: batch + 1]):
        if isinstance(dp, _MOVES):
            _set_source(dp, below)
            below = dp
            continue
        tape = Tape()
        _set_source(dp, UntagIterDataPipe(below, tape))
        below = RetagIterDataPipe(dp, tape, batched=i == batch)
        if i + 1 < len(above):
            _set_source(above[i + 1], below)
        else:
            root = below
    return root, None
