"""torchdata 0.9's ``load_from_tfrecord`` over :mod:`shardpipes.formats.tfrecord`.

0.9 needed ``protobuf<3.20`` for a generated module; the records are decoded by
:mod:`shardpipes.formats.tfrecord` from the protobuf wire format, so no protobuf package is
needed. Values are 0.9's: ``bytes_list`` -> list of ``bytes``,
``float_list`` -> float32 tensor, ``int64_list`` -> int64 tensor; ``spec`` reshapes and casts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from typing import IO, Any, NamedTuple, cast

import torch
from torch.utils.data.datapipes.utils.common import validate_pathname_binary_tuple

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.formats.stream import binary_stream
from shardpipes.formats.tfrecord import iter_records, parse_record

__all__ = [
    "SequenceExampleSpec",
    "TFRecordExample",
    "TFRecordExampleSpec",
    "TFRecordLoaderIterDataPipe",
]

TFRecordFeatureSpec = tuple[tuple[int, ...], torch.dtype]
TFRecordExampleSpec = dict[str, TFRecordFeatureSpec]
TFRecordExample = dict[str, Any]


class SequenceExampleSpec(NamedTuple):
    """Specs of a ``SequenceExample``'s context and feature lists."""

    context: TFRecordExampleSpec
    feature_lists: TFRecordExampleSpec


def _reshape_list(value: Any, shape: Any) -> Any:
    flat: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, (str, bytes)):
            flat.append(v)
        else:
            for x in v:
                walk(x)

    walk(value)
    if sum(1 for x in shape if x == -1) > 1:
        raise RuntimeError("Shape can contain at most one dynamic dimension (-1).")
    known = math.prod(x for x in shape if x != -1)
    if len(flat) % max(known, 1) != 0:
        raise RuntimeError(f"Cannot reshape {len(flat)} values into shape {shape}")
    shape = [x if x != -1 else len(flat) // known for x in shape]

    def build(values: list[Any], dims: list[int]) -> Any:
        if not dims:
            return values[0]
        if len(dims) == 1:
            return values
        step = len(values) // dims[0]
        return [build(values[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]

    return build(flat, shape)


def _apply_spec(value: Any, spec: Any) -> Any:
    if spec is None:
        return value
    shape, dtype = spec
    if isinstance(dtype, torch.dtype):
        if shape is not None:
            value = value.reshape(shape)
        return value.to(dtype)
    return value if shape is None else _reshape_list(value, shape)


def _tensor(feature: Any) -> Any:
    """0.9's value of a feature: ``bytes_list`` as a list, numbers as a tensor."""
    return feature if isinstance(feature, list) else torch.from_numpy(feature)


def _parse_record(record: memoryview, spec: Any) -> TFRecordExample:
    """Decode a record as a ``SequenceExample`` (an ``Example`` is its context alone)."""
    raw_context, raw_lists = parse_record(record)
    context = {k: _tensor(v) for k, v in raw_context.items()}
    lists = {k: [_tensor(v) for v in vs] for k, vs in raw_lists.items()}
    result: TFRecordExample = {}
    for key, value in context.items():
        if spec is None or key in spec:
            result[key] = _apply_spec(value, None if spec is None else spec[key])
    for key, values in lists.items():
        if spec is not None and (key not in spec or key in result):
            continue
        if key in result:
            raise RuntimeError(
                f"TFRecord example's key {key} is contained in both the context and feature "
                "lists. This is not supported."
            )
        feature_spec = None if spec is None else spec[key]
        stacked: Any = values
        if feature_spec is not None and isinstance(feature_spec[1], torch.dtype):
            stacked = torch.stack(values, 0)
        result[key] = _apply_spec(stacked, feature_spec)
    if spec is not None and len(result) != len(spec):
        raise RuntimeError(
            f"Example is missing some required keys: {sorted(result)} != {sorted(spec)}"
        )
    return result


@register("load_from_tfrecord")
class TFRecordLoaderIterDataPipe(StageIterDataPipe[TFRecordExample]):
    """Yield each ``tf.train.Example``/``SequenceExample`` of ``(path, TFRecord stream)`` pairs as a dict (functional name: ``load_from_tfrecord``).

    Args:
        datapipe: ``(path, binary stream)`` pairs.
        spec: Feature name -> ``(shape, dtype)``; only these features are kept, reshaped and cast
            (``dtype=None`` keeps bytes lists, reshaped). Default: ``None`` (all features).
        length: Nominal length reported by ``len()``. Default: ``-1`` (none).

    Raises:
        RuntimeError: A record is truncated or malformed (a warning names the file).
    """

    def __init__(
        self,
        datapipe: Iterable[tuple[str, IO[bytes]]],
        spec: TFRecordExampleSpec | None = None,
        length: int = -1,
    ) -> None:
        self.datapipe = datapipe
        self.spec = spec
        self.length = length

    def __iter__(self) -> Iterator[TFRecordExample]:
        for pair in self.datapipe:
            validate_pathname_binary_tuple(cast(Any, pair))
            path, stream = pair
            try:
                for record in iter_records(binary_stream(stream)):
                    yield _parse_record(record, self.spec)
            except RuntimeError as exc:
                warnings.warn(
                    f"Unable to read from corrupted tfrecord stream {path} due to: {exc}, abort!",
                    stacklevel=2,
                )
                raise

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length
