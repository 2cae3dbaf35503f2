"""Write torchdata09-surface.json: torchdata 0.9's public names, call signatures and functional names.

Run by hand when the reference changes (it never imports torchdata; it parses 0.9's source):

    python tests/conformance/make_torchdata09_surface.py /work/.mirror/pytorch+data/repo [v0.9.0]

The first argument is a git directory of pytorch/data (``fetch github:pytorch/data``), the second
the tag. tests/test_torchdata09_surface.py checks shardpipes against the file this writes, and
tests/test_torchdata09_modules.py its ``tree`` (every module) and ``attributes`` (each package's
submodules that importing the package made its attributes in 0.9).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

MODULES = [
    "torchdata.datapipes",
    "torchdata.datapipes.iter",
    "torchdata.datapipes.map",
    "torchdata.datapipes.utils",
    "torchdata.dataloader2",
    "torchdata.dataloader2.adapter",
    "torchdata.dataloader2.graph",
    "torchdata.dataloader2.random",
    "torchdata.dataloader2.utils",
]


def _git(gitdir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True, text=True
    ).stdout


def _module_file(files: set[str], module: str) -> str:
    base = module.replace(".", "/")
    return f"{base}/__init__.py" if f"{base}/__init__.py" in files else f"{base}.py"


#: The trees whose every module must import at its path under shardpipes (issue 26, item 2).
TREES = ("torchdata/datapipes/", "torchdata/dataloader2/")


def _tree_names(tree: ast.Module) -> list[str]:
    """A module's public names: its ``__all__`` if it has one, else what it defines at top level."""
    defined: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "__all__" for t in node.targets
        ):
            return sorted(ast.literal_eval(e) for e in node.value.elts)  # type: ignore[attr-defined]
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defined.append(node.name)
        elif isinstance(node, ast.Assign):
            defined.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.append(node.target.id)
    return sorted({n for n in defined if not n.startswith("_")})


def _module_of(files: set[str], module: str) -> str | None:
    """The file of a torchdata module, or None when ``module`` is not one (a name in a module)."""
    base = module.replace(".", "/")
    for f in (f"{base}/__init__.py", f"{base}.py"):
        if f in files:
            return f
    return None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run on import: module level, inside ``if``/``try``/``with`` too."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a body that runs when called, not on import
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                for item in inner:
                    out.extend(
                        _top_level(item.body if isinstance(item, ast.ExceptHandler) else [item])
                    )
    return out


