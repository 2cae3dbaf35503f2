r"""TFRecord files and the protobuf wire format of ``tf.train.Example`` / ``SequenceExample``.

The few messages of ``Example`` and ``SequenceExample`` are decoded here directly from the
protobuf wire format, so no protobuf package (nor TensorFlow) is needed. A feature is a list
of ``bytes`` (``bytes_list``), a float32 array (``float_list``) or an int64 array
(``int64_list``); what a stage makes of them (tensors, shapes) is the stage's business.

Examples:
    >>> import io, struct
    >>> record = bytes([0x0A, 0x0B, 0x0A, 0x09, 0x0A, 0x01, 0x78, 0x12, 0x04, 0x1A, 0x02, 0x08, 0x00])
    >>> blob = struct.pack("<Q", len(record)) + b"\0" * 4 + record + b"\0" * 4
    >>> [parse_record(r) for r in iter_records(io.BytesIO(blob))]
    [({'x': array([0])}, {})]
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

__all__ = ["Feature", "feature", "fields", "iter_records", "map_entries", "parse_record"]

#: A decoded feature: ``bytes_list`` values, or a float32 / int64 array.
Feature = Any


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


def fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
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


def feature(buf: memoryview) -> Any:
    """Decode a ``Feature``: bytes_list (1), float_list (2) or int64_list (3)."""
    for number, _, body in fields(buf):
        if number == 1:
            return [bytes(v) for n, _, v in fields(body) if n == 1]
        if number == 2:
            floats: list[float] = []
            for n, wire, v in fields(body):
                if n == 1 and wire == 2:
                    floats.extend(struct.unpack(f"<{len(v) // 4}f", v))
                elif n == 1:
                    floats.append(struct.unpack("<f", v)[0])
            return np.array(floats, dtype=np.float32)
        if number == 3:
            ints: list[int] = []
            for n, wire, v in fields(body):
                if n == 1 and wire == 2:
                    pos = 0
                    while pos < len(v):
                        x, pos = _varint(v, pos)
                        ints.append(_signed64(x))
                elif n == 1:
                    ints.append(_signed64(v))
            return np.array(ints, dtype=np.int64)
    return []


def map_entries(buf: memoryview) -> Iterator[tuple[str, memoryview]]:
    """Entries of a ``map<string, message>`` field's body list: (key, value message)."""
    for number, _, entry in fields(buf):
        if number != 1:
            continue
        key, value = "", memoryview(b"")
        for n, _, v in fields(entry):
            if n == 1:
                key = bytes(v).decode()
            elif n == 2:
                value = v
        yield key, value


def parse_record(record: memoryview | bytes) -> tuple[dict[str, Feature], dict[str, list[Feature]]]:
    """``(context, feature lists)`` of a ``SequenceExample`` record (an ``Example`` has no lists)."""
    context: dict[str, Feature] = {}
    lists: dict[str, list[Feature]] = {}
    for number, _, body in fields(memoryview(record)):
        if number == 1:  # Features context / Example.features
            for key, value in map_entries(body):
                context[key] = feature(value)
        elif number == 2:  # FeatureLists
            for key, feature_list in map_entries(body):
                lists[key] = [feature(f) for n, _, f in fields(feature_list) if n == 1]
    return context, lists


def iter_records(stream: IO[bytes]) -> Iterator[memoryview]:
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
