"""torchdata 0.9's text and file-content stages.

``readlines``, ``parse_csv``, ``parse_csv_as_dict``, ``parse_json_files``,
``lines_to_paragraphs``, ``check_hash`` and ``save_to_disk`` read ``(path, stream)`` pairs as
``open_files`` / ``open_files_by_fsspec`` yield them, with 0.9's arguments and outputs.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper, _check_unpickable_fn

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.formats.hashes import check_hash_type, digest_of

__all__ = [
    "CSVDictParserIterDataPipe",
    "CSVParserIterDataPipe",
    "HashCheckerIterDataPipe",
    "JsonParserIterDataPipe",
    "LineReaderIterDataPipe",
    "ParagraphAggregatorIterDataPipe",
    "SaverIterDataPipe",
]


def _lines(file: IO[Any], skip_lines: int) -> Iterator[Any]:
    """Lines of ``file`` after the first ``skip_lines``; the file is closed when done."""
    if skip_lines < 0:
        raise ValueError("'skip_lines' is required to be a positive integer.")
    try:
        for i, line in enumerate(file):
            if i >= skip_lines:
                yield line
    finally:
        file.close()


class _NoLen:
    """Mixin: ``len()`` fails with Python's own words, as for 0.9's stages that had no ``__len__``."""

    def __len__(self) -> int:
        raise TypeError(f"object of type '{type(self).__name__}' has no len()")


def _decoded(lines: Iterable[Any], decode: bool, encoding: str, errors: str) -> Iterator[Any]:
    for line in lines:
        yield line.decode(encoding, errors) if decode and isinstance(line, bytes) else line


@register("readlines")
class LineReaderIterDataPipe(_NoLen, StageIterDataPipe[Any]):
    r"""Yield the lines of each ``(path, stream)`` as ``(path, line)`` (functional name: ``readlines``).

    Args:
        source_datapipe: ``(path, stream)`` pairs.
        skip_lines: Lines skipped at the top of each file. Default: ``0``.
        strip_newline: Strip ``\r`` and ``\n`` at the ends. Default: ``True``.
        decode: Decode bytes lines with ``encoding``. Default: ``False``.
        encoding: Default: ``"utf-8"``.
        errors: Decoding error policy. Default: ``"ignore"``.
        return_path: Yield ``(path, line)`` rather than ``line``. Default: ``True``.

    Example:
        >>> import io
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("f", io.StringIO("a\nb"))]).readlines())
        [('f', 'a'), ('f', 'b')]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO[Any]]],
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
    ) -> None:
        if skip_lines < 0:
            raise ValueError("'skip_lines' is required to be a positive integer.")
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.strip_newline = strip_newline
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.return_path = return_path

    def __iter__(self) -> Iterator[Any]:
        for path, file in self.source_datapipe:
            for line in _decoded(
                _lines(file, self.skip_lines), self.decode, self.encoding, self.errors
            ):
                if self.strip_newline:
                    line = line.strip("\r\n") if isinstance(line, str) else line.strip(b"\r\n")
                yield (path, line) if self.return_path else line


class _CSVBase(_NoLen, StageIterDataPipe[Any]):
    _reader: Callable[..., Iterator[Any]] = staticmethod(csv.reader)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO[Any]]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
        **fmtparams: Any,
    ) -> None:
        if skip_lines < 0:
            raise ValueError("'skip_lines' is required to be a positive integer.")
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.return_path = return_path
        self.as_tuple = as_tuple
        self.fmtparams = fmtparams

    def __iter__(self) -> Iterator[Any]:
        reader = type(self)._reader
        for path, file in self.source_datapipe:
            lines = _decoded(_lines(file, self.skip_lines), self.decode, self.encoding, self.errors)
            for row in reader(lines, **self.fmtparams):
                if self.as_tuple and isinstance(row, list):
                    row = tuple(row)
                yield (path, row) if self.return_path else row


@register("parse_csv")
class CSVParserIterDataPipe(_CSVBase):
    r"""Yield the rows of each ``(path, stream)`` CSV file as lists (functional name: ``parse_csv``).

    Args:
        source_datapipe: ``(path, stream)`` pairs.
        skip_lines: Lines skipped at the top of each file. Default: ``0``.
        decode: Decode bytes with ``encoding``. Default: ``True``.
        encoding: Default: ``"utf-8"``.
        errors: Default: ``"ignore"``.
        return_path: Yield ``(path, row)``. Default: ``False``.
        as_tuple: Rows as tuples. Default: ``False``.
        **fmtparams: Passed to ``csv.reader`` (``delimiter=``, ...).

    Example:
        >>> import io
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("f", io.StringIO("a,1\nb,2"))]).parse_csv())
        [['a', '1'], ['b', '2']]
    """


