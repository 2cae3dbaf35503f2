"""torchdata 0.9's ``datapipes.iter.util.tfrecordloader`` module path, for code that imports or patches it."""

from collections.abc import Iterator
from typing import IO, Any

import torch

from shardpipes.datapipes.iter import TFRecordLoader as TFRecordLoaderIterDataPipe
from shardpipes.datapipes.td09.tfrecord import (
    SequenceExampleSpec,
    TFRecordExample,
    TFRecordExampleSpec,
    TFRecordFeatureSpec,
)
from shardpipes.formats.tfrecord import iter_records

TFRecordBinaryData = str | list[str] | list[list[str]] | list[list[list[Any]]]
TFRecordExampleFeature = torch.Tensor | list[torch.Tensor] | TFRecordBinaryData
U = bytes | bytearray | str


def iterate_tfrecord_file(data: IO[bytes]) -> Iterator[memoryview]:
    """The records of a TFRecord stream, each as a ``memoryview`` (0.9's helper)."""
    return iter_records(data)


def parse_tfrecord_sequence_example(example: Any, spec: Any) -> Any:
    """0.9 parsed protobuf objects here; shardpipes parses TFRecords without protobuf."""
    raise NotImplementedError(_NO_PROTOBUF)


def process_feature(feature: Any) -> Any:
    """0.9 converted a protobuf ``Feature`` here; shardpipes parses TFRecords without protobuf."""
    raise NotImplementedError(_NO_PROTOBUF)


_NO_PROTOBUF = (
    "shardpipes reads TFRecords without protobuf objects: TFRecordLoader (load_from_tfrecord) "
    "yields the parsed examples"
)


__all__ = [
    "SequenceExampleSpec",
    "TFRecordBinaryData",
    "TFRecordExample",
    "TFRecordExampleFeature",
    "TFRecordExampleSpec",
    "TFRecordFeatureSpec",
    "TFRecordLoaderIterDataPipe",
    "U",
    "iterate_tfrecord_file",
    "parse_tfrecord_sequence_example",
    "process_feature",
]
