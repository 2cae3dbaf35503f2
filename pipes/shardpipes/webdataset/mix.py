"""webdataset 1.x's ``RandomMix`` and ``RoundRobin``, on the shardpipes mixture.

``RandomMix(datasets, probs=None, longest=False)`` and ``RoundRobin(datasets, longest=False)``
take webdataset's arguments. When every dataset is an indexed ``WebDataset`` (a shardpipes
index next to its shards, or ``index=``) they are ``mix()`` stages: the plan decides which
dataset fills each position, so the same seed gives the same samples, every reader (rank x
worker) gets the same number, and a loader state resumes by seeking, also on another
topology. ``longest=False`` ends the epoch where webdataset's would (the first dataset to run
out, at the rates ``probs`` give); ``longest=True`` reads every dataset once, the finished
ones' share going to the others.

Other datasets (no index, plain iterables) are mixed as webdataset mixes them, with the
loader's seed instead of the global ``random``: the same order for the same seed, exact resume
on the same topology (replay); another topology is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._mix_draws import DrawnMixerIterDataPipe
from shardpipes.datapipes.iter.mix import MixerIterDataPipe, mixable
from shardpipes.webdataset._graph import source_of
from shardpipes.webdataset.pipeline import DataPipeline

__all__ = ["RandomMix", "RoundRobin"]

_REFUSAL = (
    "{kind} over datasets without a shardpipes index draws per reader, so another number of "
    "readers cannot continue it; index the shards (`shardpipes index`) to resume elastically"
)


def _graph_of(dataset: Any) -> IterDataPipe[Any] | None:
    """The DataPipe of an indexed dataset that ``mix()`` can plan, else ``None``."""
    if isinstance(dataset, DataPipeline):
        if dataset.repetitions != 1 or dataset.nsamples != -1 or dataset.source_datapipe is None:
            return None
        dataset = dataset.source_datapipe
    return dataset if isinstance(dataset, IterDataPipe) and mixable(dataset) else None


def _mix(
    datasets: Sequence[Any], probs: Sequence[float] | None, longest: bool, even: bool
) -> IterDataPipe[Any]:
    if not datasets:
        raise ValueError("no datasets to mix")
    graphs = [_graph_of(d) for d in datasets]
    weights = list(probs) if probs is not None else [1.0] * len(datasets)
    if len(weights) != len(datasets):
        raise ValueError(f"{len(weights)} probs for {len(datasets)} datasets")
    how: dict[str, Any] = {
        "weights": weights,
        "until": "last" if longest else "first",
        "even": even,
        "names": [f"dataset{i}" for i in range(len(datasets))],
    }
    if all(g is not None for g in graphs):
        return MixerIterDataPipe(*[g for g in graphs if g is not None], **how)
    # Without an index: the core's per-reader draws (mix() over unindexed sources), which
    # mix as webdataset's random_samples / round_robin_* do, from the loader's seed.
    mixer = DrawnMixerIterDataPipe(*[source_of(d) for d in datasets], **how)
    mixer.seek_refusal = _REFUSAL.format(kind="RoundRobin" if even else "RandomMix")
    return mixer


class RandomMix(DataPipeline):
    """Draw each sample from one of ``datasets`` at random, by ``probs`` (webdataset's ``RandomMix``).

    Args:
        datasets: ``WebDataset`` pipelines (or other iterables).
        probs: Relative probabilities. Default: ``None`` (equal).
        longest: Go on until every dataset is exhausted (``True``), or stop when the first
            one is (``False``, default).
    """

    def __init__(
        self, datasets: Sequence[Any], probs: Sequence[float] | None = None, longest: bool = False
    ) -> None:
        self.datasets = list(datasets)
        self.probs = probs
        self.longest = longest
        super().__init__(_mix(self.datasets, probs, longest, even=False))

    @property
    def one_to_one(self) -> bool:  # type: ignore[override]  # a trait read per instance
        """Whether it yields its mixture's items unchanged (no ``with_epoch``/``repeat``)."""
        return self.repetitions == 1 and self.nsamples == -1


class RoundRobin(DataPipeline):
    """Take one sample from each of ``datasets`` in turn (webdataset's ``RoundRobin``).

    Args:
        datasets: ``WebDataset`` pipelines (or other iterables).
        longest: Go on until every dataset is exhausted (``True``), or stop when the first
            one is (``False``, default).
    """

    def __init__(self, datasets: Sequence[Any], longest: bool = False) -> None:
        self.datasets = list(datasets)
        self.longest = longest
        super().__init__(_mix(self.datasets, None, longest, even=True))

    @property
    def one_to_one(self) -> bool:  # type: ignore[override]  # a trait read per instance
        """Whether it yields its mixture's items unchanged (no ``with_epoch``/``repeat``)."""
        return self.repetitions == 1 and self.nsamples == -1
