"""Carry each sample's id from the reader to its batch, beside the sample (``datapipes/iter/_ids.py``).

:func:`carry_ids` rewrites the loader's own copy of a graph, after the lean stand-ins are in:
it finds the reader (the stage whose ``range_to_samples`` step yields samples: ``webdataset()``)
on the graph's one path from the output, and the first ``batch()`` above it. Every stage between
them must be one the rewrite knows how to carry ids through:

- stages that move items without looking at them (trait ``carries_ids = "untouched"``: the
  sample ``shuffle``, ``prefetch``): the pairs of sample and id go through them as they are;
- one-to-one stages that yield each output before reading the next item (trait
  ``carries_ids = "in_step"``: ``map`` on whole items, ``decode``, a user's stage that declares
  it): fed the samples, their outputs paired again with the id of the sample they read last.

Any other stage there (``filter``, ``flatmap``, ``map`` with columns, an undeclared stage) may
drop, add or reorder items in a way the rewrite cannot follow, so it leaves the graph as it is
and says why (:data:`NOT_CARRIED`): the loader then checks what it checked before, the
samples' ``__url__`` and ``__key__`` where they keep them, else positions only. Never a wrong
id: a batch whose length is not the count of ids taken gets none.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._description import DescribedStage, describe
from shardpipes.datapipes.iter._ids import (
    IdStampIterDataPipe,
    RetagIterDataPipe,
    Tape,
    UntagIterDataPipe,
)

__all__ = ["NOT_CARRIED", "carry_ids"]

#: The start of the note :func:`carry_ids` returns when it cannot carry the ids.
NOT_CARRIED = "sample ids are not carried to the batches"


def _set_source(dp: Any, new: Any) -> None:
    attr = "source_datapipe" if "source_datapipe" in vars(dp) else "datapipe"
    setattr(dp, attr, new)


def _carries(node: DescribedStage) -> bool:
    return node.traits.one_to_one and node.traits.carries_ids is not None


def carry_ids(datapipe: IterDataPipe[Any]) -> tuple[IterDataPipe[Any], str | None]:
    """Return ``(root, note)``: the graph rewritten to set ``batch.ids``, or as it was and why not.

    Only for a graph the caller owns (the loader's deep copy): stages are rewired, not copied.
    ``note`` is ``None`` when the ids are carried, or when the graph has no reader on its one
    path or no ``batch()`` above it (its items are then samples, checked by their keys).
    """
    path = describe(datapipe).reader_path()
    if not path:
        return datapipe, None
    reader = path[-1].stage
    nodes = list(reversed(path[:-1]))  # from the stage above the reader up to the output
    batch = next((i for i, n in enumerate(nodes) if n.traits.batches), None)
    if batch is None:
        return datapipe, None
    for node in nodes[:batch]:
        if not _carries(node):
            return datapipe, (
                f"{NOT_CARRIED}: {node.name} between webdataset() and batch() may drop, add or "
                "reorder samples in a way the loader cannot follow (it declares no carries_ids "
                "trait); batches are checked by their samples' __url__ and __key__ where they "
                "keep them, else by position only"
            )
    above = [n.stage for n in nodes]
    stamp = IdStampIterDataPipe(reader)
    below: Any = stamp
    root: Any = datapipe
    for i, dp in enumerate(above[: batch + 1]):
        if i < batch and nodes[i].traits.carries_ids == "untouched":
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
