"""webdataset's stage functions: ``wds.shuffle(1000)``, ``wds.to_tuple("jpg;png", "cls")``, ...

Each public name is curried as in webdataset: ``wds.map(f)`` returns a :class:`FilterFunction`
that maps an iterator of samples to an iterator of samples, so it can be a stage of
:class:`~shardpipes.webdataset.DataPipeline`, or be called on any iterator. Inside a
``DataPipeline`` or ``WebDataset`` each becomes a DataPipe of the shardpipes graph; the
shuffles become seeded stages that the loader seeds per epoch and per reader.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from shardpipes.plan.seeds import buffered_shuffle
from shardpipes.webdataset import autodecode, utils
from shardpipes.webdataset._curry import FilterFunction, RestCurried, pipelinefilter
from shardpipes.webdataset.handlers import reraise_exception

# webdataset defines these in filters, and code imports them from there (the private ones too).
from shardpipes.webdataset.keyfilters import (
    Cached,
    LMDBCached,
    extract_keys,
    rename_keys,
    xdecode,
)
from shardpipes.webdataset.keyfilters import _extract_keys as _extract_keys
from shardpipes.webdataset.keyfilters import _rename_keys as _rename_keys
from shardpipes.webdataset.keyfilters import _xdecode as _xdecode

__all__ = [
    "Cached",
    "FilterFunction",
    "LMDBCached",
    "RestCurried",
    "batched",
    "decode",
    "default_collation_fn",
    "detshuffle",
    "extract_keys",
    "getfirst",
    "info",
    "map",
    "map_dict",
    "map_tuple",
    "parse_field_spec",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "unbatched",
    "unlisted",
    "xdecode",
]


def getfirst(
    a: dict[str, Any], keys: str | list[str], default: Any = None, missing_is_error: bool = True
) -> Any:
    """Return ``a[k]`` for the first of ``keys`` (a list, or ``"jpg;png"``) present in ``a``."""
    if isinstance(keys, str):
        if " " in keys:
            raise ValueError(f"field spec {keys!r} has a space; alternatives are separated by ';'")
        keys = keys.split(";")
    for k in keys:
        if k in a:
            return a[k]
    if missing_is_error:
        raise ValueError(f"didn't find {keys} in {list(a.keys())}")
    return default


def parse_field_spec(fields: str | list[str]) -> list[list[str]]:
    """``"jpg;png cls"`` -> ``[["jpg", "png"], ["cls"]]``."""
    if isinstance(fields, str):
        fields = fields.split()
    return [f.split(";") for f in fields]


def transform_with(sample: Any, transformers: list[Callable[[Any], Any] | None] | None) -> Any:
    """Apply ``transformers[i]`` to ``sample[i]`` (``None`` keeps the element)."""
    if not transformers:
        return sample
    if len(transformers) > len(sample):
        raise ValueError(f"{len(transformers)} transformers for a sample of {len(sample)} elements")
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


def _info(
    data: Iterable[Any],
    fmt: str | None = None,
    n: int = 3,
    every: int = -1,
    width: int = 50,
    stream: Any = None,
    name: str = "",
) -> Iterator[Any]:
    stream = sys.stderr if stream is None else stream
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is None:
                stream.write(f"--- {name}\n")
                for k, v in sample.items():
                    stream.write(f"{k} {repr(v)[:width]}\n")
            else:
                stream.write(fmt.format(**sample) + "\n")
        yield sample


info = pipelinefilter(_info)


def shuffle_iter(
    data: Iterable[Any], bufsize: int, initial: int, rng: random.Random
) -> Iterator[Any]:
    """The buffered shuffle of ``data``, seeded by one draw from ``rng``.

    It is shardpipes' counter-based shuffle (:func:`shardpipes.plan.seeds.buffered_shuffle`,
    the one the loader resumes by seeking), not webdataset's own: the buffer fills to
    ``bufsize`` before the first item comes out, so ``initial`` is accepted and not used.
    """
    if bufsize <= 1:
        yield from data
        return
    yield from buffered_shuffle(data, rng.getrandbits(63), bufsize)


def _unseeded() -> random.Random:
    return random.Random(int((os.getpid() + time.time()) * 1e9))


def _shuffle(
    data: Iterable[Any],
    bufsize: int = 1000,
    initial: int = 100,
    rng: random.Random | None = None,
    seed: Any = None,
    handler: Any = None,
) -> Iterator[Any]:
    if seed is not None:
        if rng is not None:
            raise ValueError("give shuffle either rng or seed, not both")
        rng = random.Random(utils.make_seed(seed))
    elif rng is None:
        rng = _unseeded()
    return shuffle_iter(data, bufsize, initial, rng)


shuffle = pipelinefilter(_shuffle)


class detshuffle(utils.PipelineStage):
    """A shuffle seeded by ``seed`` and the epoch, which counts up at each run."""

    def __init__(
        self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1
    ) -> None:
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch = epoch

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        """Shuffle ``src`` with the next epoch's seed."""
        self.epoch += 1
        rng = random.Random(utils.make_seed(self.seed, self.epoch))
        return shuffle_iter(src, self.bufsize, self.initial, rng)


