"""Every shardpipes name the docs show exists: dotted names, imports and functional stage names.

Checked on every code block (any language) of ``docs/**/*.md`` and ``README.md``, on inline
code spans, and on mkdocstrings directives (``::: shardpipes.x.Y``):

- a dotted ``shardpipes.a.b.C`` resolves: the longest importable module, then ``getattr``;
- ``from shardpipes.a import B, C`` imports (Python blocks, parsed with ``ast``);
- in Python blocks that use our stages (not torchdata's or webdataset's, which the migration
  pages show for comparison), every method called on a datapipe is a functional name in the
  registry or an ``IterDataPipe`` method. A datapipe is a stage class called (``IterableWrapper
  (...)``), a functional call on a datapipe, or a variable assigned one of those.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest
from torch.utils.data import IterDataPipe

import shardpipes.datapipes.iter as stages
from shardpipes.datapipes.iter._unhooked import torch_kind
from test_docs import _fences

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]

_DOTTED = re.compile(r"(?<![\w.])shardpipes(?:\.[A-Za-z_]\w*)+")
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_DIRECTIVE = re.compile(r"^:::\s*(shardpipes(?:\.\w+)+)\s*$", re.M)
# Blocks written for another library (the "before" of a migration page) name its stages: they
# import it, or open with a comment naming it ("# torchdata 0.9").
_FOREIGN = re.compile(
    r"^\s*(?:from|import)\s+(?:torchdata\.datapipes|webdataset|wids)\b"
    r"|\A\s*#\s*(?:torchdata|webdataset|wids)\b",
    re.M | re.I,
)


def resolve(dotted: str) -> object:
    """The object ``dotted`` names; raises ``ImportError``/``AttributeError`` when none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not dotted.startswith(exc.name):
                raise  # the module exists but imports something missing
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module {parts[0]!r}")


def _blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line, lang, code)`` of each fenced block of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    return [(start + 1, lang, body) for start, _, lang, body in _fences(lines)]


def _prose(page: Path) -> str:
    """The page without its fenced blocks."""
    lines = page.read_text(encoding="utf-8").splitlines()
    for start, end, _, _ in _fences(lines):
        lines[start : end + 1] = [""] * (end + 1 - start)
    return "\n".join(lines)


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT)}:{line}"


def referenced_names() -> list[tuple[str, str]]:
    """``(where, dotted name)`` for every ``shardpipes.…`` name the pages show in code."""
    found = []
    for page in PAGES:
        for line, lang, code in _blocks(page):
            found += [(_where(page, line), n) for n in _DOTTED.findall(code)]
            if lang in ("python", "py"):
                found += [(_where(page, line), n) for n in _imported(code)]
        prose = _prose(page)
        for m in _INLINE.finditer(prose):
            line = prose.count("\n", 0, m.start()) + 1
            found += [(_where(page, line), n) for n in _DOTTED.findall(m.group(1))]
        for m in _DIRECTIVE.finditer(prose):
            found.append((_where(page, prose.count("\n", 0, m.start()) + 1), m.group(1)))
    return found


def _imported(code: str) -> list[str]:
    """``shardpipes.mod.name`` for each ``from shardpipes.mod import name``."""
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "shardpipes":
            names += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
    return names


def _is_stage_class(name: str) -> bool:
    obj = getattr(stages, name, None)
    return isinstance(obj, type) and issubclass(obj, IterDataPipe)


def registered_in(code: str) -> set[str]:
    """Functional names a block registers itself (``@functional_datapipe("name")``)."""
    return {
        deco.args[0].value
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.ClassDef)
        for deco in node.decorator_list
        if isinstance(deco, ast.Call)
        and getattr(deco.func, "id", getattr(deco.func, "attr", None))
        in ("functional_datapipe", "register")
        and deco.args
        and isinstance(deco.args[0], ast.Constant)
    }


def stage_calls(code: str) -> list[tuple[int, str]]:
    """``(line, method)`` for each method called on a datapipe in ``code`` (see module doc)."""
    tree = ast.parse(code)
    own = registered_in(code)
    pipes: set[str] = set()  # variables holding a datapipe
    calls: list[tuple[int, int, str]] = []

    def is_pipe(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in pipes
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                return _is_stage_class(node.func.id)
            if isinstance(node.func, ast.Attribute):
                known = node.func.attr in IterDataPipe.functions or node.func.attr in own
                return known and is_pipe(node.func.value)
        return False

    # Statements in source order, so an assignment is seen before the calls that use it.
    for stmt in sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.stmt)), key=lambda n: n.lineno
    ):
        if isinstance(stmt, ast.Assign) and is_pipe(stmt.value):
            pipes.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and is_pipe(node.func.value)
            and node.func.attr not in own
        ):
            calls.append((node.lineno, node.func.end_col_offset or 0, node.func.attr))
    return [(line, attr) for line, _, attr in sorted(calls)]


