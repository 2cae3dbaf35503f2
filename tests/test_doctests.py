"""Every docstring example in the installed package runs and gives the output it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import shardpipes

MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(shardpipes.__path__, "shardpipes.")
    if not name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
