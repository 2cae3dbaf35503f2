"""torchdata 0.9's ``datapipes.utils.janitor`` module path."""

from shardpipes.datapipes.utils._helpers import janitor

__all__ = ["janitor"]