@register("parse_csv_as_dict")
class CSVDictParserIterDataPipe(_CSVBase):
    r"""Yield the rows of each ``(path, stream)`` CSV file as dicts keyed by the header (functional name: ``parse_csv_as_dict``).

    Takes the arguments of ``parse_csv`` except ``as_tuple``; ``**fmtparams`` go to
    ``csv.DictReader``.

    Example:
        >>> import io
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("f", io.StringIO("k,v\na,1"))]).parse_csv_as_dict())
        [{'k': 'a', 'v': '1'}]
    """

    _reader = staticmethod(csv.DictReader)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO[Any]]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        **fmtparams: Any,
    ) -> None:
        super().__init__(
            source_datapipe,
            skip_lines=skip_lines,
            decode=decode,
            encoding=encoding,
            errors=errors,
            return_path=return_path,
            **fmtparams,
        )


@register("parse_json_files")
class JsonParserIterDataPipe(StageIterDataPipe[tuple[str, Any]]):
    """Read each ``(path, stream)`` whole and yield ``(path, json.loads(content))`` (functional name: ``parse_json_files``).

    Args:
        source_datapipe: ``(path, stream)`` pairs.
        **kwargs: Passed to ``json.loads``.
    """

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, IO[Any]]], **kwargs: Any) -> None:
        self.source_datapipe = source_datapipe
        self.kwargs = kwargs

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for path, stream in self.source_datapipe:
            try:
                data = stream.read()
            finally:
                stream.close()
            yield path, json.loads(data, **self.kwargs)

    def __len__(self) -> int:
        return len(self.source_datapipe)


def _join_lines(lines: list[str]) -> str:
    return "\n".join(lines)


@register("lines_to_paragraphs")
class ParagraphAggregatorIterDataPipe(_NoLen, StageIterDataPipe[tuple[str, str]]):
    r"""Join consecutive non-empty ``(path, line)`` lines of a file into ``(path, paragraph)`` (functional name: ``lines_to_paragraphs``).

    Args:
        source_datapipe: ``(path, line)`` pairs, as ``readlines`` yields them.
        joiner: Joins the lines of a paragraph. Default: ``"\n".join``.

    Example:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("f", "a"), ("f", "b"), ("f", ""), ("f", "c")]).lines_to_paragraphs())
        [('f', 'a\nb'), ('f', 'c')]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        joiner: Callable[[list[Any]], Any] = _join_lines,
    ) -> None:
        _check_unpickable_fn(joiner)
        self.source_datapipe = source_datapipe
        self.joiner = joiner

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        buffer: list[Any] = []
        prev = None
        for path, line in self.source_datapipe:
            if prev is None:
                prev = path
            if line and prev == path:
                buffer.append(line)
                continue
            if buffer:
                yield prev, self.joiner(buffer)
            buffer = [line] if line else []
            prev = path
        if buffer:
            yield prev, self.joiner(buffer)  # type: ignore[misc]


@register("check_hash")
class HashCheckerIterDataPipe(StageIterDataPipe[tuple[str, Any]]):
    """Check each ``(path, data)`` against the expected hash of ``path`` and pass it on (functional name: ``check_hash``).

    Args:
        source_datapipe: ``(path, bytes or stream)`` pairs.
        hash_dict: Path -> expected hex digest.
        hash_type: ``"sha256"`` or ``"md5"``. Default: ``"sha256"``.
        rewind: Seek streams back to 0 after hashing. Default: ``True``.

    Raises:
        RuntimeError: A path has no expected hash, or the hash differs.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        hash_dict: dict[str, str],
        hash_type: str = "sha256",
        rewind: bool = True,
    ) -> None:
        check_hash_type(hash_type)
        self.source_datapipe = source_datapipe
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.rewind = rewind

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for path, data in self.source_datapipe:
            digest = digest_of(data, self.hash_type)
            if self.rewind and not isinstance(data, (str, bytes, bytearray)):
                data.seek(0)
            if path not in self.hash_dict:
                raise RuntimeError(f"Unspecified hash for file {path}")
            if digest != self.hash_dict[path]:
                raise RuntimeError(
                    f"The computed hash {digest} of {path} does not match the expected"
                    f"hash {self.hash_dict[path]}. Delete the file manually and retry."
                )
            yield path, (data if isinstance(data, (str, bytes, bytearray)) else StreamWrapper(data))

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("save_to_disk")
class SaverIterDataPipe(StageIterDataPipe[str]):
    """Write each ``(path, data)`` to a local file and yield the file's path (functional name: ``save_to_disk``).

    Args:
        source_datapipe: ``(path, data)`` pairs.
        mode: Open mode (``"w"`` is added if missing). Default: ``"w"``.
        filepath_fn: Maps ``path`` to the file written. Default: ``None`` (``path``).
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], str] | None = None,
    ) -> None:
        if filepath_fn is not None:
            _check_unpickable_fn(filepath_fn)
        self.source_datapipe = source_datapipe
        self.mode = mode if "w" in mode else "w" + mode
        self.fn = filepath_fn

    def __iter__(self) -> Iterator[str]:
        for path, data in self.source_datapipe:
            filepath = path if self.fn is None else self.fn(path)
            dirname = os.path.dirname(filepath)
            if dirname:
                os.makedirs(dirname, exist_ok=True)
            with open(filepath, self.mode) as f:
                f.write(data)
            yield filepath

    def __len__(self) -> int:
        return len(self.source_datapipe)