def datapipe_method_calls() -> list[tuple[str, str]]:
    """``(where, method)`` for each method the pages call on one of our datapipes."""
    found = []
    for page in PAGES:
        for line, lang, code in _blocks(page):
            if lang not in ("python", "py") or _FOREIGN.search(code):
                continue
            found += [(_where(page, line + n), attr) for n, attr in stage_calls(code)]
    return found


# Modules whose public classes the pages name bare (``ShardIndex.select``, ``DataLoader2.seed``).
PUBLIC = [
    "shardpipes.datapipes.iter",
    "shardpipes.dataloader2",
    "shardpipes.index",
    "shardpipes.writer",
    "shardpipes.errors",
    "shardpipes.nodes",
]
_CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w*)\.([a-z_]\w*)")


def class_attributes() -> list[tuple[str, str]]:
    """``(where, Class.attr)`` for each attribute of one of our public classes shown in code."""
    ours = {}
    for module in PUBLIC:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            if isinstance(getattr(mod, name), type):
                ours.setdefault(name, f"{module}.{name}")
    found = []
    for page in PAGES:
        texts = [(line, code) for line, _, code in _blocks(page) if not _FOREIGN.search(code)]
        prose = _prose(page)
        texts += [
            (prose.count("\n", 0, m.start()) + 1, m.group(1)) for m in _INLINE.finditer(prose)
        ]
        for line, text in texts:
            for cls, attr in _CLASS_ATTR.findall(text):
                if cls in ours:
                    found.append((_where(page, line), f"{ours[cls]}.{attr}"))
    return found


NAMES = referenced_names() + class_attributes()
CALLS = datapipe_method_calls()


def test_the_pages_show_names_and_stage_calls():
    """The checks below see something (a broken parser would pass them vacuously)."""
    shown = {n for _, n in NAMES}
    assert {
        "shardpipes.datapipes.iter.IterableWrapper",
        "shardpipes.dataloader2.DataLoader2",
    } <= shown
    assert {"open_files_by_fsspec", "load_from_tar", "webdataset"} <= {a for _, a in CALLS}


@pytest.mark.parametrize(
    "dotted", sorted({n for _, n in NAMES}), ids=lambda n: n.removeprefix("shardpipes.")
)
def test_every_shardpipes_name_shown_exists(dotted):
    where = sorted({w for w, n in NAMES if n == dotted})
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{dotted} (shown at {', '.join(where)}) does not exist: {exc}")


def test_every_stage_called_on_a_datapipe_is_registered():
    unknown = [
        f"{where}: .{attr}("
        for where, attr in CALLS
        if attr not in IterDataPipe.functions and not hasattr(IterDataPipe, attr)
    ]
    assert not unknown, f"functional names the docs use that no stage registers: {unknown}"


def test_the_checks_catch_a_wrong_name():
    with pytest.raises(AttributeError):
        resolve("shardpipes.datapipes.iter.NoSuchStage")
    with pytest.raises(AttributeError, match="no_such_module"):
        resolve("shardpipes.no_such_module.x")
    code = "from shardpipes.datapipes.iter import IterableWrapper\ndp = IterableWrapper([1])\ndp = dp.shard_expand().no_such_stage()\n"
    assert stage_calls(code) == [(3, "shard_expand"), (3, "no_such_stage")]
    own = '@functional_datapipe("mine")\nclass M(IterDataPipe): ...\n' + code.replace(
        "no_such_stage", "mine"
    )
    assert stage_calls(own) == [(5, "shard_expand")]


_PAIR = re.compile(r"`([A-Z]\w*)` \(`([a-z_]\w*)`\)")  # `TarArchiveLoader` (`load_from_tar`)


def test_stage_classes_shown_with_their_functional_name_match_the_registry():
    pairs = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        pairs += [(page.relative_to(ROOT), cls, fn) for cls, fn in _PAIR.findall(text)]
    assert pairs, "no `Class` (`functional_name`) pairs found: has the API index moved?"
    wrong = []
    for page, cls, fn in pairs:
        registered = IterDataPipe.functions.get(fn)
        owner = registered.args[0] if isinstance(registered, functools.partial) else None
        # torch's Shuffler/Mapper/Filter: the functional name builds their unhooked subclass
        if owner is None or getattr(stages, cls, None) not in (owner, torch_kind(owner)):
            wrong.append(f"{page}: `{cls}` (`{fn}`), registered by {owner}")
    assert not wrong, wrong
