"""The benchmark script runs end to end (``--quick``) and prints a table of positive figures.

Only the shape of the output is checked, never how fast anything is: timings on a shared
machine are noise, and DESIGN.md keeps performance out of the tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks", "bench.py")

ROW = re.compile(
    r"^\| (?P<peer>[a-z0-9]+) \| (?P<mode>in-process|\d+ workers) \| (?P<sps>[\d,]+) \| (?P<mbs>[\d,]+) \|"
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_quick_run_prints_a_table_with_positive_figures(tmp_path):
    cmd = [
        sys.executable,
        BENCH,
        "--quick",
        "--peers",
        "shardpipes,tarfile,cat",
        "--cache-dir",
        os.fspath(tmp_path / "data"),
        "--json",
        os.fspath(tmp_path / "out.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    rows = {}
    for line in proc.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[(m["peer"], m["mode"])] = (_number(m["sps"]), _number(m["mbs"]))
    assert set(rows) == {
        ("cat", "in-process"),
        ("tarfile", "in-process"),
        ("shardpipes", "in-process"),
        ("shardpipes", "2 workers"),
    }, proc.stdout
    for key, (samples_per_s, mb_per_s) in rows.items():
        assert samples_per_s > 0 and mb_per_s > 0, (key, proc.stdout)
    assert "shardpipes/limit (cat MB/s, in-process)" in proc.stdout
    assert (tmp_path / "out.json").exists()
