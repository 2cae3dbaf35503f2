"""The layers of docs/architecture.md hold: no upward import, no import circle, no hidden imports.

The default test run checks what the lint environment checks, so a crossed layer fails CI.
"""

import ast
import importlib
import pathlib
import re
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


def _named_in_architecture_page():
    text = (ROOT / "docs" / "architecture.md").read_text()
    spans = re.findall(r"`([^`\n]+)`", text)
    paths = {s for s in spans if re.fullmatch(r"[a-z_0-9]+(/[a-z_0-9]+)*(/|\.py)", s) and "/" in s}
    dotted = {s for s in spans if re.fullmatch(r"shardpipes(\.[a-z_0-9]+)+", s)}
    return text, paths, dotted


def _exists(dotted):
    """A module or package of shardpipes, or a name defined in one."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        where = PACKAGE.joinpath(*parts[1:i])
        if where.with_suffix(".py").is_file() or (where / "__init__.py").is_file():
            obj = importlib.import_module(".".join(parts[:i]))
            return all((obj := getattr(obj, name, None)) is not None for name in parts[i:])
    return False


def test_the_architecture_page_names_what_exists():
    _, paths, dotted = _named_in_architecture_page()
    missing = sorted(p for p in paths if not (PACKAGE / p).exists() and not (ROOT / p).exists())
    missing += sorted(d for d in dotted if not _exists(d))
    assert missing == [], f"docs/architecture.md names what the code does not have: {missing}"
    assert paths and dotted


def test_the_architecture_page_names_every_package():
    _, paths, dotted = _named_in_architecture_page()
    named = {p.rstrip("/") for p in paths if p.endswith("/")}
    named |= {d.removeprefix("shardpipes.").replace(".", "/") for d in dotted}
    packages = {str(init.parent.relative_to(PACKAGE)) for init in PACKAGE.rglob("__init__.py")} - {
        "."
    }
    assert sorted(packages - named) == [], "packages docs/architecture.md does not name"
    assert {"dataloader2/graph", "datapipes/td09", "webdataset"} <= named


def test_the_plan_imports_without_torch():
    # The bottom layer is pure integer maths: importing it (or the package root) loads neither
    # torch nor the stages.
    code = (
        "import sys, shardpipes, shardpipes.plan, shardpipes.errors\n"
        "import "
        + ", ".join(
            "shardpipes.plan." + ".".join(m.relative_to(PACKAGE / "plan").with_suffix("").parts)
            for m in (PACKAGE / "plan").rglob("[a-z]*.py")
        )
        + "\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'shardpipes.datapipes')))\n"
        "assert not loaded, loaded\n"
        "assert shardpipes.datapipes.iter.IterableWrapper  # the one lazy attribute\n"
        "assert 'torch' in sys.modules\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"
