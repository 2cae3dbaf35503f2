"""Old private name of :mod:`shardpipes.datapipes.iter.base` (the stage base is public now)."""

from shardpipes.datapipes.iter.base import (
    PicklesRng,
    StageIterDataPipe,
    check_picklable_fn,
    register,
)

__all__ = ["PicklesRng", "StageIterDataPipe", "check_picklable_fn", "register"]