def _guarded(
    data: Iterable[Any], fn: Callable[[Any], Any], handler: Callable[[BaseException], bool]
) -> Iterator[tuple[Any, Any]]:
    """Yield ``(sample, fn(sample))``; on an error ask ``handler``: skip (True) or stop (False)."""
    for sample in data:
        try:
            result = fn(sample)
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield sample, result


def _select(data: Iterable[Any], predicate: Callable[[Any], bool]) -> Iterator[Any]:
    for sample in data:
        if predicate(sample):
            yield sample


select = pipelinefilter(_select)


def make_decoder(*args: Any, **kw: Any) -> autodecode.Decoder:
    """The decoder of webdataset's ``decode(*args, **kw)``: handler strings become image handlers."""
    handlers = [autodecode.ImageHandler(x) if isinstance(x, str) else x for x in args]
    return autodecode.Decoder(handlers, **kw)


def _decode(
    data: Iterable[Any],
    *args: Any,
    handler: Callable[[BaseException], bool] = reraise_exception,
    **kw: Any,
) -> Iterator[Any]:
    for _, decoded in _guarded(data, make_decoder(*args, **kw), handler):
        yield decoded


decode = pipelinefilter(_decode)


def _map(
    data: Iterable[Any],
    f: Callable[[Any], Any],
    handler: Callable[[BaseException], bool] = reraise_exception,
) -> Iterator[Any]:
    for sample, result in _guarded(data, f, handler):
        if result is None:
            continue
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        yield result


map = pipelinefilter(_map)


def _listify(v: Any) -> list[str]:
    return v.split(";") if isinstance(v, str) else list(v)


class Renamer:
    """``rename(keep, image="jpg;png")``'s function of one sample."""

    def __init__(self, keep: bool, kw: dict[str, Any]) -> None:
        self.keep = keep
        self.kw = kw
        self.replaced = {x for v in kw.values() for x in _listify(v)}

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        new = {k: getfirst(sample, v, missing_is_error=True) for k, v in self.kw.items()}
        if not self.keep:
            return new
        result = {k: v for k, v in sample.items() if k not in self.replaced}
        result.update(new)
        return result


_Renamer = Renamer


def _rename(
    data: Iterable[Any],
    handler: Callable[[BaseException], bool] = reraise_exception,
    keep: bool = True,
    **kw: Any,
) -> Iterator[Any]:
    for _, result in _guarded(data, Renamer(keep, kw), handler):
        yield result


rename = pipelinefilter(_rename)


class MapDict:
    """``map_dict(jpg=f, ...)``'s function of one sample: ``sample[k] = f(sample[k])``."""

    def __init__(self, kw: dict[str, Callable[[Any], Any]]) -> None:
        if not kw:
            raise ValueError("map_dict needs at least one field=function")
        for key, f in kw.items():
            if not callable(f):
                raise TypeError(f"map_dict: {key}={f!r} is not callable")
        self.kw = kw

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for k, f in self.kw.items():
            sample[k] = f(sample[k])
        return sample


def _map_dict(
    data: Iterable[Any], handler: Callable[[BaseException], bool] = reraise_exception, **kw: Any
) -> Iterator[Any]:
    apply = MapDict(kw)
    for _, result in _guarded(data, apply, handler):
        yield result


map_dict = pipelinefilter(_map_dict)


class ToTuple:
    """``to_tuple("jpg;png", "cls")``'s function of one sample."""

    def __init__(
        self,
        args: tuple[Any, ...],
        missing_is_error: bool = True,
        none_is_error: bool | None = None,
    ) -> None:
        if len(args) == 1 and isinstance(args[0], str) and " " in args[0]:
            args = tuple(args[0].split())
        self.args = args
        self.missing_is_error = missing_is_error
        self.none_is_error = missing_is_error if none_is_error is None else none_is_error

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        result = tuple(
            getfirst(sample, f, missing_is_error=self.missing_is_error) for f in self.args
        )
        if self.none_is_error and any(x is None for x in result):
            raise ValueError(f"to_tuple {self.args} got {sample.keys()}")
        return result


