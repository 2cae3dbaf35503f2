"""Griffe extension for the API pages: read the package's docstrings as mkdocstrings expects.

The docstrings follow STYLE.md point 8 and Napoleon's Google style, which differ from griffe's
in two places, both fixed here before the docstrings are parsed:

- ``Example:`` sections: Napoleon treats ``Example:`` and ``Examples:`` alike; griffe knows
  only ``Examples:`` and would render ``Example:`` as prose, its doctest output as broken
  Markdown links. The section title is renamed.
- Sphinx roles (``:class:`~shardpipes.errors.ShardReadError```, ``:func:`as_node```) would be
  shown literally. They become inline code (the last component when the target starts with
  ``~``, as Sphinx shows it).

Loaded from mkdocs.yml (``extensions:``); excluded from the site (``exclude_docs``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)
_ROLE = re.compile(
    r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`"
)


def _role(match: re.Match[str]) -> str:
    target = match.group("target")
    if match.group("tilde"):
        target = target.rsplit(".", 1)[-1]
    return f"``{target}``"


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` sections to ``Examples:`` and turn Sphinx roles into inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of every loaded object."""
        if obj.docstring is not None:
            value = _EXAMPLE.sub(r"\g<indent>Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(_role, value)
