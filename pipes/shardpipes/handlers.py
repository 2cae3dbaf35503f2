"""Error policies for stages that can fail on data.

A stage that reads or parses data takes ``handler=``, one of:

- ``"raise"`` (the default): the error propagates, with a note naming the URL and member/key.
- ``"warn_and_skip"``: warn with :class:`~shardpipes.errors.SkippedInputWarning`, skip, count.
- ``"skip"``: skip and count, without a warning.
- ``"stop"``: end the current shard (or stream) quietly, and count it.
- a callable ``fn(exc) -> bool``: return ``True`` to skip, ``False`` to stop; raise to raise.

Nothing is skipped silently: every skip is counted in the stage's :class:`SkipStats`, which
:meth:`shardpipes.dataloader2.DataLoader2.stats` sums over the graph and every worker
(and logs once per epoch).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from shardpipes.errors import SkippedInputWarning

__all__ = ["HandlerLike", "SkipStats", "resolve_handler"]

logger = logging.getLogger(__name__)

HandlerLike: TypeAlias = (
    Literal["raise", "warn_and_skip", "skip", "stop"] | Callable[[BaseException], bool]
)

_NAMES = ("raise", "warn_and_skip", "skip", "stop")

# How many (url, reason) examples a SkipStats keeps; the counts are always exact.
_MAX_EXAMPLES = 20


@dataclass
class SkipStats:
    """What a stage skipped under a non-raising handler.

    Attributes:
        samples: Number of samples (or members, or items) skipped.
        shards: Number of shards abandoned part-way (``stop``) or skipped whole.
        examples: Up to 20 ``(url, reason)`` pairs, the first ones seen.
    """

    samples: int = 0
    shards: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)

    def record(self, url: str, exc: BaseException, *, shard: bool = False) -> None:
        """Count one skipped item (or shard) and keep an example."""
        if shard:
            self.shards += 1
        else:
            self.samples += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append((url, f"{type(exc).__name__}: {exc}"))

    def merge(self, other: SkipStats) -> None:
        """Add another stage's counts to these."""
        self.samples += other.samples
        self.shards += other.shards
        room = _MAX_EXAMPLES - len(self.examples)
        self.examples.extend(other.examples[: max(room, 0)])

    def __bool__(self) -> bool:
        return bool(self.samples or self.shards)


class Policy:
    """A resolved handler: decides, for one exception, whether to raise, skip or stop."""

    def __init__(self, handler: HandlerLike) -> None:
        if callable(handler):
            self.name = getattr(handler, "__name__", "callable")
            self._fn: Callable[[BaseException], bool] | None = handler
        elif handler in _NAMES:
            self.name = handler
            self._fn = None
        else:
            raise ValueError(
                f"handler {handler!r} is not a known policy; must be one of {', '.join(_NAMES)}, "
                "or a callable taking the exception and returning True to skip, False to stop"
            )

    @property
    def raises(self) -> bool:
        """Whether this policy re-raises every error (the default)."""
        return self._fn is None and self.name == "raise"

    def __call__(
        self, exc: BaseException, url: str, stats: SkipStats, *, shard: bool = False
    ) -> bool:
        """Return ``True`` to skip the item, ``False`` to stop the stream; or raise ``exc``.

        The decision is counted in ``stats`` before returning: as a shard when it stops the
        stream, or when ``shard`` says that skipping drops the rest of a shard; else as a sample.
        """
        if self._fn is not None:
            skip = bool(self._fn(exc))
        elif self.name == "raise":
            raise exc
        else:
            skip = self.name != "stop"
        stats.record(url, exc, shard=shard or not skip)
        if self.name == "warn_and_skip":
            warnings.warn(f"skipped: {exc}", SkippedInputWarning, stacklevel=3)
        else:
            logger.debug("handler %s: %s on %s", self.name, "skip" if skip else "stop", exc)
        return skip

    def __reduce__(self) -> tuple[object, ...]:
        return (Policy, (self._fn if self._fn is not None else self.name,))


def resolve_handler(handler: HandlerLike) -> Policy:
    """Turn a handler name or callable into a :class:`Policy`, or raise ``ValueError``."""
    return Policy(handler)
