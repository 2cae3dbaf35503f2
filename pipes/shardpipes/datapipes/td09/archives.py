"""torchdata 0.9's archive and compressed-file stages other than tar.

``load_from_zip``, ``load_from_xz``, ``load_from_bz2``, ``decompress`` and ``extract`` take
``(path, stream)`` pairs and yield ``(path, stream)`` pairs wrapped in torch's ``StreamWrapper``,
as 0.9 did; ``load_from_rar`` keeps 0.9's arguments and explains at construction why RAR is not
read.
"""

from __future__ import annotations

import os
import pathlib
import tarfile
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import IO, Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper, validate_pathname_binary_tuple

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.formats.compression import decompress_stream
from shardpipes.formats.stream import binary_stream

__all__ = [
    "Bz2FileLoaderIterDataPipe",
    "CompressionType",
    "DecompressorIterDataPipe",
    "ExtractorIterDataPipe",
    "RarArchiveLoaderIterDataPipe",
    "XzFileLoaderIterDataPipe",
    "ZipArchiveLoaderIterDataPipe",
]


def _parent(stream: Any) -> StreamWrapper:
    """Torch's ``StreamWrapper(child, parent)`` wants the parent wrapped too."""
    return stream if isinstance(stream, StreamWrapper) else StreamWrapper(stream)


def _autoclose(stream: Any) -> None:
    if isinstance(stream, StreamWrapper):
        stream.autoclose()


class _NominalLength(StageIterDataPipe[tuple[str, Any]]):
    def __init__(self, datapipe: Iterable[tuple[str, Any]], length: int = -1) -> None:
        self.datapipe = datapipe
        self.length = length

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


@register("load_from_zip")
class ZipArchiveLoaderIterDataPipe(_NominalLength):
    """Yield ``(path/member, stream)`` for each file in each ``(path, zip stream)`` (functional name: ``load_from_zip``).

    Args:
        datapipe: ``(path, binary stream)`` pairs.
        length: Nominal length reported by ``len()``. Default: ``-1`` (none).
    """

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for pair in self.datapipe:
            validate_pathname_binary_tuple(pair)
            path, stream = pair
            try:
                archive = zipfile.ZipFile(binary_stream(stream))
                for info in archive.infolist():
                    if info.is_dir():
                        continue
                    inner = os.path.normpath(os.path.join(path, info.filename))
                    yield inner, StreamWrapper(archive.open(info), _parent(stream), name=inner)
            except Exception as exc:
                warnings.warn(
                    f"Unable to extract files from corrupted zipfile stream {path} due to: {exc}, abort!",
                    stacklevel=2,
                )
                raise
            finally:
                _autoclose(stream)


def _drop_suffix(path: str, suffix: str) -> str:
    return path[: -len(suffix)] if path.endswith(suffix) else path


def _decompressed(
    pairs: Iterable[tuple[str, Any]], suffix: str, codec: str, what: str
) -> Iterator[tuple[str, Any]]:
    """``(path without suffix, decompressing stream)`` for each ``(path, stream)`` pair."""
    for pair in pairs:
        validate_pathname_binary_tuple(pair)
        path, stream = pair
        try:
            yield (
                _drop_suffix(path, suffix),
                StreamWrapper(
                    decompress_stream(codec, binary_stream(stream)), _parent(stream), name=path
                ),
            )
        except Exception as exc:
            warnings.warn(
                f"Unable to extract files from corrupted {what} stream {path} due to: {exc}, abort!",
                stacklevel=3,
            )
            raise
        finally:
            _autoclose(stream)


@register("load_from_xz")
class XzFileLoaderIterDataPipe(_NominalLength):
    """Yield ``(path without .xz, decompressed stream)`` for each ``(path, xz stream)`` (functional name: ``load_from_xz``).

    Args:
        datapipe: ``(path, binary stream)`` pairs.
        length: Nominal length reported by ``len()``. Default: ``-1`` (none).
    """

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return _decompressed(self.datapipe, ".xz", "xz", "xz/lzma")


@register("load_from_bz2")
class Bz2FileLoaderIterDataPipe(_NominalLength):
    """Yield ``(path without .bz2, decompressed stream)`` for each ``(path, bz2 stream)`` (functional name: ``load_from_bz2``).

    Args:
        datapipe: ``(path, binary stream)`` pairs.
        length: Nominal length reported by ``len()``. Default: ``-1`` (none).
    """

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return _decompressed(self.datapipe, ".bz2", "bzip2", "bzip2")


