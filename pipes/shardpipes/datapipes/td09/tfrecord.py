"""torchdata 0.9's ``load_from_tfrecord``, with its own reader of the ``Example`` wire format.

0.9 needed ``protobuf<3.20`` for a generated module; the few messages of ``tf.train.Example`` and
``tf.train.SequenceExample`` are decoded here directly from the protobuf wire format, so no
protobuf package is needed. Values are 0.9's: ``bytes_list`` -> list of ``bytes``,
``float_list`` -> float32 tensor, ``int64_list`` -> int64 tensor; ``spec`` reshapes and casts.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Iterable, Iterator
from typing import IO, Any, NamedTuple, cast

import torch
from torch.utils.data.datapipes.utils.common import validate_pathname_binary_tuple

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.formats.stream import binary_stream

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


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RuntimeError("Invalid tfrecord record: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field number, wire type, value)``: an int for varints, a memoryview otherwise."""
    pos = 0
    value: Any
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise RuntimeError(f"Invalid tfrecord record: unsupported wire type {wire}")
        yield number, wire, value


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: memoryview) -> Any:
    """Decode a ``Feature``: bytes_list (1), float_list (2) or int64_list (3)."""
    for number, _, body in _fields(buf):
        if number == 1:
            return [bytes(v) for n, _, v in _fields(body) if n == 1]
        if number == 2:
            floats: list[float] = []
            for n, wire, v in _fields(body):
                if n == 1 and wire == 2:
                    floats.extend(struct.unpack(f"<{len(v) // 4}f", v))
                elif n == 1:
                    floats.append(struct.unpack("<f", v)[0])
            return torch.tensor(floats, dtype=torch.float32)
        if number == 3:
            ints: list[int] = []
            for n, wire, v in _fields(body):
                if n == 1 and wire == 2:
                    pos = 0
                    while pos < len(v):
                        x, pos = _varint(v, pos)
                        ints.append(_signed64(x))
                elif n == 1:
                    ints.append(_signed64(v))
            return torch.tensor(ints, dtype=torch.int64)
    return []


def _map_entries(buf: memoryview) -> Iterator[tuple[str, memoryview]]:
    """Entries of a ``map<string, message>`` field's body list: (key, value message)."""
    for number, _, entry in _fields(buf):
        if number != 1:
            continue
        key, value = "", memoryview(b"")
        for n, _, v in _fields(entry):
            if n == 1:
                key = bytes(v).decode()
            elif n == 2:
                value = v
        yield key, value


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


def _parse_record(record: memoryview, spec: Any) -> TFRecordExample:
    """Decode a record as a ``SequenceExample`` (an ``Example`` is its context alone)."""
    context: dict[str, Any] = {}
    lists: dict[str, list[Any]] = {}
    for number, _, body in _fields(record):
        if number == 1:  # Features context / Example.features
            for key, feature in _map_entries(body):
                context[key] = _feature(feature)
        elif number == 2:  # FeatureLists
            for key, feature_list in _map_entries(body):
                lists[key] = [_feature(f) for n, _, f in _fields(feature_list) if n == 1]
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


def _records(stream: IO[bytes]) -> Iterator[memoryview]:
    """Records of a TFRecord file: length (8 bytes), CRC, data, CRC."""
    while True:
        header = stream.read(8)
        if not header:
            return
        if len(header) != 8:
            raise RuntimeError("Invalid tfrecord file: failed to read the record size.")
        if len(stream.read(4)) != 4:
            raise RuntimeError("Invalid tfrecord file: failed to read the start token.")
        (length,) = struct.unpack("<Q", header)
        data = stream.read(length)
        if len(data) != length:
            raise RuntimeError("Invalid tfrecord file: failed to read the record.")
        if len(stream.read(4)) != 4:
            raise RuntimeError("Invalid tfrecord file: failed to read the end token.")
        yield memoryview(data)


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
                for record in _records(binary_stream(stream)):
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