def _to_tuple(
    data: Iterable[Any],
    *args: Any,
    handler: Callable[[BaseException], bool] = reraise_exception,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
) -> Iterator[Any]:
    pick = ToTuple(args, missing_is_error, none_is_error)
    for _, result in _guarded(data, pick, handler):
        yield result


to_tuple = pipelinefilter(_to_tuple)


class MapTuple:
    """``map_tuple(f, g)``'s function of one tuple sample: ``(f(t[0]), g(t[1]), ...)``."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        fns = [f if f is not None else utils.identity for f in args]
        for f in fns:
            if not callable(f):
                raise TypeError(f"map_tuple: {f!r} is not callable")
        self.fns = fns

    def __call__(self, sample: Any) -> tuple[Any, ...]:
        if not isinstance(sample, list | tuple):
            raise TypeError(f"map_tuple needs tuple samples, got {type(sample).__name__}")
        fns = self.fns
        out = list(sample)
        for i in range(min(len(fns), len(out))):
            out[i] = fns[i](out[i])
        return tuple(out)


def _map_tuple(
    data: Iterable[Any], *args: Any, handler: Callable[[BaseException], bool] = reraise_exception
) -> Iterator[Any]:
    apply = MapTuple(args)
    for _, result in _guarded(data, apply, handler):
        yield result


map_tuple = pipelinefilter(_map_tuple)


def _combine(b: list[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    first = b[0]
    if isinstance(first, int | float):
        return np.array(list(b)) if combine_scalars else b
    if isinstance(first, torch.Tensor | np.ndarray):
        if not combine_tensors:
            return b
        shapes = {x.shape for x in b}
        if len(shapes) != 1:
            raise ValueError(f"all shapes must be equal in collation, got {shapes}")
        return torch.stack(list(b)) if isinstance(first, torch.Tensor) else np.array(list(b))
    return list(b)


def default_collation_fn(
    samples: list[Any], combine_tensors: bool = True, combine_scalars: bool = True
) -> Any:
    """Webdataset's collation: numbers -> numpy array, tensors/arrays stacked, anything else a list."""
    rows = [x if isinstance(x, dict) else dict(enumerate(x)) for x in samples]
    keys = set(rows[0].keys())
    for row in rows[1:]:
        if set(row.keys()) != keys:
            raise ValueError("keys don't match in different samples")
    result = {k: _combine([row[k] for row in rows], combine_tensors, combine_scalars) for k in keys}
    if isinstance(samples[0], list | tuple):
        return tuple(result[i] for i in range(1 + max(result.keys())))
    return result


def _batched(
    data: Iterable[Any],
    batchsize: int = 20,
    collation_fn: Callable[[list[Any]], Any] | None = default_collation_fn,
    partial: bool = True,
) -> Iterator[Any]:
    batch: list[Any] = []
    for sample in data:
        if len(batch) >= batchsize:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
        batch.append(sample)
    if batch and (len(batch) == batchsize or partial):
        yield collation_fn(batch) if collation_fn is not None else batch


batched = pipelinefilter(_batched)


def _unlisted(data: Iterable[Any]) -> Iterator[Any]:
    for batch in data:
        if not isinstance(batch, list):
            raise TypeError(f"unlisted needs lists, got {type(batch).__name__}")
        yield from batch


unlisted = pipelinefilter(_unlisted)


def _unbatched(data: Iterable[Any]) -> Iterator[Any]:
    for sample in data:
        if isinstance(sample, list | tuple):
            for i in range(len(sample[0])):
                yield tuple(x[i] for x in sample)
        elif isinstance(sample, dict):
            lengths = {len(v) for v in sample.values()}
            if len(lengths) != 1:
                raise ValueError(f"unbatched: fields of different lengths {lengths}")
            for i in range(lengths.pop()):
                yield {k: v[i] for k, v in sample.items()}
        else:
            raise ValueError(f"unknown sample type: {type(sample)}")


unbatched = pipelinefilter(_unbatched)


def _rsample(data: Iterable[Any], p: float = 0.5) -> Iterator[Any]:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rsample: p ({p}) should be in [0, 1]")
    for sample in data:
        if random.uniform(0.0, 1.0) < p:
            yield sample


rsample = pipelinefilter(_rsample)
slice = pipelinefilter(itertools.islice)
