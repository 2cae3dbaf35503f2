"""webdataset's stages as shardpipes stages, so the loader can see into a webdataset pipeline.

``.shuffle``, ``.batched``, ``.decode``, ``.map``, ``.to_tuple``, ``.map_dict``, ``.map_tuple``,
``.rename``, ``.extract_keys``, ``.rename_keys``, ``.xdecode``, ``.select`` and ``.rsample`` of a ``WebDataset``/``DataPipeline`` (and their stage
functions, ``wds.shuffle(1000)``, ...) become the classes here, each a subclass of the core stage
the loader already knows: the shuffle is the core's counter-based buffered shuffle
(:func:`shardpipes.plan.seeds.buffered_shuffle`, seeded per epoch and reader by the loader,
repositioned on resume), the batcher the core batcher, the per-sample functions one-to-one maps,
the decoder the core decode stage. So with a shard index a webdataset pipeline has an exact
length per reader and resumes by seeking, on the same or another topology, like a DataPipe graph.

What stays opaque (a user's iterator function, ``unbatched``, ``unlisted``, ``slice``,
``mcached``) runs as :class:`FilterStage`: the loader then replays an epoch to resume it (same topology)
or refuses another topology at ``load_state_dict``, naming why.

Traits (what the loader reads from each class, today through its base class):

- one-to-one: :class:`SampleMap`, :class:`Collate`, :class:`Decode`, :class:`PassThrough`,
  :class:`PassingFilter`
  (a handler's skip, or a ``map`` returning ``None``, is counted in ``skipped``: the loader
  then replays instead of seeking, and pads an exact length);
- batch: :class:`Batcher`; sample shuffle (resumable by seeking): :class:`Shuffle`;
- random, not resumable by seeking (replayed): :class:`RandomSample`;
- drops items (not one-to-one): :class:`Select`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.datapipes.iter._lean import (
    LeanBatcherIterDataPipe,
    LeanFilterIterDataPipe,
    LeanMapperIterDataPipe,
    LeanShufflerIterDataPipe,
)
from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.datapipes.iter.decode import DecoderIterDataPipe
from shardpipes.handlers import HandlerLike, Policy, SkipStats, resolve_handler
from shardpipes.webdataset import utils
from shardpipes.webdataset.handlers import reraise_exception

__all__ = [
    "Batcher",
    "Collate",
    "Decode",
    "FilterStage",
    "PassThrough",
    "PassingFilter",
    "RandomSample",
    "SampleMap",
    "Select",
    "Shuffle",
    "policy_of",
]


def policy_of(handler: Callable[[BaseException], bool]) -> HandlerLike:
    """A webdataset handler as a shardpipes policy (``reraise_exception`` is ``"raise"``)."""
    return "raise" if handler is reraise_exception else handler


def _url(sample: Any) -> str:
    return str(sample.get("__url__", "")) if isinstance(sample, dict) else ""


def _handled(
    fn: Callable[[Any], Any], samples: Iterable[Any], policy: Policy, skipped: SkipStats
) -> Iterator[tuple[Any, Any]]:
    """``(sample, fn(sample))`` for each sample; an error goes to ``policy``: skip it or stop."""
    for sample in samples:
        try:
            result = fn(sample)
        except Exception as exc:
            if policy(exc, _url(sample), skipped):
                continue
            return
        yield sample, result


class FilterStage(StageIterDataPipe[Any]):
    """Run an opaque webdataset stage function ``fn(iterator) -> iterator`` as a DataPipe.

    The loader cannot tell what it does to the count or order of items, so a graph with one
    after the sharder resumes by replaying the epoch (same topology) and refuses another topology.
    """

    def __init__(
        self, source_datapipe: IterDataPipe[Any], fn: Callable[[Iterator[Any]], Iterable[Any]]
    ) -> None:
        self.source_datapipe = source_datapipe
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        yield from self.fn(iter(self.source_datapipe))


class _Counter:
    """webdataset's ``detshuffle`` counts its epochs on the stage object the user holds."""

    epoch = -1


def _unseeded() -> int:
    return random.Random(int((os.getpid() + time.time()) * 1e9)).getrandbits(63)


class Shuffle(LeanShufflerIterDataPipe[Any]):
    """webdataset's buffered shuffle as the core's: counter-based draws, seeded by the loader.

    Under a shardpipes loader the seed comes from the epoch's plan (the same on every reader
    before the split, per reader after it), and a resumed epoch repositions the buffer. Without
    a loader, as in webdataset: ``seed`` fixes the order (the same every iteration),
    ``epoch_seeded`` (``detshuffle``) adds the iteration count to it, ``rng`` draws each
    iteration's seed from that generator, and none of them shuffles differently every time.
    webdataset's ``initial`` (start yielding before the buffer is full) is not kept: the buffer
    fills first, which is what makes the position after any output computable.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        bufsize: int = 1000,
        initial: int = 100,
        seed: Any = None,
        *,
        epoch_seeded: bool = False,
        counter: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        if seed is not None and rng is not None:
            raise ValueError("give shuffle either rng or seed, not both")
        super().__init__(source_datapipe, max(int(bufsize), 1), bufsize > 1, None)
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch_seeded = epoch_seeded
        self.counter = counter if counter is not None else _Counter()
        self.rng = rng
        self._by_loader = False

    def _own_seed(self) -> int:
        if self.epoch_seeded:
            return utils.make_seed(self.seed or 0, self.counter.epoch)
        if self.seed is not None:
            return utils.make_seed(self.seed)
        if self.rng is not None:
            return self.rng.getrandbits(63)
        return _unseeded()

    def set_seed(self, seed: int) -> Shuffle:
        """Seed the next iteration (loader hook); from then on the loader owns the seeds."""
        self._by_loader = True
        super().set_seed(seed)
        return self

    def __iter__(self) -> Iterator[Any]:
        self.counter.epoch += 1
        # Iterated again within a loader's epoch (with_epoch, repeat): the core shuffle draws
        # the next seed from the last one; never seeded by a loader: webdataset's own seeding.
        if self._seed is None and not self._by_loader:
            self._seed = self._own_seed()
        yield from super().__iter__()


class Batcher(LeanBatcherIterDataPipe):
    """webdataset's ``batched``/``listed`` grouping (lists of ``batchsize``) as the core batcher."""

    def __init__(self, source_datapipe: IterDataPipe[Any], batchsize: int, partial: bool) -> None:
        if batchsize < 1:
            raise ValueError(f"batchsize should be at least 1, got {batchsize}")
        super().__init__(source_datapipe, batchsize, not partial, list)