class CompressionType(Enum):
    """Formats ``decompress`` understands."""

    GZIP = "gzip"
    LZMA = "lzma"
    TAR = "tar"
    ZIP = "zip"
    BZIP2 = "bz2"


_CODEC = {CompressionType.GZIP: "gzip", CompressionType.LZMA: "xz", CompressionType.BZIP2: "bzip2"}


def _open_compressed(kind: CompressionType, file: IO[bytes]) -> Any:
    if kind is CompressionType.TAR:
        return tarfile.open(fileobj=file, mode="r:*")
    if kind is CompressionType.ZIP:
        return zipfile.ZipFile(file=file)
    return decompress_stream(_CODEC[kind], file)


_BY_SUFFIX = {
    ".tar": CompressionType.TAR,
    ".xz": CompressionType.LZMA,
    ".gz": CompressionType.GZIP,
    ".zip": CompressionType.ZIP,
    ".bz2": CompressionType.BZIP2,
}


@register("decompress")
class DecompressorIterDataPipe(IterDataPipe[tuple[str, Any]]):
    """Open each ``(path, stream)`` with the decompressor its extension (or ``file_type``) names (functional name: ``decompress``).

    Args:
        source_datapipe: ``(path, binary stream)`` pairs.
        file_type: ``"gzip"``, ``"lzma"``, ``"tar"``, ``"zip"``, ``"bz2"`` or a
            ``CompressionType``. Default: ``None`` (from the extension).

    Raises:
        RuntimeError: The extension is not one of ``.tar``, ``.tar.gz``, ``.tar.xz``, ``.xz``,
            ``.gz``, ``.zip``, ``.bz2``.
    """

    types = CompressionType

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        file_type: str | CompressionType | None = None,
    ) -> None:
        if isinstance(file_type, str):
            try:
                file_type = CompressionType(file_type.lower())
            except ValueError:
                names = [t.value for t in CompressionType]
                raise ValueError(
                    f"file_type {file_type!r} is not a valid CompressionType; must be one of {names}"
                ) from None
        self.source_datapipe = source_datapipe
        self.file_type = file_type

    def _detect(self, path: str) -> CompressionType:
        if self.file_type:
            return self.file_type
        if "".join(pathlib.Path(path).suffixes) in (".tar.gz", ".tar.xz"):
            return CompressionType.TAR
        ext = os.path.splitext(path)[1]
        if ext not in _BY_SUFFIX:
            raise RuntimeError(
                f"File at {path} has file extension {ext}, which does not match what are supported "
                f"by ExtractorIterDataPipe ({', '.join(_BY_SUFFIX)}, .tar.gz, .tar.xz)."
            )
        return _BY_SUFFIX[ext]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for path, file in self.source_datapipe:
            try:
                yield (
                    path,
                    StreamWrapper(
                        _open_compressed(self._detect(path), binary_stream(file)),
                        _parent(file),
                        name=path,
                    ),
                )
            finally:
                _autoclose(file)


@register("extract")
class ExtractorIterDataPipe(IterDataPipe[tuple[str, Any]]):
    """The same as ``decompress`` (functional name: ``extract``)."""

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        file_type: str | CompressionType | None = None,
    ) -> DecompressorIterDataPipe:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        return DecompressorIterDataPipe(source_datapipe, file_type)


@register("load_from_rar")
class RarArchiveLoaderIterDataPipe(StageIterDataPipe[tuple[str, Any]]):
    """RAR archives: not read by shardpipes (functional name: ``load_from_rar``).

    torchdata 0.9 read RAR through ``rarfile``, which needs the proprietary ``unrar`` program and
    patched ``rarfile`` internals to stream. Construction fails with the alternative: convert
    the archives once (``unrar x data.rar && zip -r data.zip data`` or ``tar cf``), then use
    ``load_from_zip`` or ``load_from_tar``.

    Raises:
        NotImplementedError: Always, naming the alternative.
    """

    def __init__(self, datapipe: IterDataPipe[tuple[str, Any]], *, length: int = -1) -> None:
        raise NotImplementedError(
            "load_from_rar / RarArchiveLoader is not provided by shardpipes: reading RAR needs the "
            "proprietary unrar program. Convert the archives once (unrar x data.rar, then zip or "
            "tar the files) and use load_from_zip (ZipArchiveLoader) or load_from_tar "
            "(TarArchiveLoader)."
        )
