"""torchdata 0.9's iopath stages work through iopath where it is installed, and say what to do where not."""

from __future__ import annotations

import functools
import os
import sys

import pytest

from shardpipes.datapipes.iter import (
    IoPathFileLister,
    IoPathFileOpener,
    IoPathSaver,
    IterableWrapper,
)

iopath = pytest.importorskip("iopath")  # in the conformance extra, which CI installs


def _write(folder: str, names: list[str]) -> list[str]:
    paths = []
    for name in names:
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(f"data of {name}")
        paths.append(path)
    return paths


def _into(folder: str, name: str) -> str:
    return os.path.join(folder, name)


def test_list_open_and_save_through_iopath(tmp_path):
    folder = str(tmp_path)
    paths = _write(folder, ["a.txt", "b.txt", "c.csv"])
    assert sorted(IoPathFileLister(folder, masks="*.txt")) == paths[:2]
    assert list(IterableWrapper([paths[2]]).list_files_by_iopath()) == [paths[2]]  # a file
    opened = IoPathFileLister(folder, "*.txt").open_files_by_iopath(mode="r")
    assert sorted((os.path.basename(p), s.read()) for p, s in opened) == [
        ("a.txt", "data of a.txt"),
        ("b.txt", "data of b.txt"),
    ]
    out = tmp_path / "out"
    out.mkdir()
    saver = IterableWrapper([("x.bin", b"X"), ("y.bin", b"YY")]).save_by_iopath(
        mode="wb", filepath_fn=functools.partial(_into, str(out))
    )
    assert len(saver) == 2
    assert list(saver) == [str(out / "x.bin"), str(out / "y.bin")]
    assert (out / "y.bin").read_bytes() == b"YY"


def test_a_custom_path_manager_and_handler_are_used(tmp_path):
    from iopath.common.file_io import PathManager

    pathmgr = PathManager()
    [path] = _write(str(tmp_path), ["a.txt"])
    dp = IoPathFileOpener(IterableWrapper([path]), mode="rb", pathmgr=pathmgr)
    assert dp.pathmgr is pathmgr
    assert [s.read() for _, s in dp] == [b"data of a.txt"]


@pytest.mark.parametrize(
    "build",
    [
        lambda: IoPathFileLister("."),
        lambda: IoPathFileOpener(IterableWrapper([])),
        lambda: IoPathSaver(IterableWrapper([])),
    ],
    ids=["lister", "opener", "saver"],
)
def test_without_iopath_the_error_names_the_install_and_the_alternative(monkeypatch, build):
    monkeypatch.setitem(sys.modules, "iopath.common.file_io", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install iopath.*FSSpecFileOpener"):
        build()


def _prefixed_handler(root: str, prefix: str):
    """An iopath handler that maps ``prefix://name`` to ``root/name`` on the local disk."""
    from iopath.common.file_io import PathHandler

    class Prefixed(PathHandler):
        def _get_supported_prefixes(self):
            return [prefix]

        def _open(self, path, mode="r", buffering=-1, **kwargs):
            return open(os.path.join(root, path[len(prefix) :]), mode)

    return Prefixed()


@pytest.mark.parametrize("kind", ["lister", "opener", "saver"])
def test_register_handler_adds_a_handler_the_stage_then_uses(tmp_path, kind):
    from iopath.common.file_io import PathManager

    _write(str(tmp_path), ["a.txt"])
    stages = {
        "lister": lambda m: IoPathFileLister(".", pathmgr=m),
        "opener": lambda m: IoPathFileOpener(IterableWrapper(["dup://a.txt"]), pathmgr=m),
        "saver": lambda m: IoPathSaver(IterableWrapper([("dup://b.txt", "B")]), pathmgr=m),
    }
    dp = stages[kind](PathManager())
    dp.register_handler(_prefixed_handler(str(tmp_path), "dup://"))
    with dp.pathmgr.open("dup://a.txt") as f:  # the stage's path manager has the handler now
        assert f.read() == "data of a.txt"
    if kind == "opener":
        assert [(p, s.read()) for p, s in dp] == [("dup://a.txt", "data of a.txt")]
    if kind == "saver":
        assert list(dp) == ["dup://b.txt"]
        assert (tmp_path / "b.txt").read_text() == "B"
