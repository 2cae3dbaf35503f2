"""torchdata 0.9's ``dataloader2.communication.eventloop``: names kept, construction refused (see the package)."""

from __future__ import annotations

from shardpipes.dataloader2.communication._gone import GoneBase

__all__ = [
    "CreateProcessForDataPipeline",
    "CreateProcessForMultipleDataPipelines",
    "DataPipeToQueuesLoop",
]


class CreateProcessForDataPipeline(GoneBase):
    """0.9's ``CreateProcessForDataPipeline``: not used by shardpipes."""


class CreateProcessForMultipleDataPipelines(GoneBase):
    """0.9's ``CreateProcessForMultipleDataPipelines``: not used by shardpipes."""


class DataPipeToQueuesLoop(GoneBase):
    """0.9's ``DataPipeToQueuesLoop``: not used by shardpipes."""
