"""benchmarks/plot_mixing.py draws docs/images/mixing-schedule.png from a real loader run.

The script runs as documented and writes a PNG; the counts it plots are those a ``DataLoader2``
over its graph yields (a run made here, with the same workers and the same resume), not the
schedule's formula; and each epoch holds exactly the samples per source the plan gives, across
the elastic resume.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.plan.mixture import Mixture

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "plot_mixing.py"


@pytest.fixture(scope="module")
def plot_mixing():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import plot_mixing
    finally:
        sys.path.pop(0)
    return plot_mixing


def _loader_counts(pm, urls):
    """Each step's samples per source, read here: 2 workers, then 1 from the state at RESUME_AT."""
    batches = []
    with DataLoader2(pm.graph(urls), reading_service=MultiProcessingReadingService(2)) as dl:
        dl.seed(0)
        while len(batches) < pm.RESUME_AT:
            for batch in dl:
                batches.append(batch)
                if len(batches) == pm.RESUME_AT:
                    break
        state = dl.state_dict()
    with DataLoader2(pm.graph(urls), reading_service=MultiProcessingReadingService(1)) as dl:
        dl.load_state_dict(state)
        batches += list(dl)
    return [[b.count(n) for n in pm.NAMES] for b in batches]


def test_the_plot_shows_what_the_loader_yields(tmp_path, plot_mixing):
    pm = plot_mixing
    png, data = tmp_path / "mixing.png", tmp_path / "counts.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "pipes"))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(png), "--json", str(data)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 600 and height > 300
    plotted = json.loads(data.read_text())["counts"]

    counts = _loader_counts(pm, pm.write_sources(str(tmp_path / "shards")))
    assert plotted == counts
    assert len(counts) == pm.STEPS and all(sum(c) == pm.STEP for c in counts)
    # Each epoch has exactly the plan's samples per source, the resumed one too.
    mix = Mixture(
        3, schedule=pm.SCHEDULE, step_samples=pm.STEP, samples_per_epoch=pm.EPOCH_STEPS * pm.STEP
    )
    for epoch in (0, 1):
        steps = counts[epoch * pm.EPOCH_STEPS : (epoch + 1) * pm.EPOCH_STEPS]
        assert [sum(c) for c in zip(*steps, strict=True)] == mix.counts([300] * 3, epoch)
    # A read, not the formula: batches differ from the schedule's shares by a few samples.
    off = [
        abs(c[i] - pm.STEP * pm.weights(s // 4 * 4)[i])
        for s, c in enumerate(counts)
        for i in range(3)
    ]
    assert max(off) >= 1 and sum(off) / len(off) < 2.0
