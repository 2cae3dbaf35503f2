"""torchdata 0.9's ``dataloader2.communication.protocol``: names kept, construction refused (see the package)."""

from __future__ import annotations

from shardpipes.dataloader2.communication._gone import GoneBase

__all__ = [
    "EmptyQueue",
    "IterDataPipeQueueProtocolClient",
    "IterDataPipeQueueProtocolServer",
    "MapDataPipeQueueProtocolClient",
    "MapDataPipeQueueProtocolServer",
    "Protocol",
    "ProtocolClient",
    "ProtocolServer",
]


class EmptyQueue(Exception):
    """0.9's ``EmptyQueue`` signal."""


class IterDataPipeQueueProtocolClient(GoneBase):
    """0.9's ``IterDataPipeQueueProtocolClient``: not used by shardpipes."""


class IterDataPipeQueueProtocolServer(GoneBase):
    """0.9's ``IterDataPipeQueueProtocolServer``: not used by shardpipes."""


class MapDataPipeQueueProtocolClient(GoneBase):
    """0.9's ``MapDataPipeQueueProtocolClient``: not used by shardpipes."""


class MapDataPipeQueueProtocolServer(GoneBase):
    """0.9's ``MapDataPipeQueueProtocolServer``: not used by shardpipes."""


class Protocol(GoneBase):
    """0.9's ``Protocol``: not used by shardpipes."""


class ProtocolClient(GoneBase):
    """0.9's ``ProtocolClient``: not used by shardpipes."""


class ProtocolServer(GoneBase):
    """0.9's ``ProtocolServer``: not used by shardpipes."""
