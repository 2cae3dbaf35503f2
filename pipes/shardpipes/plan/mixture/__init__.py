"""Mixtures of sources: which source fills each position of an epoch, as pure functions of integers."""

from shardpipes.plan.mixture.declaration import (
    MixReader,
    MixSplit,
    Mixture,
    Schedule,
    apportion,
    interleave,
    mix_reader,
    round_robin,
)

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
