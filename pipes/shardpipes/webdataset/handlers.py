"""webdataset's error handlers: ``handler(exc)`` returns ``True`` to skip, ``False`` to stop, or raises.

These have webdataset's names and meaning, and they are also valid ``handler=`` values for the
shardpipes stages (:mod:`shardpipes.handlers` takes the same callable contract), so a skipped
shard or sample is counted in ``DataLoader2.stats()`` as well.
"""

from __future__ import annotations

import warnings

from shardpipes.errors import SkippedInputWarning

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]


def reraise_exception(exn: BaseException) -> bool:
    """Raise ``exn`` again (the default handler everywhere)."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip the item that failed and go on."""
    return True


def warn_and_continue(exn: BaseException) -> bool:
    """Warn (``SkippedInputWarning``), skip the item and go on.

    webdataset also sleeps half a second here; we do not (a deliberate difference).
    """
    warnings.warn(repr(exn), SkippedInputWarning, stacklevel=2)
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """End the current stream quietly."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn (``SkippedInputWarning``) and end the current stream."""
    warnings.warn(repr(exn), SkippedInputWarning, stacklevel=2)
    return False
