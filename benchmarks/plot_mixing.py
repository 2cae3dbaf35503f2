"""The composition of a scheduled mixture against the step, from a real run of the loader.

    python benchmarks/plot_mixing.py --out docs/images/mixing-schedule.png [--json counts.json]

Three indexed sources (300 samples each) mixed by ``mix(schedule=...)``: the weights move
every 4 steps from mostly ``a`` to mostly ``c``. ``DataLoader2`` with 2 worker processes reads
batches of 32 (one step), 40 steps an epoch; at step 50 (mid epoch 1) its state is saved and
a new loader with 1 worker continues from it (an elastic resume). Each batch's samples are
counted by the shard they were read from; the plot stacks each step's shares, with the
schedule's weights as lines. ``--json`` writes the counts (``tests/test_plot_mixing.py``
checks them against a loader run of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index
from shardpipes.synthetic import write_synthetic

NAMES = ("a", "b", "c")
STEP = 32  # samples of a step (one batch)
EPOCH_STEPS = 40
STEPS = 2 * EPOCH_STEPS
RESUME_AT = 50  # the step where the state is saved and a 1-worker loader continues


def weights(step: int) -> list[float]:
    """The schedule: ``a`` from 0.7 down to 0.1, ``c`` from 0.1 up to 0.6, ``b`` the rest."""
    t = step / STEPS
    a, c = 0.7 - 0.6 * t, 0.1 + 0.5 * t
    return [round(a, 3), round(1 - a - c, 3), round(c, 3)]


SCHEDULE = [(s, weights(s)) for s in range(0, STEPS, 4)]


class SourceOf:
    """A sample's source, from the shard it was read from (``{name}-00000N.tar``)."""

    def __call__(self, sample: dict[str, Any]) -> str:
        return os.path.basename(sample["__url__"]).split("-")[0]


def write_sources(folder: str) -> list[list[str]]:
    """Each source's two shards of 150 samples, written under ``folder``."""
    return [
        write_synthetic(folder, shards=2, samples=150, payload_bytes=16, prefix=name, seed=i)
        for i, name in enumerate(NAMES)
    ]


def graph(urls: list[list[str]]) -> Any:
    """The mixture of the three sources, in batches of one step."""

    def source(paths: list[str]) -> Any:
        return (
            IterableWrapper(paths)
            .shuffle()
            .sharding_by_index(build_index(paths, progress=False))
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .map(SourceOf())
        )

    first, *rest = (source(u) for u in urls)
    return first.mix(
        *rest,
        schedule=SCHEDULE,
        step_samples=STEP,
        samples_per_epoch=EPOCH_STEPS * STEP,
        names=list(NAMES),
    ).batch(STEP)


def composition(urls: list[list[str]], seed: int = 0) -> list[list[int]]:
    """Samples of each source in each step's batch, read by the loader (resumed at ``RESUME_AT``)."""
    counts: list[list[int]] = []

    def count(batch: list[str]) -> None:
        counts.append([batch.count(name) for name in NAMES])

    service = MultiProcessingReadingService(num_workers=2)
    with DataLoader2(graph(urls), reading_service=service) as dl:
        dl.seed(seed)
        for _ in range(2):  # epochs, until the resume point
            for batch in dl:
                count(batch)
                if len(counts) == RESUME_AT:
                    break
            if len(counts) == RESUME_AT:
                break
        state = dl.state_dict()
    service = MultiProcessingReadingService(num_workers=1)  # elastic: 2 workers -> 1
    with DataLoader2(graph(urls), reading_service=service) as dl:
        dl.load_state_dict(state)
        while len(counts) < STEPS:
            for batch in dl:
                count(batch)
    return counts


def plot(counts: list[list[int]], out: str) -> None:
    """Stacked shares per step, the schedule's weights as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(len(counts))
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    colors = ("#4c72b0", "#dd8452", "#55a868")
    bottom = [0.0] * len(counts)
    for i, (name, color) in enumerate(zip(NAMES, colors, strict=True)):
        share = [c[i] / sum(c) for c in counts]
        ax.bar(steps, share, width=1.0, bottom=bottom, color=color, alpha=0.75, label=name)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    ends = [*steps, len(counts)]  # the schedule's cumulative weights: where the bars should end
    edges = [0.0] * len(ends)
    for i in range(len(NAMES) - 1):
        edges = [
            e + weights(min(s, len(counts) - 1) // 4 * 4)[i]
            for e, s in zip(edges, ends, strict=True)
        ]
        ax.step(
            [s - 0.5 for s in ends],
            edges,
            where="post",
            color="black",
            linewidth=1,
            label="schedule" if i == 0 else None,
        )
    for x, text in ((EPOCH_STEPS, "epoch 1"), (RESUME_AT, "resumed on 1 worker")):
        ax.axvline(x - 0.5, color="black", linestyle="--", linewidth=1)
        ax.text(x, 1.02, text, fontsize=8, va="bottom")
    ax.set_xlim(-0.5, len(counts) - 0.5)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"step (a batch of {STEP} samples; {EPOCH_STEPS} steps an epoch)")
    ax.set_ylabel("share of the batch")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--json", help="also write the counts per step here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shardpipes-plot-mixing-") as folder:
        counts = composition(write_sources(folder), args.seed)
    plot(counts, args.out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"names": NAMES, "schedule": SCHEDULE, "counts": counts}, f)
    print(
        f"{args.out}: {len(counts)} steps, samples per source {[sum(c) for c in zip(*counts, strict=True)]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
