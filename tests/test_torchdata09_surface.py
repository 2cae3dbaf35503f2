"""Every public name of torchdata 0.9 at its path under shardpipes, with a signature 0.9's calls bind to.

The reference is tests/conformance/torchdata09-surface.json, written from 0.9's source by
tests/conformance/make_torchdata09_surface.py (issue 16, item 1).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
from torch.utils.data import IterDataPipe, MapDataPipe

SURFACE = json.loads(
    (Path(__file__).parent / "conformance" / "torchdata09-surface.json").read_text()
)
NAMES = [
    (module, name, entry)
    for module, entries in sorted(SURFACE["modules"].items())
    for name, entry in sorted(entries.items())
]


def _ours(module: str) -> str:
    return "shardpipes" + module[len("torchdata") :]


def test_the_reference_is_the_whole_09_surface():
    assert len(NAMES) == 134
    assert SURFACE["source"].startswith("pytorch/data v0.9.0")


@pytest.mark.parametrize(("module", "name", "entry"), NAMES, ids=[f"{m}.{n}" for m, n, _ in NAMES])
def test_name_exists_at_its_09_path(module, name, entry):
    ours = importlib.import_module(_ours(module))
    assert hasattr(ours, name), f"{_ours(module)}.{name} is missing"
    if entry.get("torch"):  # 0.9 re-exported torch's own object: so do we
        source = importlib.import_module(entry["from"])
        if hasattr(source, name):
            assert getattr(ours, name) is getattr(source, name)


def _placeholder_call(params):
    """Arguments as 0.9 code passes them: every required positional by position, keywords by name."""
    args, kwargs = [], {}
    for p in params:
        if p["kind"] in ("positional_only", "positional_or_keyword") and not p["default"]:
            args.append(object())
        elif p["kind"] == "keyword_only" and not p["default"]:
            kwargs[p["name"]] = object()
    return args, kwargs


SIGNED = [(m, n, e) for m, n, e in NAMES if e.get("params") is not None and not e.get("torch")]


# Names whose 0.9 calls our class dispatches to another class (by its arguments), and that class.
DISPATCHED = {
    # on_disk_cache(filepath_fn=..., ...) is 0.9's cache; on_disk_cache(cache_dir) is ours.
    "OnDiskCacheHolder": "shardpipes.datapipes.td09.cache.TorchdataCacheHolder",
}


@pytest.mark.parametrize(
    ("module", "name", "entry"), SIGNED, ids=[f"{m}.{n}" for m, n, _ in SIGNED]
)
def test_09_calls_bind_to_our_signature(module, name, entry):
    obj = getattr(importlib.import_module(_ours(module)), name)
    if name in DISPATCHED:
        where, _, cls = DISPATCHED[name].rpartition(".")
        obj = getattr(importlib.import_module(where), cls)
    target = obj.__init__ if inspect.isclass(obj) else obj
    sig = inspect.signature(target)
    ours = [p for p in sig.parameters.values() if p.name != "self"]
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in ours)
    by_name = {p.name: p for p in ours}
    params = entry["params"]
    # 0.9's positional parameters, in 0.9's order, are ours in the same order.
    positional = [
        p["name"] for p in params if p["kind"] in ("positional_only", "positional_or_keyword")
    ]
    our_positional = [
        p.name for p in ours if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    takes_varargs = any(p.kind is p.VAR_POSITIONAL for p in ours)
    if not takes_varargs:
        assert our_positional[: len(positional)] == positional, (positional, our_positional)
    for p in params:
        if p["kind"] in ("var_positional", "var_keyword"):
            continue
        if p["name"] not in by_name:
            assert takes_kwargs, f"{name}: 0.9's argument {p['name']!r} is not accepted"
        elif p["default"]:
            assert by_name[p["name"]].default is not inspect.Parameter.empty, (
                f"{name}: 0.9's {p['name']!r} had a default; ours is required"
            )
    args, kwargs = _placeholder_call(params)
    sig.bind(*([None] if "self" in sig.parameters else []), *args, **kwargs)


def test_a_09_on_disk_cache_call_builds_09s_cache():
    from shardpipes.datapipes.iter import IterableWrapper, OnDiskCacheHolder
    from shardpipes.datapipes.td09.cache import TorchdataCacheHolder

    assert type(OnDiskCacheHolder(IterableWrapper(["a"]), str.upper)) is TorchdataCacheHolder


@pytest.mark.parametrize("kind", ["iter", "map"])
def test_every_09_functional_name_is_registered(kind):
    import shardpipes.datapipes.iter
    import shardpipes.datapipes.map  # noqa: F401

    functions = (IterDataPipe if kind == "iter" else MapDataPipe).functions
    missing = [n for n in SURFACE["functional"][kind] if n not in functions]
    assert missing == []
    assert len(SURFACE["functional"][kind]) >= (60 if kind == "iter" else 1)
