"""The layers of docs/architecture.md hold: no upward import, no import circle, no hidden imports.

The default test run checks what the lint environment checks, so a crossed layer fails CI.
"""

import ast
import pathlib
import shutil
import subprocess
import sys

import grimp
import pytest

import shardpipes

PACKAGE = pathlib.Path(shardpipes.__file__).parent
ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    run = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "0 broken" in run.stdout


def _cycle_from(graph, start):
    # Depth-first search for a path that comes back to start (modules, not packages).
    stack = [(start, [start])]
    seen = set()
    while stack:
        module, path = stack.pop()
        for nxt in graph.find_modules_directly_imported_by(module):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_module_import_circle():
    graph = grimp.build_graph("shardpipes", include_external_packages=False)
    # A package imports its own modules to re-export them; that is not a circle of logic.
    modules = sorted(
        m for m in graph.modules if not (PACKAGE.parent / m.replace(".", "/")).is_dir()
    )
    circles = [c for m in modules if (c := _cycle_from(graph, m))]
    assert not circles, " -> ".join(circles[0])


def _inner_imports(path):
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [(node.lineno, n) for n in names if n.split(".")[0] == "shardpipes"]
    return found


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_package_import_inside_functions_outside_the_cli(path):
    # The CLI imports lazily to start fast; anywhere else an import in a function hides a circle.
    assert _inner_imports(path) == []
