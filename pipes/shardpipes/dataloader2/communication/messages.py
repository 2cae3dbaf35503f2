"""torchdata 0.9's ``dataloader2.communication.messages``: the queue protocol's messages, as values."""

from __future__ import annotations

from typing import Any

__all__ = [
    "DataLoaderQueueMessage",
    "GetItemRequest",
    "GetItemResponse",
    "GetNextRequest",
    "GetNextResponse",
    "InvalidStateResponse",
    "LenRequest",
    "LenResponse",
    "LimitRequest",
    "LimitResponse",
    "PauseRequest",
    "PauseResponse",
    "Request",
    "ResetEpochRequest",
    "ResetEpochResponse",
    "Response",
    "ResumeRequest",
    "ResumeResponse",
    "StopIterationResponse",
    "TerminateRequest",
    "TerminateResponse",
    "WorkerExceptionResponse",
]


class DataLoaderQueueMessage:
    """A message; its positional and keyword arguments become its ``args`` and attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        for k, v in kwargs.items():
            setattr(self, k, v)


class Request(DataLoaderQueueMessage):
    """A request to a worker."""


class Response(DataLoaderQueueMessage):
    """A worker's response."""


class ResetEpochRequest(Request):
    """Reset the worker's graph for a new epoch."""


class ResetEpochResponse(Response):
    """The epoch was reset."""


class PauseRequest(Request):
    """Pause the worker."""


class PauseResponse(Response):
    """The worker paused."""


class ResumeRequest(Request):
    """Resume the worker."""


class ResumeResponse(Response):
    """The worker resumed."""


class LimitRequest(Request):
    """Limit the number of items the worker yields."""


class LimitResponse(Response):
    """The limit was set."""


class TerminateRequest(Request):
    """Stop the worker."""


class TerminateResponse(Response):
    """The worker stopped."""


class LenRequest(Request):
    """Ask the length of the worker's graph."""


class LenResponse(Response):
    """The length."""


class GetItemRequest(Request):
    """Ask for an item by key (map-style)."""


class GetItemResponse(Response):
    """An item by key."""


class GetNextRequest(Request):
    """Ask for the next item."""


class GetNextResponse(Response):
    """The next item."""


class StopIterationResponse(Response):
    """The worker's graph is exhausted."""


class InvalidStateResponse(Response):
    """The request does not fit the worker's state."""


class WorkerExceptionResponse(Response):
    """The worker raised."""
