"""``shardpipes report``: draw a run's logged loader figures into a PNG, and print the verdict."""

from __future__ import annotations

import argparse

from shardpipes.cli._command import Command, arg

__all__ = ["COMMAND", "run"]

COMMAND = Command(
    "report",
    help="draw a run's loader figures (wait per step, throughput per stage) into a PNG",
    description="Reads the figures a run logged (a FiguresFile's JSON lines, or the metrics.csv "
    "of a Lightning CSVLogger with TelemetryCallback) and draws the training loop's wait per "
    "step and the samples per second of each stage over time (docs/telemetry.md).",
    args=(
        arg("figures", help="the figures file (.jsonl, or a CSVLogger's metrics.csv)"),
        arg(
            "-o", "--output", default=None, help="the PNG (default: the figures file's name + .png)"
        ),
        arg("--title", default="", help="the picture's title"),
    ),
)


def run(args: argparse.Namespace) -> int:
    """Draw the picture; print where it is and the last interval's figures."""
    import os

    from shardpipes.monitor.plot import draw
    from shardpipes.monitor.sinks import read_figures

    rows = read_figures(args.figures)
    if not rows:
        raise ValueError(f"{args.figures}: no loader figures in it (data/... keys)")
    out = args.output or os.path.splitext(args.figures)[0] + ".png"
    draw(rows, out, title=args.title)
    last = rows[-1]
    stages = sorted(
        (
            (k.removeprefix("data/stage_us/"), v)
            for k, v in last.items()
            if k.startswith("data/stage_us/")
        ),
        key=lambda kv: -kv[1],
    )
    print(f"{len(rows)} intervals drawn into {out}")
    print(
        f"last interval: wait {last.get('data/wait_share', 0.0):.0%} of step time, "
        f"{last.get('data/wait_ms_per_step', 0.0):.1f} ms per step, "
        f"{last.get('data/samples_per_s', 0.0):,.0f} samples/s"
    )
    for name, us in stages:
        print(f"  {name}: {us:.1f} CPU us per sample")
    return 0
