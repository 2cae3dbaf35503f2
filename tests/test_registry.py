"""Functional names: each one DESIGN.md promises is registered once, and importing is idempotent."""

from __future__ import annotations

import ast
import functools
import inspect
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from torch.utils.data import IterDataPipe

import shardpipes
import shardpipes.datapipes.iter as stages
from shardpipes.datapipes.iter._unhooked import torch_kind

DESIGN_NAMES = [
    "list_files_by_fsspec", "open_files_by_fsspec", "save_by_fsspec", "load_from_tar", "webdataset",
    "decode", "shard_expand", "fixed_length", "set_length", "header", "cycle", "prefetch", "fullsync",
    "in_batch_shuffle", "pin_memory", "threadpool_map", "on_disk_cache",
]  # fmt: skip

TORCH_NAMES = ["map", "filter", "batch", "unbatch", "shuffle", "sharding_filter", "collate", "zip", "concat", "mux", "fork", "demux", "groupby"]  # fmt: skip

PACKAGE_DIR = os.path.dirname(shardpipes.__file__)


def owner(name: str) -> type:
    fn = IterDataPipe.functions[name]
    assert isinstance(fn, functools.partial)
    return fn.args[0]


def register_calls() -> Counter[str]:
    """How many times each name is passed to ``register(...)``/``functional_datapipe(...)`` in our source."""
    names: Counter[str] = Counter()
    for folder, _, files in os.walk(PACKAGE_DIR):
        for file in files:
            if not file.endswith(".py"):
                continue
            with open(os.path.join(folder, file), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                for deco in node.decorator_list:
                    if (
                        isinstance(deco, ast.Call)
                        and getattr(deco.func, "id", getattr(deco.func, "attr", None))
                        in ("register", "functional_datapipe")
                        and deco.args
                        and isinstance(deco.args[0], ast.Constant)
                    ):
                        names[deco.args[0].value] += 1
    return names


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_design_name_is_registered_by_shardpipes(name):
    assert name in IterDataPipe.functions
    cls = owner(name)
    # A core stage, or the torchdata 0.9 adapter's subclass that widens it with 0.9's arguments
    core = next(k for k in cls.__mro__ if not k.__module__.startswith("shardpipes.datapipes.td09."))
    assert core.__module__.startswith("shardpipes.datapipes.iter.")
    assert callable(getattr(stages.IterableWrapper([]), name))  # a method of every IterDataPipe


def test_every_name_is_declared_exactly_once_in_the_source():
    calls = register_calls()
    ours = {
        name
        for name in IterDataPipe.functions
        if owner(name).__module__.startswith("shardpipes")
        and torch_kind(owner(name)) is owner(name)
    }
    assert set(DESIGN_NAMES) <= ours
    assert {name: calls[name] for name in ours} == dict.fromkeys(ours, 1)
    assert not set(calls) & set(TORCH_NAMES)  # torch core's names are not registered again


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_docstring_states_the_functional_name(name):
    summary = (inspect.getdoc(owner(name)) or "").split("\n\n", 1)[0]
    assert summary.endswith(f"(functional name: ``{name}``).")
    assert summary.count("functional name") == 1


def test_torch_core_names_are_still_torchs():
    # shuffle, map and filter build torch's classes without the per-element hook (_unhooked.py)
    for name in TORCH_NAMES:
        assert torch_kind(owner(name)).__module__.startswith("torch.utils.data"), name
    assert {n for n in TORCH_NAMES if torch_kind(owner(n)) is not owner(n)} == {
        "shuffle",
        "map",
        "filter",
    }


def test_import_line_offers_the_torchdata_names():
    from shardpipes.datapipes.iter import (  # noqa: F401 - the import line is the test
        Batcher,
        Cycler,
        Decoder,
        Filter,
        FixedLength,
        FSSpecFileLister,
        FSSpecFileOpener,
        FSSpecSaver,
        Header,
        InBatchShuffler,
        IterableWrapper,
        LengthSetter,
        Mapper,
        Prefetcher,
        ShardExpander,
        ShardingFilter,
        Shuffler,
        TarArchiveLoader,
        ThreadPoolMapper,
        UnBatcher,
        WebDataset,
    )

    assert (FSSpecFileLister, TarArchiveLoader, WebDataset, Decoder) == tuple(
        owner(n) for n in ("list_files_by_fsspec", "load_from_tar", "webdataset", "decode")
    )
    assert (Header, LengthSetter, Cycler, FixedLength) == tuple(
        owner(n) for n in ("header", "set_length", "cycle", "fixed_length")
    )
    assert (Prefetcher, InBatchShuffler, ThreadPoolMapper) == tuple(
        owner(n) for n in ("prefetch", "in_batch_shuffle", "threadpool_map")
    )
    # torch's classes; map, filter and shuffle build their unhooked subclasses (_unhooked.py)
    assert (Batcher, Mapper, Filter, ShardingFilter, Shuffler, UnBatcher) == tuple(
        torch_kind(owner(n))
        for n in ("batch", "map", "filter", "sharding_filter", "shuffle", "unbatch")
    )


def test_all_names_exist():
    missing = [n for n in stages.__all__ if not hasattr(stages, n)]
    assert missing == []


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-W",
            "error::shardpipes.errors.ShardpipesWarning",
            "-c",
            textwrap.dedent(code),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


DESIGN_LIST = repr(DESIGN_NAMES)


def test_importing_twice_in_a_fresh_process():
    proc = _run(
        f"""
        import sys
        import shardpipes, shardpipes.datapipes.iter, shardpipes.dataloader2
        from torch.utils.data import IterDataPipe
        first = {{n: IterDataPipe.functions[n].args[0] for n in {DESIGN_LIST}}}
        for mod in [m for m in sys.modules if m == "shardpipes" or m.startswith("shardpipes.")]:
            del sys.modules[mod]
        import shardpipes, shardpipes.datapipes.iter, shardpipes.dataloader2
        second = {{n: IterDataPipe.functions[n].args[0] for n in {DESIGN_LIST}}}
        assert all(second[n] is not first[n] for n in second), "the new classes were not registered"
        from shardpipes.datapipes.iter import IterableWrapper
        assert type(IterableWrapper([1]).header(1)) is second["header"]
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_reloading_the_stage_modules():
    proc = _run(
        f"""
        import importlib, pkgutil
        import shardpipes.datapipes.iter as stages
        from torch.utils.data import IterDataPipe
        modules = [importlib.import_module(f"shardpipes.datapipes.iter.{{m.name}}")
                   for m in pkgutil.iter_modules(stages.__path__)]
        for module in modules:
            importlib.reload(module)
        importlib.reload(stages)
        for name in {DESIGN_LIST}:
            cls = IterDataPipe.functions[name].args[0]
            module = importlib.import_module(cls.__module__)
            assert getattr(module, cls.__name__) is cls, name  # the reloaded class is the one registered
        print(len(modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 10


def test_a_foreign_class_cannot_take_a_name():
    from shardpipes.datapipes.iter.base import StageIterDataPipe, register

    with pytest.raises(
        RuntimeError,
        match=r"functional name 'webdataset' is already registered by shardpipes\.datapipes\.iter\.webdataset\.WebDatasetIterDataPipe",
    ):

        @register("webdataset")
        class Impostor(StageIterDataPipe[int]):
            def __iter__(self):
                yield 1

    assert owner("webdataset") is stages.WebDataset
