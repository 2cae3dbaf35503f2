"""Every module of torchdata 0.9's ``datapipes`` and ``dataloader2`` trees imports under shardpipes.

Real code imports from 0.9's submodules and patches functions in them. The reference is the
``tree`` of tests/conformance/torchdata09-surface.json (every module with the public names it
defines, parsed from 0.9's source by make_torchdata09_surface.py). Where a 0.9 stage looked a
module-level function up at call time, replacing it here changes the stage as it did in 0.9.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from unittest import mock

import pytest

from shardpipes.datapipes.iter import IterableWrapper

SURFACE = json.loads(
    (Path(__file__).parent / "conformance" / "torchdata09-surface.json").read_text()
)
TREE = SURFACE["tree"]
#: Each 0.9 package -> its submodules that were its attributes once it was imported (found from
#: 0.9's import statements by make_torchdata09_surface.py).
ATTRIBUTES = SURFACE["attributes"]


def test_the_tree_is_the_whole_of_09s():
    assert len(TREE) >= 75
    for module in (
        "torchdata.datapipes.iter.util.samplemultiplexer",
        "torchdata.datapipes.iter.util.cacheholder",
        "torchdata.datapipes.iter.util.converter",
        "torchdata.datapipes.iter.util.webdataset",
        "torchdata.datapipes.iter.transform.bucketbatcher",
        "torchdata.datapipes.iter.load.fsspec",
        "torchdata.datapipes.map.util.cacheholder",
        "torchdata.dataloader2.communication.messages",
    ):
        assert module in TREE


@pytest.mark.parametrize("module", sorted(TREE), ids=sorted(TREE))
def test_module_imports_with_its_09_names(module):
    ours = importlib.import_module("shardpipes" + module[len("torchdata") :])
    missing = [name for name in TREE[module] if not hasattr(ours, name)]
    assert missing == []


def test_the_attribute_sweep_covers_09s_packages():
    assert set(ATTRIBUTES) >= {
        "torchdata",
        "torchdata.datapipes",
        "torchdata.datapipes.iter",
        "torchdata.datapipes.iter.util",
        "torchdata.datapipes.iter.load",
        "torchdata.datapipes.iter.transform",
        "torchdata.datapipes.map.util",
        "torchdata.datapipes.utils",
        "torchdata.dataloader2",
    }
    assert "webdataset" in ATTRIBUTES["torchdata.datapipes.iter.util"]
    assert "janitor" not in ATTRIBUTES["torchdata.datapipes.utils"]  # 0.9 rebinds it: a function
    assert sum(map(len, ATTRIBUTES.values())) >= 70


_SWEEP = """
import importlib, json, sys
import shardpipes
assert "torch" not in sys.modules  # the package root stays light
wrong = []
for parent, children in json.loads(sys.argv[1]).items():
    for child in children:
        obj = shardpipes
        for part in (parent.split(".")[1:] + [child]):  # attribute by attribute, as user code reads
            obj = getattr(obj, part, None)
        name = "shardpipes" + parent[len("torchdata"):] + "." + child
        if obj is None or obj is not importlib.import_module(name):
            wrong.append(name)
