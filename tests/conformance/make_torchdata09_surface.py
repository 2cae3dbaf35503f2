"""Write torchdata09-surface.json: torchdata 0.9's public names, call signatures and functional names.

Run by hand when the reference changes (it never imports torchdata; it parses 0.9's source):

    python tests/conformance/make_torchdata09_surface.py /work/.mirror/pytorch+data/repo [v0.9.0]

The first argument is a git directory of pytorch/data (``fetch github:pytorch/data``), the second
the tag. tests/test_torchdata09_surface.py checks shardpipes against the file this writes.
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
    }
    path = Path(__file__).with_name("torchdata09-surface.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(
        f"{path}: {sum(len(v) for v in modules.values())} names, "
        f"{len(out['functional']['iter'])} iter + {len(out['functional']['map'])} map functional names"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
