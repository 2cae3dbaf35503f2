"""Submodules as attributes of their package, imported on first use (PEP 562).

torchdata 0.9's packages imported their children eagerly, so code written for 0.9 reaches a
module through its parent after importing only the parent
(``torchdata.datapipes.iter.util.webdataset.pathsplit = f``). A package of ours that does not
import such a child names it here instead: the child is imported the first time the attribute
is read, and is then the same module object an ``import`` statement gives, so a patch made
through the attribute is seen by the code that reads the module's globals.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

__all__ = ["submodule_attributes"]


def submodule_attributes(
    package: str, names: Iterable[str]
) -> tuple[Callable[[str], ModuleType], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for the submodules ``names``.

    Args:
        package: The package's ``__name__``.
        names: Its submodules that should be attributes (their short names).

    Returns:
        ``(__getattr__, __dir__)``, to bind at the package's module level.

    Example:
        >>> import shardpipes.datapipes.iter as it
        >>> it.util.webdataset.__name__  # the module that defines the webdataset() stage
        'shardpipes.datapipes.iter.webdataset'
    """
    children = frozenset(names)

    def __getattr__(name: str) -> ModuleType:
        if name in children:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *children})

    return __getattr__, __dir__