class SampleMap(LeanMapperIterDataPipe):
    """A per-sample function under a webdataset handler: one item out per item in.

    An error goes to ``handler`` (skip: counted in ``skipped``; stop: the stream ends). With
    ``drop_none`` (``.map``) a ``None`` result drops the sample, as in webdataset, and counts it
    in ``skipped`` too, so the loader knows the count no longer follows from the index. With
    ``keep_key`` a dict result gets the sample's ``__key__``, as webdataset's ``map`` does.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        fn: Callable[[Any], Any],
        handler: Callable[[BaseException], bool] = reraise_exception,
        *,
        name: str = "map",
        drop_none: bool = False,
        keep_key: bool = False,
    ) -> None:
        super().__init__(source_datapipe, fn)
        self.name = name
        self.handler = resolve_handler(policy_of(handler))
        self.drop_none = drop_none
        self.keep_key = keep_key
        self.skipped = SkipStats()

    def __iter__(self) -> Iterator[Any]:
        for sample, result in _handled(self.fn, self.datapipe, self.handler, self.skipped):
            if result is None and self.drop_none:
                self.skipped.record(_url(sample), _Dropped(f"{self.name}() returned None"))
                continue
            if self.keep_key and isinstance(sample, dict) and isinstance(result, dict):
                result["__key__"] = sample.get("__key__")
            yield result


class _Dropped(Exception):
    """The reason recorded when a webdataset ``map`` drops a sample by returning ``None``."""


class Collate(LeanMapperIterDataPipe):
    """A batch's collation (webdataset's ``collation_fn``, ``WebLoader``'s ``collate_fn``)."""


class PassThrough(LeanMapperIterDataPipe):
    """Base of stages that pass every item through unchanged (one-to-one)."""

    def __init__(self, source_datapipe: IterDataPipe[Any]) -> None:
        super().__init__(source_datapipe, utils.identity)

    def __iter__(self) -> Iterator[Any]:
        yield from self.datapipe


class PassingFilter(PassThrough):
    """A webdataset stage function that yields every item it reads, once, in order (``info``)."""

    def __init__(
        self, source_datapipe: IterDataPipe[Any], fn: Callable[[Iterator[Any]], Iterable[Any]]
    ) -> None:
        super().__init__(source_datapipe)
        self.stage_fn = fn

    def __iter__(self) -> Iterator[Any]:
        yield from self.stage_fn(iter(self.datapipe))


class Decode(DecoderIterDataPipe):
    """webdataset's ``decode(...)`` (handler strings and functions) as the core decode stage.

    The decoding itself is webdataset's :class:`~shardpipes.webdataset.autodecode.Decoder`;
    the stage (one-to-one, skips counted in ``skipped``) is the core's.
    """

    def __init__(  # the core's table is not built: the decoder is webdataset's
        self,
        source_datapipe: IterDataPipe[Any],
        decoder: Callable[[Any], Any],
        handler: Callable[[BaseException], bool] = reraise_exception,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.decoder = decoder
        self.handler = resolve_handler(policy_of(handler))
        self.skipped = SkipStats()

    def __iter__(self) -> Iterator[Any]:
        for _, result in _handled(self.decoder, self.source_datapipe, self.handler, self.skipped):
            yield result


class Select(LeanFilterIterDataPipe[Any]):
    """webdataset's ``select(predicate)``: keeps the samples whose predicate is true (any truthy value)."""

    def __init__(self, source_datapipe: IterDataPipe[Any], predicate: Callable[[Any], Any]) -> None:
        super().__init__(source_datapipe, predicate)

    def __iter__(self) -> Iterator[Any]:
        fn = self.filter_fn
        dropped = passed = 0
        try:
            for x in self.datapipe:
                if fn(x):
                    passed += 1
                    yield x
                else:
                    dropped += 1
        finally:
            self.dropped += dropped
            self.passing += 1 if passed else 0


class RandomSample(StageIterDataPipe[Any]):
    """webdataset's ``rsample(p)``: keep each sample with probability ``p``, seeded by the loader.

    webdataset draws from the global ``random``; here the stage owns a generator seeded from the
    epoch's plan (per reader), so a replayed epoch keeps the same samples.
    """

    def __init__(self, source_datapipe: IterDataPipe[Any], p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"rsample: p ({p}) should be in [0, 1]")
        self.source_datapipe = source_datapipe
        self.p = p
        self._seed: int | None = None

    def set_seed(self, seed: int) -> RandomSample:
        """Seed the next iteration (loader hook)."""
        self._seed = seed
        return self

    def __iter__(self) -> Iterator[Any]:
        seed, self._seed = self._seed, None
        rng = random.Random(seed if seed is not None else _unseeded())
        p = self.p
        for sample in self.source_datapipe:
            if rng.random() < p:
                yield sample