print(json.dumps(wrong))
"""


def test_every_09_submodule_attribute_is_one_here_after_a_plain_import():
    # A fresh interpreter: only `import shardpipes`, then every path walked by attribute.
    run = subprocess.run(
        [sys.executable, "-c", _SWEEP, json.dumps(ATTRIBUTES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("package", sorted(ATTRIBUTES), ids=sorted(ATTRIBUTES))
def test_a_package_lists_its_09_submodules_and_nothing_else(package):
    ours = importlib.import_module("shardpipes" + package[len("torchdata") :])
    assert set(ATTRIBUTES[package]) <= set(dir(ours))
    assert not hasattr(ours, "no_such_submodule")


def test_stage_classes_at_09_paths_are_the_package_classes():
    from shardpipes.datapipes import iter as it
    from shardpipes.datapipes import map as mp
    from shardpipes.datapipes.iter.load.fsspec import FSSpecFileOpenerIterDataPipe
    from shardpipes.datapipes.iter.transform.bucketbatcher import BucketBatcherIterDataPipe
    from shardpipes.datapipes.iter.util.converter import IterToMapConverterMapDataPipe
    from shardpipes.datapipes.iter.util.samplemultiplexer import SampleMultiplexerDataPipe
    from shardpipes.datapipes.map.util.cacheholder import InMemoryCacheHolderMapDataPipe

    assert FSSpecFileOpenerIterDataPipe is it.FSSpecFileOpener
    assert BucketBatcherIterDataPipe is it.BucketBatcher
    assert SampleMultiplexerDataPipe is it.SampleMultiplexer
    assert IterToMapConverterMapDataPipe is mp.IterToMapConverter
    assert InMemoryCacheHolderMapDataPipe is mp.InMemoryCacheHolder


def test_prioritized_item_orders_by_length_only():
    from shardpipes.datapipes.iter.transform.bucketbatcher import PrioritizedItem

    assert sorted([PrioritizedItem(3, "c"), PrioritizedItem(1, {"a": 1})])[0].data == {"a": 1}


def test_09s_queue_protocol_is_refused_with_the_reason():
    from shardpipes.dataloader2.communication.messages import GetNextResponse
    from shardpipes.dataloader2.communication.protocol import IterDataPipeQueueProtocolClient

    assert GetNextResponse("v").args == ("v",)
    with pytest.raises(NotImplementedError, match="queue protocol.*MultiProcessingReadingService"):
        IterDataPipeQueueProtocolClient(None, None)


# --- functions 0.9 looked up at call time ---------------------------------------------------


def _download(folder: str, name: str) -> tuple[str, str]:
    return f"{folder}/{name}", "new"


def _cached_run(folder: str, hash_dict: dict[str, str]) -> list[str]:
    where = functools.partial(_join, folder)
    cache = IterableWrapper(["f"]).on_disk_cache(
        filepath_fn=where, hash_dict=hash_dict, hash_type="md5"
    )
    downloaded = cache.map(functools.partial(_download, folder))
    return list(downloaded.end_caching(mode="w", skip_read=True))


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}"


def test_patching_cacheholder_hash_check_changes_what_counts_as_cached(tmp_path):
    # torchtext's dataset tests patch 0.9's _hash_check to accept any cached file.
    path = tmp_path / "f"
    want = {str(path): hashlib.md5(b"new").hexdigest()}
    path.write_text("old")  # cached, but with the wrong hash
    with mock.patch(
        "shardpipes.datapipes.iter.util.cacheholder._hash_check", return_value=True
    ) as check:
        assert _cached_run(str(tmp_path), want) == [str(path)]
    assert check.call_count == 1 and path.read_text() == "old"  # accepted as it was
    assert _cached_run(str(tmp_path), want) == [str(path)]
    assert path.read_text() == "new"  # unpatched: the hash is checked, the file made again


def _tar(path: Path, names: list[str]) -> str:
    with tarfile.open(path, "w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return str(path)


def _fields(sample: dict[str, object]) -> list[str]:
    return sorted(k for k in sample if k.startswith("."))


def _split_at_last_dot(p: str) -> tuple[str, str]:
    head, _, ext = p.rpartition(".")
    return head, "." + ext


def test_replacing_webdataset_pathsplit_changes_how_members_group(tmp_path):
    # An object-centric-learning framework replaces 0.9's pathsplit so that keys may hold dots.
    from shardpipes.datapipes.iter.util import webdataset as wds09

    url = _tar(tmp_path / "a.tar", ["img.v1.png", "img.v1.json", "img.v2.png"])
    dp = IterableWrapper([url]).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    assert [(s["__key__"], _fields(s)) for s in dp] == [("img", [".v1.json", ".v1.png", ".v2.png"])]
    with mock.patch.object(wds09, "pathsplit", _split_at_last_dot):
        got = [(s["__key__"], _fields(s)) for s in dp]
    assert got == [("img.v1", [".json", ".png"]), ("img.v2", [".png"])]
    assert wds09.pathsplit("a\\b.c.d") == ("a/b", ".c.d")  # 0.9's own rule, back again


def test_a_patch_through_the_attribute_path_changes_the_stage(tmp_path, monkeypatch):
    # A Lightning data module written for 0.9: `import torchdata`, then
    # `torchdata.datapipes.iter.util.webdataset.pathsplit = patched` (issue 41).
    import shardpipes

    url = _tar(tmp_path / "a.tar", ["img.v1.png", "img.v1.json"])
    dp = IterableWrapper([url]).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    module = shardpipes.datapipes.iter.util.webdataset
    monkeypatch.setattr(module, "pathsplit", _split_at_last_dot)
    assert [s["__key__"] for s in dp] == ["img.v1"]
    monkeypatch.undo()
    assert [s["__key__"] for s in dp] == ["img"]
