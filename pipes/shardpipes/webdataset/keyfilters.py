"""webdataset's field-pattern stages: ``extract_keys``, ``rename_keys``, ``xdecode``, and ``Cached``."""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Iterable, Iterator
from fnmatch import fnmatch
from typing import Any

from shardpipes.webdataset import utils
from shardpipes.webdataset._curry import pipelinefilter

__all__ = [
    "Cached",
    "ExtractKeys",
    "RenameKeys",
    "XDecode",
    "default_decoders",
    "extract_keys",
    "rename_keys",
    "xdecode",
]


class ExtractKeys:
    """``extract_keys(*patterns)``'s function of one sample: the fields matching the patterns, as a tuple."""

    def __init__(
        self,
        patterns: tuple[Any, ...],
        duplicate_is_error: bool = True,
        ignore_missing: bool = False,
    ) -> None:
        self.patterns = patterns
        self.duplicate_is_error = duplicate_is_error
        self.ignore_missing = ignore_missing

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        """The matching fields of ``sample``."""
        result = []
        for pattern in self.patterns:
            alts = pattern.split(";") if isinstance(pattern, str) else pattern
            matches = [x for x in sample if any(fnmatch("." + x, p) or fnmatch(x, p) for p in alts)]
            if not matches:
                if self.ignore_missing:
                    continue
                raise ValueError(f"Cannot find {alts} in sample keys {sample.keys()}.")
            if len(matches) > 1 and self.duplicate_is_error:
                raise ValueError(f"Multiple sample keys {sample.keys()} match {alts}.")
            result.append(sample[matches[0]])
        return tuple(result)


def _extract_keys(
    source: Iterable[Any],
    *patterns: Any,
    duplicate_is_error: bool = True,
    ignore_missing: bool = False,
) -> Iterator[Any]:
    extract = ExtractKeys(patterns, duplicate_is_error, ignore_missing)
    for sample in source:
        yield extract(sample)


extract_keys = pipelinefilter(_extract_keys)


class RenameKeys:
    """``rename_keys(new="pattern", ...)``'s function of one sample."""

    def __init__(
        self,
        args: tuple[Any, ...],
        kw: dict[str, Any],
        keep_unselected: bool = False,
        must_match: bool = True,
        duplicate_is_error: bool = True,
    ) -> None:
        self.renamings = [(pattern, output) for output, pattern in args]
        self.renamings += [(pattern, output) for output, pattern in kw.items()]
        self.keep_unselected = keep_unselected
        self.must_match = must_match
        self.duplicate_is_error = duplicate_is_error

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with its fields renamed."""
        new: dict[str, Any] = {}
        matched = {k: False for k, _ in self.renamings}
        for path, value in sample.items():
            fname = re.sub(r".*/", "", path)
            name = None
            for pattern, out in self.renamings[::-1]:
                if fnmatch(fname.lower(), pattern):
                    matched[pattern] = True
                    name = out
                    break
            if name is None:
                if self.keep_unselected:
                    new[path] = value
                continue
            if name in new:
                if self.duplicate_is_error:
                    raise ValueError(f"Duplicate value in sample {sample.keys()} after rename.")
                continue
            new[name] = value
        if self.must_match and not all(matched.values()):
            raise ValueError(f"Not all patterns ({matched}) matched sample keys ({sample.keys()}).")
        return new


def _rename_keys(
    source: Iterable[Any],
    *args: Any,
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: Any,
) -> Iterator[Any]:
    rename = RenameKeys(args, kw, keep_unselected, must_match, duplicate_is_error)
    for sample in source:
        yield rename(sample)


rename_keys = pipelinefilter(_rename_keys)


def _decode_bin(stream: io.BytesIO) -> bytes:
    return stream.read()


def _decode_text(stream: io.BytesIO) -> str:
    return stream.read().decode("utf-8")


def _decode_pickle(stream: io.BytesIO) -> Any:
    if utils.enforce_security:
        raise ValueError(
            "Unpickling is not allowed for security reasons when enforce_security is set"
        )
    return pickle.load(stream)


default_decoders = [("*.bin", _decode_bin), ("*.txt", _decode_text), ("*.pyd", _decode_pickle)]


def _find_decoder(decoders: list[tuple[str, Any]], path: str) -> Any:
    fname = re.sub(r".*/", "", path)
    if fname.startswith("__"):
        return utils.identity
    for pattern, fun in decoders[::-1]:
        if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
            return fun
    return None


class XDecode:
    """``xdecode(("*.png", f), ...)``'s function of one sample."""

    def __init__(
        self,
        args: tuple[Any, ...],
        kw: dict[str, Any],
        must_decode: bool = True,
        defaults: Any = default_decoders,
    ) -> None:
        self.decoders = [*defaults, *args, *(("*." + k, v) for k, v in kw.items())]
        self.must_decode = must_decode

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with its fields decoded."""
        new = {}
        for path, data in sample.items():
            if path.startswith("__"):
                new[path] = data
                continue
            decoder = _find_decoder(self.decoders, path)
            if decoder is False:
                value = data
            elif decoder is None:
                if self.must_decode:
                    raise ValueError(f"No decoder found for {path}.")
                value = data
            else:
                value = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
            new[path] = value
        return new


def _xdecode(
    source: Iterable[Any],
    *args: Any,
    must_decode: bool = True,
    defaults: Any = default_decoders,
    **kw: Any,
) -> Iterator[Any]:
    decode = XDecode(args, kw, must_decode, defaults)
    for sample in source:
        yield decode(sample)


xdecode = pipelinefilter(_xdecode)


class Cached(utils.PipelineStage):
    """Keep the first pass in memory and replay it on later passes (``.mcached()``)."""

    def __init__(self) -> None:
        self.cached: list[Any] | None = None

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """Yield the source, recording it on the first pass; replay the record later."""
        if self.cached is not None:
            yield from self.cached
            return
        temp = []
        for sample in source:
            temp.append(sample)
            yield sample
        self.cached = temp
