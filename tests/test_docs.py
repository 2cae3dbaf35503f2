"""The user guide in docs/: its Python blocks run, the outputs it shows are true, and it builds.

Every ```python block of docs/**/*.md carries a marker, an HTML comment on the line before its
fence (blank lines may separate them):

- ``<!-- test -->``: run the block as a script (``python snippet.py``) in a fresh folder that
  already holds the shards the pages read, ``shards/train-{000000..000003}.tar`` as
  ``write_synthetic("shards")`` makes them (4 shards x 100 samples).
- ``<!-- test: torchrun N -->``: run it with ``torchrun --standalone --nproc_per_node=N``
  (real gloo ranks on this machine; marked ``distributed``).
- ``<!-- not-tested: why -->``: only compile it (it needs torchdata 0.9, webdataset, a bucket,
  several machines...). The reason is shown on the page source, not to readers.

A tested block may be followed by ``<!-- output -->`` and a fenced block: the script's standard
output must equal it (for torchrun blocks, as a multiset of lines, since ranks interleave).
A block without a marker fails ``test_every_python_block_is_marked``, so none goes unchecked.

``test_mkdocs_build_strict`` builds the site with ``mkdocs build --strict``. It skips when the
docs tools are not installed, except where ``SHARDPIPES_REQUIRE_DOCS_TOOLS=1`` (``tox -e docs``
sets it), so the environment meant to build the docs can never skip it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardpipes.synthetic import write_synthetic

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n`]*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>test|not-tested)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
_OUTPUT = re.compile(r"^\s*<!--\s*output\s*-->\s*$")
_TORCHRUN = re.compile(r"^torchrun\s+(?P<n>\d+)$")

SNIPPET_TIMEOUT = 300  # seconds; a block that runs longer is a hang, not a slow example


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "test", "not-tested" or None
    arg: str | None
    output: str | None  # the expected stdout, when an <!-- output --> block follows

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def nproc(self) -> int | None:
        m = _TORCHRUN.match(self.arg or "")
        return int(m.group("n")) if m else None


def _fences(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """Return (start, end, lang, body) for each fenced block; start/end are 0-based line numbers."""
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        close = re.compile(rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]
        ]
        out.append((i, j, m.group("lang").lower(), "\n".join(body) + "\n"))
        i = j + 1
    return out


def _previous_nonblank(lines: list[str], i: int) -> str:
    i -= 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    return lines[i] if i >= 0 else ""


def _next_nonblank(lines: list[str], i: int) -> int | None:
    i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i if i < len(lines) else None


def collect_blocks() -> list[Block]:
    blocks = []
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        fences = _fences(lines)
        starts = {start: (end, body) for start, end, _, body in fences}
        for start, end, lang, body in fences:
            if lang not in ("python", "py"):
                continue
            marker = _MARKER.match(_previous_nonblank(lines, start))
            output = None
            after = _next_nonblank(lines, end)
            if after is not None and _OUTPUT.match(lines[after]):
                nxt = _next_nonblank(lines, after)
                if nxt is None or nxt not in starts:
                    raise AssertionError(
                        f"{path}:{after + 1}: <!-- output --> is not followed by a fenced block"
                    )
                output = starts[nxt][1]
            blocks.append(
                Block(
                    page=str(path.relative_to(DOCS)),
                    line=start + 1,
                    lang=lang,
                    code=body,
                    marker=marker.group("kind") if marker else None,
                    arg=marker.group("arg") if marker else None,
                    output=output,
                )
            )
    return blocks


BLOCKS = collect_blocks()
RUNNABLE = [b for b in BLOCKS if b.marker == "test" and b.nproc is None]
TORCHRUN = [b for b in BLOCKS if b.marker == "test" and b.nproc is not None]


def test_docs_have_python_blocks():
    assert RUNNABLE, f"no <!-- test --> blocks found under {DOCS}: is the docs folder there?"


def test_every_python_block_is_marked():
    unmarked = [b.id for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        "python blocks without <!-- test -->, <!-- test: torchrun N --> or "
        f"<!-- not-tested: why --> on the line before: {unmarked}"
    )
    bad = [b.id for b in BLOCKS if b.marker == "test" and b.arg and b.nproc is None]
    assert not bad, f"unknown test marker argument (expected 'torchrun N'): {bad}"
    untested_output = [b.id for b in BLOCKS if b.output is not None and b.marker != "test"]
    assert not untested_output, f"<!-- output --> after a block that is not run: {untested_output}"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_python_block_compiles(block):
    compile(block.code, block.id, "exec")


def _workdir(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "shards")  # the dataset every page reads: 4 shards x 100 samples
    return tmp_path


def _run(block: Block, cmd: list[str], cwd: Path) -> str:
    script = cwd / "snippet.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ)
    # The snippet sees shardpipes as a user would: the package, not the tests' helpers. It is
    # this checkout's package (its pipes/ first), so a git worktree tests its own code.
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "pipes")
    try:
        proc = subprocess.run(
            [*cmd, str(script.name)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=SNIPPET_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{block.id} hung past {SNIPPET_TIMEOUT} s\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{block.id} exited with {proc.returncode}\n--- code ---\n{block.code}"
            f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
        )
    return proc.stdout


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.strip("\n").splitlines()]


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_python_block_runs(block, tmp_path):
    stdout = _run(block, [sys.executable], _workdir(tmp_path))
    if block.output is not None:
        assert _lines(stdout) == _lines(block.output), (
            f"{block.id}: the output shown on the page is not what runs"
        )


# torchrun --tee 1 collects each rank's stdout line by line, prefixed "[default<local rank>]:",
# so lines of different ranks cannot be cut into each other as the ranks' own writes could be.
_RANK_PREFIX = re.compile(r"^\[default\d+\]:")


@pytest.mark.distributed
@pytest.mark.parametrize("block", TORCHRUN, ids=lambda b: b.id)
def test_torchrun_block_runs(block, tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", f"--nproc_per_node={block.nproc}", "--tee", "1",
    ]  # fmt: skip
    stdout = _run(block, cmd, _workdir(tmp_path))
    lines = [_RANK_PREFIX.sub("", ln) for ln in _lines(stdout) if _RANK_PREFIX.match(ln)]
    if block.output is not None:
        assert sorted(lines) == sorted(_lines(block.output)), (
            f"{block.id}: the output shown on the page is not what runs"
        )


def _docs_tools_or_skip() -> None:
    wanted = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if not missing:
        return
    message = f"docs tools not installed ({', '.join(missing)}); tox -e docs installs them"
    if os.environ.get("SHARDPIPES_REQUIRE_DOCS_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def test_mkdocs_build_strict(tmp_path):
    _docs_tools_or_skip()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
