"""Mixtures of sources: which source fills each position of an epoch, as pure functions of integers.

A mixture reads ``N`` sources. Each epoch:

1. Every source contributes a fixed number of samples ``counts[i]`` (:meth:`Mixture.counts`,
   :mod:`~shardpipes.plan.mixture.declaration`): per-epoch proportions (``repeat``: that
   many times its size, ``choose``: that many samples), weights (the epoch's
   ``samples_per_epoch`` apportioned by weight), or weights scheduled by step (the weights
   integrated over the epoch's steps). A source's samples of the epoch are its own epoch
   sequence (its shards in the epoch's order, laid end to end) read from the start and
   around again when it contributes more than it has: position ``p`` is sample ``p % size``
   of that sequence.
2. Those positions are split between the ``readers`` exactly (:class:`MixSplit`,
   :mod:`~shardpipes.plan.mixture.split`): each reader gets an equal total, one contiguous
   stretch of every source (plus one more run for its share of the remainders), so it reads
   every source as a single stream is read. Fewer than ``readers`` positions of the epoch are
   left out to keep readers equal ("drop"), taken first from sources that are not read
   exactly once.
3. Each reader interleaves its stretches (:func:`interleave`,
   :mod:`~shardpipes.plan.mixture.order`): the ``j``-th sample of source ``i`` of ``q``
   arrives at time ``P_i^-1((j + u) / q)``, ``u`` a counter-based draw in ``[0, 1)`` and
   ``P_i`` the source's cumulative share of the reader's time (linear for constant weights,
   the schedule's integral otherwise); the reader yields samples in arrival order. So every
   source is spread evenly over the reader's epoch, a window of ``n`` samples holds
   ``n * w_i`` of source ``i`` up to the jitter, and a schedule's new weights take over
   where its step falls.

Nothing depends on what a worker drew: a reader's sequence is a function of ``(seed, epoch,
segment, reader, counts)``. The state of a mixture is the loader's (epoch and items consumed
per stretch of the epoch, :class:`~shardpipes.plan.resume.Segment`); :func:`mix_reader`
(:mod:`~shardpipes.plan.mixture.reader`) derives from it what each source has left and
splits that again for any new topology.
"""

from shardpipes.plan.mixture.declaration import Mixture, Schedule, apportion
from shardpipes.plan.mixture.order import interleave, round_robin
from shardpipes.plan.mixture.reader import MixReader, mix_reader
from shardpipes.plan.mixture.split import MixSplit

__all__ = [
    "MixReader",
    "MixSplit",
    "Mixture",
    "Schedule",
    "apportion",
    "interleave",
    "mix_reader",
    "round_robin",
]
