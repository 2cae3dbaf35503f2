"""torchdata 0.9's iopath stages: list, open and save through an ``iopath`` ``PathManager``.

A 0.9 user with detectron2 or fvcore has iopath installed; with it these stages work as they did
in 0.9 (a default ``PathManager`` with iopath's HTTP, OneDrive and, where iopath has it, S3
handlers, or the ``pathmgr`` passed in, plus any ``handler`` registered on it). Without iopath
they fail at construction with what to install and the fsspec stages that read the same paths.
iopath is unmaintained: new code should use ``list_files_by_fsspec``/``open_files_by_fsspec``/
``save_by_fsspec``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.utils.common import StreamWrapper, match_masks

from shardpipes.datapipes.iter.base import StageIterDataPipe, check_picklable_fn, register

__all__ = [
    "IoPathFileListerIterDataPipe",
    "IoPathFileOpenerIterDataPipe",
    "IoPathSaverIterDataPipe",
]

T = TypeVar("T")

_MISSING = (
    "{name} needs iopath: pip install iopath. (iopath is unmaintained; FSSpecFileLister, "
    "FSSpecFileOpener and FSSpecSaver (list_files_by_fsspec, open_files_by_fsspec, "
    "save_by_fsspec) take the same local and remote paths.)"
)


def _path_manager(name: str, pathmgr: Any, handler: Any) -> Any:
    """``pathmgr``, or iopath's default one, with ``handler`` registered (0.9's set-up)."""
    try:
        file_io = importlib.import_module("iopath.common.file_io")
    except ImportError as exc:
        raise ModuleNotFoundError(_MISSING.format(name=name)) from exc
    if pathmgr is None:
        pathmgr = file_io.PathManager()
        pathmgr.register_handler(file_io.HTTPURLHandler(), allow_override=True)
        pathmgr.register_handler(file_io.OneDrivePathHandler(), allow_override=True)
        try:  # iopath >= 0.1.9
            s3 = importlib.import_module("iopath.common.s3")
            pathmgr.register_handler(s3.S3PathHandler(), allow_override=True)
        except ImportError:
            pass
    if handler is not None:
        pathmgr.register_handler(handler, allow_override=True)
    return pathmgr


class _IoPathStage(StageIterDataPipe[T]):
    """Base of the iopath stages: a ``pathmgr`` that more path handlers can be registered on."""

    pathmgr: Any

    def register_handler(self, handler: Any, allow_override: bool = False) -> None:
        """Register an iopath path handler on the path manager."""
        self.pathmgr.register_handler(handler, allow_override=allow_override)


@register("list_files_by_iopath")
class IoPathFileListerIterDataPipe(_IoPathStage[str]):
    """List the files under roots through iopath (functional name: ``list_files_by_iopath``).

    Args:
        root: A path or URL, a list of them, or a DataPipe of them. A file is yielded as it is;
            a directory's entries matching ``masks`` are yielded joined to it.
        masks: Unix-style pattern(s) the names must match. Default: ``""`` (all).
        pathmgr: An ``iopath`` ``PathManager``. Default: iopath's with its HTTP, OneDrive and S3
            handlers.
        handler: An iopath path handler to register on it.

    Raises:
        ModuleNotFoundError: iopath is not installed.
    """

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe[str],
        masks: str | list[str] = "",
        *,
        pathmgr: Any = None,
        handler: Any = None,
    ) -> None:
        self.pathmgr = _path_manager("IoPathFileLister", pathmgr, handler)
        if isinstance(root, str):
            root = [root]
        self.datapipe: Iterable[str] = (
            root if isinstance(root, IterDataPipe) else IterableWrapper(list(root))
        )
        self.masks = masks

    def __iter__(self) -> Iterator[str]:
        for path in self.datapipe:
            if self.pathmgr.isfile(path):
                yield path
                continue
            for name in self.pathmgr.ls(path):
                if match_masks(name, self.masks):
                    yield os.path.join(path, name)


@register("open_files_by_iopath")
class IoPathFileOpenerIterDataPipe(_IoPathStage[tuple[str, StreamWrapper]]):
    """Open paths or URLs through iopath, as ``(path, stream)`` (functional name: ``open_files_by_iopath``).

    Args:
        source_datapipe: Paths or URLs.
        mode: The mode to open in. Default: ``"r"`` (text), as in 0.9.
        pathmgr: An ``iopath`` ``PathManager``. Default: iopath's, as for the lister.
        handler: An iopath path handler to register on it.

    Raises:
        ModuleNotFoundError: iopath is not installed.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        mode: str = "r",
        pathmgr: Any = None,
        handler: Any = None,
    ) -> None:
        self.pathmgr = _path_manager("IoPathFileOpener", pathmgr, handler)
        self.source_datapipe = source_datapipe
        self.mode = mode

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        for uri in self.source_datapipe:
            yield uri, StreamWrapper(self.pathmgr.open(uri, self.mode))

    def __len__(self) -> int:
        return len(self.source_datapipe)


@register("save_by_iopath")
class IoPathSaverIterDataPipe(_IoPathStage[str]):
    """Write ``(metadata, data)`` pairs through iopath and yield the paths (functional name: ``save_by_iopath``).

    Args:
        source_datapipe: ``(metadata, data)`` pairs.
        mode: The mode to open each file in. Default: ``"w"``.
        filepath_fn: Metadata -> path or URL; default: the metadata is the path.
        pathmgr: An ``iopath`` ``PathManager``. Default: iopath's, as for the lister.
        handler: An iopath path handler to register on it.

    Raises:
        ModuleNotFoundError: iopath is not installed.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], str] | None = None,
        *,
        pathmgr: Any = None,
        handler: Any = None,
    ) -> None:
        self.pathmgr = _path_manager("IoPathSaver", pathmgr, handler)
        if filepath_fn is not None:
            check_picklable_fn(filepath_fn, "filepath_fn")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn

    def __iter__(self) -> Iterator[str]:
        for meta, data in self.source_datapipe:
            path = self.filepath_fn(meta) if self.filepath_fn is not None else meta
            with self.pathmgr.open(path, self.mode) as f:
                f.write(data)
            yield path

    def __len__(self) -> int:
        return len(self.source_datapipe)
