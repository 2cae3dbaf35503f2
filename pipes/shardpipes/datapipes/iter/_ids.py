"""Sample ids beside the samples: the stages the loader puts in a graph to carry them to the batches.

A user ``map`` usually replaces the sample dict (``.map(lambda s: (s["jpg"], s["cls"]))``), and
with it ``__url__`` and ``__key__``, the sample's identity. So the identity travels beside the
sample, not inside it. With ``dl.attest(...)`` the loader rewrites its own copy of the graph
(``shardpipes.dataloader2.graph.identity``):

- :class:`IdStampIterDataPipe` right after the reader (``webdataset()``) pairs each sample with
  its 64-bit id, computed from the shard URL and the key the reader actually read
  (:func:`shardpipes.plan.identity.sample_id`): a wrong range or a skipped stretch gives other
  ids, whatever the stages after it do to the sample;
- stages that only move items (the sample shuffle, ``prefetch``) move the pairs;
- a stage that looks at items (``map``, ``decode``) is fed the samples by an
  :class:`UntagIterDataPipe` and its outputs are paired again by a :class:`RetagIterDataPipe`
  with the id of the sample it read last: such a stage yields each output before it reads the
  next sample, so that id is the output's (a sample a handler skipped is passed over);
- the ``batch()`` is fed the same way, and its batch gets the ids of the samples it took as
  ``batch.ids`` (a :class:`~shardpipes.plan.identity.SampleIds`); the loader reads them there.

Nothing else in the graph sees a pair: the rewrite only wraps the stages it knows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.plan.identity import SampleIds, sample_id

__all__ = ["IdStampIterDataPipe", "RetagIterDataPipe", "Tagged", "Tape", "UntagIterDataPipe"]


class Tagged:
    """A sample (or what a stage made of it) and the id of the sample it came from (``None``: unknown)."""

    __slots__ = ("id", "item")

    def __init__(self, item: Any, id: int | None) -> None:
        self.item = item
        self.id = id


class Tape:
    """The ids an :class:`UntagIterDataPipe` handed on since its :class:`RetagIterDataPipe` last took them."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: list[int | None] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"ids": []}  # a running iteration's ids stay with it (not empty: pickle skips {})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.ids = []


class IdStampIterDataPipe(StageIterDataPipe[Tagged]):
    """Pair each sample of the reader with its id (from ``__url__`` and ``__key__``)."""

    one_to_one = True

    def __init__(self, source_datapipe: IterDataPipe[Any]) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Tagged]:
        for sample in self.source_datapipe:
            try:
                found: int | None = sample_id(sample["__url__"], sample["__key__"])
            except (KeyError, TypeError, AttributeError):
                found = None  # a sample of a foreign source (no URL): its batch gets no ids
            yield Tagged(sample, found)

    def __len__(self) -> int:
        return len(self.source_datapipe)


class UntagIterDataPipe(StageIterDataPipe[Any]):
    """Hand the items of pairs to the stage above, their ids to the tape."""

    one_to_one = True

    def __init__(self, source_datapipe: IterDataPipe[Tagged], tape: Tape) -> None:
        self.source_datapipe = source_datapipe
        self.tape = tape

    def __iter__(self) -> Iterator[Any]:
        tape = self.tape
        ids: list[int | None] = []
        tape.ids = ids
        append = ids.append
        for pair in self.source_datapipe:
            append(pair.id)
            yield pair.item

    def __len__(self) -> int:
        return len(self.source_datapipe)


class RetagIterDataPipe(StageIterDataPipe[Any]):
    """Pair each output of the stage below with its sample's id; or, above a ``batch()``, set ``batch.ids``.

    ``batched=False``: the stage below (``map``, ``decode``) yields each output before it reads
    another sample, so the output's id is the last one on the tape. ``batched=True``: a batch
    holds the samples taken since the last batch, all the ids on the tape, in order. A batch
    that cannot hold an attribute (a plain ``list``) or has a sample without an id gets none.
    """

    one_to_one = True

    def __init__(self, source_datapipe: IterDataPipe[Any], tape: Tape, *, batched: bool) -> None:
        self.source_datapipe = source_datapipe
        self.tape = tape
        self.batched = batched

    def __iter__(self) -> Iterator[Any]:
        tape = self.tape
        if not self.batched:
            for out in self.source_datapipe:
                ids = tape.ids
                yield Tagged(out, ids[-1] if ids else None)
                ids.clear()
            return
        for batch in self.source_datapipe:
            ids = tape.ids
            if len(ids) == len(batch) and None not in ids:
                try:
                    batch.ids = SampleIds(cast(list[int], ids))
                except AttributeError:
                    pass  # a batch type without attributes: the loader checks it as before
            ids.clear()
            yield batch

    def __len__(self) -> int:
        return len(self.source_datapipe)
