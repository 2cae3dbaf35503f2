"""The migration guide's side-by-side pipeline is torchdata 0.9 code with only the imports renamed.

tests/test_docs.py runs the shardpipes column; this checks that it is the 0.9 column with
``torchdata`` replaced by ``shardpipes`` and nothing else, so the page cannot drift into showing
a rewrite while it says "change the import lines".
"""

import pathlib
import re

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "migrating-from-torchdata.md"


def _blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _body(block):
    lines = block.splitlines()
    assert lines[0].startswith("# "), lines[0]  # the column's title comment
    return lines[1:]


def test_side_by_side_pipeline_differs_only_in_the_package_name():
    section = GUIDE.read_text().split("## A complete pipeline, side by side", 1)[1]
    old, new = _blocks(section)[:2]
    assert old.startswith("# torchdata 0.9")
    assert new.startswith("# shardpipes")
    assert [line.replace("torchdata", "shardpipes") for line in _body(old)] == _body(new)