def _attributes(files: set[str], trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each module's submodules that are its attributes once the module is imported (statically).

    Importing a module first imports its parents; each import statement run at module level
    loads the modules it names (and, for ``from X import n``, ``X.n`` when that is a module);
    loading ``P.C`` binds ``C`` in ``P`` unless ``P`` binds the name to something else (0.9's
    ``datapipes.utils.janitor`` is the function). ``torchdata``'s own ``__getattr__`` imports any
    child on first use, so its children count as attributes.
    """

    def source(module: str, node: ast.ImportFrom) -> str:
        # The absolute name of the module a ``from ... import`` statement in ``module`` reads.
        if not node.level:
            return node.module or ""
        path = _module_of(files, module) or ""
        parts = module.split(".")
        parts = parts[: len(parts) - node.level + path.endswith("__init__.py")]
        return ".".join(parts + ([node.module] if node.module else []))

    def imports(module: str) -> list[str]:
        path = _module_of(files, module)
        out: list[str] = []
        for node in _top_level(trees[path].body) if path else []:
            if isinstance(node, ast.Import):
                out.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = source(module, node)
                out.append(base)
                out.extend(
                    f"{base}.{a.name}" for a in node.names if _module_of(files, f"{base}.{a.name}")
                )
        return [m for m in out if m.split(".")[0] == "torchdata" and _module_of(files, m)]

    def rebound(package: str) -> set[str]:
        path = _module_of(files, package)
        names: set[str] = set()
        for node in _top_level(trees[path].body) if path else []:
            if isinstance(node, ast.ImportFrom):
                base = source(package, node)
                names |= {
                    a.asname or a.name
                    for a in node.names
                    if not _module_of(files, f"{base}.{a.name}")
                }
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return names

    def load(module: str, loaded: set[str]) -> None:
        if module in loaded:
            return
        if "." in module:
            load(module.rsplit(".", 1)[0], loaded)
        loaded.add(module)
        for m in imports(module):
            for i in range(m.count(".") + 1):
                load(".".join(m.split(".")[: i + 1]), loaded)

    packages = sorted(
        f[: -len("/__init__.py")].replace("/", ".")
        for f in files
        if f.endswith("/__init__.py") and f.startswith(TREES)
    )
    out: dict[str, list[str]] = {"torchdata": ["dataloader2", "datapipes"]}
    for package in packages:
        if any(part.startswith("_") for part in package.split(".")) or "protobuf" in package:
            continue
        loaded: set[str] = set()
        load(package, loaded)
        children = sorted(
            m.rsplit(".", 1)[1]
            for m in loaded
            if m.rsplit(".", 1)[0] == package and not m.rsplit(".", 1)[1].startswith("_")
        )
        children = [c for c in children if c not in rebound(package)]
        if children:
            out[package] = children
    return out


def _params(fn: ast.FunctionDef, skip_self: bool) -> list[dict[str, object]]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out: list[dict[str, object]] = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        if skip_self and i == 0:
            continue
        kind = "positional_only" if arg in a.posonlyargs else "positional_or_keyword"
        out.append({"name": arg.arg, "kind": kind, "default": default is not None})
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "var_positional", "default": False})
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append({"name": arg.arg, "kind": "keyword_only", "default": default is not None})
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "var_keyword", "default": False})
    return out


def main(gitdir: str, tag: str = "v0.9.0") -> None:
    files = set(_git(gitdir, "ls-tree", "-r", "--name-only", tag, "torchdata").split())
    trees = {f: ast.parse(_git(gitdir, "show", f"{tag}:{f}")) for f in files if f.endswith(".py")}
    # Every class and function defined anywhere in torchdata, by name (0.9's names are unique
    # enough for this: a clash is reported and the first kept).
    defs: dict[str, ast.AST] = {}
    functional: dict[str, list[str]] = {"iter": [], "map": []}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defs.setdefault(node.name, node)
            if isinstance(node, ast.ClassDef):
                for deco in node.decorator_list:
                    if (
                        isinstance(deco, ast.Call)
                        and getattr(deco.func, "id", "") == "functional_datapipe"
                        and deco.args
                        and isinstance(deco.args[0], ast.Constant)
                    ):
                        bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                        is_map = any("MapDataPipe" in str(b) for b in bases)
                        functional["map" if is_map else "iter"].append(deco.args[0].value)
    modules: dict[str, dict[str, object]] = {}
    for module in MODULES:
        tree = trees[_module_file(files, module)]
        imported: dict[str, tuple[str, str]] = {}  # public name -> (source module, original name)
        names: list[str] | None = None
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "__all__" for t in node.targets
            ):
                names = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                imported.setdefault(node.name, (module, node.name))
        if names is None:
            names = sorted(n for n in imported if not n.startswith("_"))
        entries: dict[str, object] = {}
        for name in names:
            source, original = imported.get(name, (module, name))
            entry: dict[str, object] = {"from": source}
            if source.startswith("torch.") or source == "torch":
                entry["torch"] = True
            node = defs.get(original) if source.startswith("torchdata") else None
            if isinstance(node, ast.ClassDef):
                init = next(
                    (
                        b
                        for b in node.body
                        if isinstance(b, ast.FunctionDef) and b.name == "__init__"
                    ),
                    None,
                )
                entry["kind"] = "class"
                if init is not None:
                    entry["params"] = _params(init, skip_self=True)
            elif isinstance(node, ast.FunctionDef):
                entry["kind"] = "function"
                entry["params"] = _params(node, skip_self=False)
            entries[name] = entry
        modules[module] = entries
    # Every module of the two trees, with the public names it defines (private modules and
    # generated protobuf code excluded): real code imports from and patches these modules.
    tree_modules: dict[str, list[str]] = {}
    for f in sorted(trees):
        if not f.startswith(TREES) or "protobuf_template" in f:
            continue
        module = f[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        if any(part.startswith("_") for part in module.split(".")):
            continue
        tree_modules[module] = _tree_names(trees[f])
    out = {
        "source": f"pytorch/data {tag} ({_git(gitdir, 'rev-list', '-n1', tag).strip()}), BSD-3-Clause",
        "modules": modules,
        "functional": {k: sorted(set(v)) for k, v in functional.items()},
        "tree": tree_modules,
        "attributes": _attributes(files, trees),
    }
    path = Path(__file__).with_name("torchdata09-surface.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(
        f"{path}: {sum(len(v) for v in modules.values())} names, "
        f"{len(out['functional']['iter'])} iter + {len(out['functional']['map'])} map functional names"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
