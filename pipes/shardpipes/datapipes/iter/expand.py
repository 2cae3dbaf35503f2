"""Brace expansion of shard URL patterns (functional name: ``shard_expand``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

from shardpipes.datapipes.iter.base import StageIterDataPipe, register

__all__ = ["ShardExpanderIterDataPipe", "expand_braces"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Expand every ``{a..b}`` range and ``{x,y,z}`` list in ``pattern``, left to right.

    Ranges keep the zero padding of their first bound (``{000..003}`` gives ``000``...``003``);
    several braces give their product in order.

    Raises:
        ValueError: An empty brace, a descending range, or an unbalanced ``{``/``}``.
    """
    parts: list[list[str]] = []
    pos = 0
    for m in _BRACE.finditer(pattern):
        parts.append([pattern[pos : m.start()]])
        body = m.group(1)
        rng = _RANGE.match(body)
        if rng:
            lo_text, hi_text = rng.group(1), rng.group(2)
            lo, hi = int(lo_text), int(hi_text)
            if hi < lo:
                raise ValueError(f"{pattern!r}: bad range {{{body}}} goes down ({lo} > {hi})")
            # torchdata 0.9's padding rules: a padded low bound has the high bound's width.
            if len(lo_text) > len(hi_text):
                raise ValueError(
                    f"{pattern!r}: in {{{body}}} the low bound must be shorter than (or as long as) the high bound"
                )
            if len(lo_text) < len(hi_text) and lo_text.startswith("0") and lo_text != "0":
                raise ValueError(
                    f"{pattern!r}: in {{{body}}} a low bound shorter than the high bound must not start with 0"
                )
            width = len(lo_text) if lo_text.lstrip("-").startswith("0") else 0
            parts.append([f"{i:0{width}d}" for i in range(lo, hi + 1)])
        elif "," in body:
            parts.append(body.split(","))
        else:
            raise ValueError(
                f"{pattern!r}: brace {{{body}}} is neither a range a..b nor a list a,b"
            )
        pos = m.end()
    parts.append([pattern[pos:]])
    if (
        "{" in pattern[pos:]
        or "}" in pattern[pos:]
        or any("{" in p[0] or "}" in p[0] for p in parts[::2])
    ):
        raise ValueError(f"{pattern!r}: unbalanced or nested braces")
    return ["".join(p) for p in itertools.product(*parts)]


@register("shard_expand")
class ShardExpanderIterDataPipe(StageIterDataPipe[str]):
    """Expand brace patterns in URLs into one URL per shard (functional name: ``shard_expand``).

    ``train-{000000..000127}.tar`` becomes 128 URLs; ``{a,b}/x-{0..1}.tar`` becomes
    ``a/x-0.tar, a/x-1.tar, b/x-0.tar, b/x-1.tar``. Works on any URL scheme (it does no I/O).

    Args:
        source_datapipe: URL patterns.

    Yields:
        str: URLs, in pattern order.

    Raises:
        ValueError: A malformed pattern, naming it.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["s3://b/t-{00..02}.tar"]).shard_expand())
        ['s3://b/t-00.tar', 's3://b/t-01.tar', 's3://b/t-02.tar']
    """

    def __init__(self, source_datapipe: Iterable[str]) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[str]:
        for pattern in self.source_datapipe:
            yield from expand_braces(pattern)

    def __len__(self) -> int:
        len(self.source_datapipe)  # type: ignore[arg-type]  # TypeError when the source has no length
        return sum(len(expand_braces(p)) for p in self.source_datapipe)
