"""torchdata 0.9's ``datapipes.utils.pin_memory`` module path."""

from shardpipes.datapipes.utils._helpers import pin_memory_fn

__all__ = ["pin_memory_fn"]
