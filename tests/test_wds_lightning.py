"""The Lightning user's two webdataset pipelines under a real ``lightning`` Trainer (2 CPU ranks).

Marked ``heavy`` (``tox -e heavy`` installs lightning); the same pipelines on plain gloo ranks
run in the default suite (tests/test_wds_ddp.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from _wds_data import write_image_shards
from test_examples import require

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(
    r"rank (?P<rank>\d) epoch (?P<epoch>\d): (?P<batches>\d+) batches ids (?P<ids>[\d,]*)"
)


def run_app(tmp_path, pipeline, shards):
    require("lightning")
    urls = write_image_shards(tmp_path / "data", shards=shards, per_shard=6, exts=("png",))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.path.dirname(HERE) + "/pipes", HERE, os.environ.get("PYTHONPATH", "")]
        ),
    )
    cmd = [
        sys.executable,
        os.path.join(HERE, "wds_lightning_app.py"),
        "--data",
        os.path.dirname(urls[0]),
        "--pipeline",
        pipeline,
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    found = {
        (int(m["epoch"]), int(m["rank"])): (int(m["batches"]), m["ids"])
        for m in LINE.finditer(out.stdout)
    }
    assert sorted(found) == [(0, 0), (0, 1), (1, 0), (1, 1)], out.stdout + out.stderr
    return found


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_lightning_resampled_with_epoch_needs_no_nodesplitter(tmp_path):
    found = run_app(tmp_path, "resampled", shards=3)
    for epoch in (0, 1):
        assert found[epoch, 0][0] == found[epoch, 1][0] == 6  # 2 workers x 6 x 2 crops / 4


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_lightning_ddp_equalize_equal_and_disjoint(tmp_path):
    found = run_app(tmp_path, "equalize", shards=8)
    for epoch in (0, 1):
        (n0, ids0), (n1, ids1) = found[epoch, 0], found[epoch, 1]
        assert n0 == n1 == 6  # 48 // 4 batches over 2 ranks
        a, b = ids0.split(","), ids1.split(",")
        assert not set(a) & set(b) and len(set(a) | set(b)) == 48
