"""torchdata 0.9's ``datapipes.iter.util.plain_text_reader`` module path, for code that imports or patches it."""

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from shardpipes.datapipes.iter import (
    CSVDictParser as CSVDictParserIterDataPipe,
)
from shardpipes.datapipes.iter import (
    CSVParser as CSVParserIterDataPipe,
)
from shardpipes.datapipes.iter import (
    LineReader as LineReaderIterDataPipe,
)

D = TypeVar("D")


class PlainTextReaderHelper:
    """0.9's line-reading options as one object: skip, strip, decode, and how to return a line."""

    def __init__(
        self,
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
    ) -> None:
        if skip_lines < 0:
            raise ValueError(f"skip_lines ({skip_lines}) must be >= 0")
        self._skip_lines = skip_lines
        self._strip_newline = strip_newline
        self._decode = decode
        self._encoding = encoding
        self._errors = errors
        self._return_path = return_path
        self._as_tuple = as_tuple

    def skip_lines(self, file: Iterable[Any]) -> Iterator[Any]:
        """The lines of ``file`` after the first ``skip_lines``."""
        return itertools.islice(iter(file), self._skip_lines, None)

    def strip_newline(self, stream: Iterable[Any]) -> Iterator[Any]:
        r"""Each line without its trailing ``\\r\\n``/``\\n`` (when ``strip_newline``)."""
        for line in stream:
            if self._strip_newline:
                line = line.rstrip("\r\n") if isinstance(line, str) else line.rstrip(b"\r\n")
            yield line

    def decode(self, stream: Iterable[Any]) -> Iterator[Any]:
        """Each line as ``str`` (when ``decode``)."""
        for line in stream:
            if self._decode and isinstance(line, bytes | bytearray):
                yield line.decode(self._encoding, self._errors)
            else:
                yield line

    def return_path(self, stream: Iterable[Any], *, path: str) -> Iterator[Any]:
        """Each item, paired with ``path`` (when ``return_path``)."""
        for item in stream:
            yield (path, item) if self._return_path else item

    def as_tuple(self, stream: Iterable[Any]) -> Iterator[Any]:
        """Each list item as a tuple (when ``as_tuple``)."""
        for item in stream:
            yield tuple(item) if self._as_tuple and isinstance(item, list) else item


Str_Or_Bytes = str | bytes

__all__ = [
    "CSVDictParserIterDataPipe",
    "CSVParserIterDataPipe",
    "D",
    "LineReaderIterDataPipe",
    "PlainTextReaderHelper",
    "Str_Or_Bytes",
]
