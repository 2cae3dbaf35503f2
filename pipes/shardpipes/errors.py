"""Exceptions and warnings raised by shardpipes.

Every exception subclasses a builtin as well as :class:`ShardpipesError`, so callers can catch
``OSError`` or ``ValueError`` as they would from the standard library, and every message names
the URL and, where there is one, the member name or byte offset.

The fields (``url``, ``offset``, ``key``, ...) are keyword arguments with defaults: torch
re-raises an exception from a worker process as ``type(exc)(message)``, and a required field
would turn it into a plain ``RuntimeError``. The message always carries the same facts.
"""

from __future__ import annotations

import errno
import tarfile

__all__ = [
    "AttestationError",
    "AttestationWarning",
    "DecodeError",
    "EmptyEpochWarning",
    "ForbiddenShardError",
    "MissingShardError",
    "NotAFileError",
    "RetriesExhaustedError",
    "SampleFormatError",
    "ShardFormatError",
    "ShardReadError",
    "ShardingWarning",
    "ShardpipesError",
    "ShardpipesWarning",
    "SkippedInputWarning",
    "StateMismatchError",
    "WorkerError",
]


class ShardpipesError(Exception):
    """Base class of every exception that shardpipes raises on its own account."""


class ShardReadError(ShardpipesError, OSError):
    """A shard could not be read: missing, forbidden, or the network failed past the retries.

    Attributes:
        url: The shard's URL (never with credentials).
        offset: The byte offset reached when the read failed, or ``None``.
    """

    def __init__(
        self, message: str, *, url: str = "", offset: int | None = None, err: int = errno.EIO
    ) -> None:
        super().__init__(err, message)
        self.url = url
        self.offset = offset

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[object, ...]:
        # type(self): subclasses (MissingShardError, ...) keep their type across processes.
        return (
            _rebuild_read_error,
            (type(self), str(self.strerror), self.url, self.offset, self.errno),
        )


class MissingShardError(ShardReadError, FileNotFoundError):
    """The URL names no file (or no bucket)."""


class ForbiddenShardError(ShardReadError, PermissionError):
    """Access to the URL is denied (401/403, bad or missing credentials)."""


class NotAFileError(ShardReadError, IsADirectoryError):
    """The URL names a directory."""


class RetriesExhaustedError(ShardReadError):
    """Transient errors (resets, time-outs, 5xx) went on past the configured retries."""


def _rebuild_read_error(
    cls: type[ShardReadError], message: str, url: str, offset: int | None, err: int
) -> ShardReadError:
    return cls(message, url=url, offset=offset, err=err)


class ShardFormatError(ShardpipesError, ValueError, tarfile.ReadError):
    """A shard is not a valid tar archive: truncated, corrupt header, bad checksum.

    Attributes:
        url: The shard's URL.
        offset: Byte offset of the bad header or of the truncation.
        member: Name of the member involved, when known.
    """

    def __init__(
        self, message: str, *, url: str = "", offset: int | None = None, member: str | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.offset = offset
        self.member = member

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_format_error,
            (type(self), self.args[0], self.url, self.offset, self.member),
        )


def _rebuild_format_error(
    cls: type[ShardFormatError], message: str, url: str, offset: int | None, member: str | None
) -> ShardFormatError:
    return cls(message, url=url, offset=offset, member=member)


class SampleFormatError(ShardpipesError, ValueError):
    """Members of a shard do not form valid samples (no extension, key not adjacent, missing field).

    Attributes:
        url: The shard's URL.
        key: The sample key involved.
    """

    def __init__(self, message: str, *, url: str = "", key: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.key = key

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt with keywords, so the error pickles from worker processes (DecodeError too).
        return (_rebuild_sample_error, (type(self), self.args[0], self.url, self.key))


def _rebuild_sample_error(
    cls: type[SampleFormatError], message: str, url: str, key: str
) -> SampleFormatError:
    return cls(message, url=url, key=key)


class DecodeError(SampleFormatError):
    """A field of a sample could not be decoded (for example invalid JSON or a broken image)."""


class WorkerError(ShardpipesError, RuntimeError):
    """A worker process or a rank died or failed; the message names which one and why."""


class ShardpipesWarning(UserWarning):
    """Base class of warnings about problems the user can act on."""


class SkippedInputWarning(ShardpipesWarning):
    """Input was skipped under a ``warn_and_skip`` handler; the message says what and why."""


class ShardingWarning(ShardpipesWarning):
    """The graph is not split across readers as intended (for example no ``sharding_filter``)."""


class EmptyEpochWarning(ShardpipesWarning):
    """An epoch yielded nothing, or a stage dropped everything it received; the message names it."""


class StateMismatchError(ShardpipesError, ValueError):
    """A loader state does not belong to this loader: other data, another plan, rank or run.

    Attributes:
        changes: What differs, one sentence each (e.g. ``"shards added: 3 -> 4 shards"``).
    """

    def __init__(self, message: str, *, changes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.changes = changes


class AttestationError(WorkerError):
    """The ranks' check of what they yielded failed: duplicates, a skip, ranks out of step.

    Attributes:
        fault: The kind of fault: ``"duplicate"``, ``"out-of-step"``, ``"other-run"``,
            ``"dropped-state"``, ``"other-data"``, ``"skipped"`` or ``"other-range"``.
    """

    def __init__(self, message: str, *, fault: str = "") -> None:
        super().__init__(message)
        self.fault = fault


class AttestationWarning(ShardpipesWarning):
    """The same faults as :class:`AttestationError`, under the ``"warn"`` policy."""
