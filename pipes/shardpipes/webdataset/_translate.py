"""webdataset's stage functions translated to core stages: ``wds.shuffle(1000)`` -> :class:`Shuffle`, ...

:func:`core_stage` takes a stage as a webdataset pipeline holds it (a curried stage function,
``FilterFunction(f, *args, **kw)``, or a ``detshuffle``) and returns the core stage over a
DataPipe that does the same, with the same arguments; ``None`` for the stages that stay opaque.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.webdataset import filters, keyfilters
from shardpipes.webdataset._stages import (
    Batcher,
    Collate,
    Decode,
    PassingFilter,
    RandomSample,
    SampleMap,
    Select,
    Shuffle,
)
from shardpipes.webdataset.handlers import reraise_exception

__all__ = ["core_stage"]


def _shuffle(
    dp: IterDataPipe[Any],
    bufsize: int = 1000,
    initial: int = 100,
    rng: Any = None,
    seed: Any = None,
    handler: Any = None,
) -> IterDataPipe[Any]:
    return Shuffle(dp, bufsize, initial, seed, rng=rng)


def _map(
    dp: IterDataPipe[Any], f: Callable[[Any], Any], handler: Any = reraise_exception
) -> IterDataPipe[Any]:
    return SampleMap(dp, f, handler, drop_none=True, keep_key=True)


def _decode(
    dp: IterDataPipe[Any], *args: Any, handler: Any = reraise_exception, **kw: Any
) -> IterDataPipe[Any]:
    return Decode(dp, filters.make_decoder(*args, **kw), handler)


def _to_tuple(
    dp: IterDataPipe[Any],
    *args: Any,
    handler: Any = reraise_exception,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
) -> IterDataPipe[Any]:
    fn = filters.ToTuple(args, missing_is_error, none_is_error)
    return SampleMap(dp, fn, handler, name="to_tuple")


def _map_dict(
    dp: IterDataPipe[Any], handler: Any = reraise_exception, **kw: Any
) -> IterDataPipe[Any]:
    return SampleMap(dp, filters.MapDict(kw), handler, name="map_dict")


def _map_tuple(
    dp: IterDataPipe[Any], *args: Any, handler: Any = reraise_exception
) -> IterDataPipe[Any]:
    return SampleMap(dp, filters.MapTuple(args), handler, name="map_tuple")


def _rename(
    dp: IterDataPipe[Any], handler: Any = reraise_exception, keep: bool = True, **kw: Any
) -> IterDataPipe[Any]:
    return SampleMap(dp, filters.Renamer(keep, kw), handler, name="rename")


def _batched(
    dp: IterDataPipe[Any],
    batchsize: int = 20,
    collation_fn: Any = filters.default_collation_fn,
    partial: bool = True,
) -> IterDataPipe[Any]:
    batches = Batcher(dp, batchsize, partial)
    return batches if collation_fn is None else Collate(batches, collation_fn)


def _extract_keys(
    dp: IterDataPipe[Any],
    *patterns: Any,
    duplicate_is_error: bool = True,
    ignore_missing: bool = False,
) -> IterDataPipe[Any]:
    fn = keyfilters.ExtractKeys(patterns, duplicate_is_error, ignore_missing)
    return SampleMap(dp, fn, name="extract_keys")


def _rename_keys(
    dp: IterDataPipe[Any],
    *args: Any,
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: Any,
) -> IterDataPipe[Any]:
    fn = keyfilters.RenameKeys(args, kw, keep_unselected, must_match, duplicate_is_error)
    return SampleMap(dp, fn, name="rename_keys")


def _xdecode(
    dp: IterDataPipe[Any],
    *args: Any,
    must_decode: bool = True,
    defaults: Any = keyfilters.default_decoders,
    **kw: Any,
) -> IterDataPipe[Any]:
    return SampleMap(dp, keyfilters.XDecode(args, kw, must_decode, defaults), name="xdecode")


def _info(dp: IterDataPipe[Any], *args: Any, **kw: Any) -> IterDataPipe[Any]:
    return PassingFilter(dp, filters.FilterFunction(filters._info, *args, **kw))


# webdataset's stage functions -> the core stage that does the same (same arguments, a
# DataPipe in place of the iterator). The others run as opaque FilterStages.
_CORE: dict[Callable[..., Any], Callable[..., IterDataPipe[Any]]] = {
    filters._shuffle: _shuffle,
    filters._map: _map,
    filters._decode: _decode,
    filters._to_tuple: _to_tuple,
    filters._map_dict: _map_dict,
    filters._map_tuple: _map_tuple,
    filters._rename: _rename,
    filters._batched: _batched,
    filters._select: Select,
    filters._rsample: RandomSample,
    filters._info: _info,
    keyfilters._extract_keys: _extract_keys,
    keyfilters._rename_keys: _rename_keys,
    keyfilters._xdecode: _xdecode,
}


def core_stage(dp: IterDataPipe[Any], stage: Any) -> IterDataPipe[Any] | None:
    """``stage`` (a webdataset stage function with its arguments) as a core stage over ``dp``, or ``None``."""
    if isinstance(stage, filters.detshuffle):
        return Shuffle(
            dp, stage.bufsize, stage.initial, stage.seed, epoch_seeded=True, counter=stage
        )
    if isinstance(stage, filters.FilterFunction) and stage.f in _CORE:
        return _CORE[stage.f](dp, *stage.args, **stage.kw)
    return None
