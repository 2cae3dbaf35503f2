"""The picture of a run's figures: wait per step, and throughput per stage, over time."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["draw", "series"]

WAIT = "data/wait_ms_per_step"
SAMPLES = "data/samples_per_s"
STAGE = "data/stage_us/"


def series(rows: Sequence[dict[str, float]]) -> dict[str, tuple[list[float], list[float]]]:
    """What :func:`draw` plots, by line label: ``(x, y)``, x the rows' ``elapsed`` (or ``step``).

    ``wait per step (ms)``; ``delivered``: samples per second handed to training; and per stage,
    the samples per CPU-second it would sustain alone (``1e6 / CPU us per sample``): the lowest
    line is the stage that limits a worker.
    """
    x_key = "elapsed" if rows and all("elapsed" in r for r in rows) else "step"
    out: dict[str, tuple[list[float], list[float]]] = {}

    def add(label: str, x: float, y: float) -> None:
        xs, ys = out.setdefault(label, ([], []))
        xs.append(x)
        ys.append(y)

    for i, row in enumerate(rows):
        x = row.get(x_key, float(i))
        if WAIT in row:
            add("wait per step (ms)", x, row[WAIT])
        if SAMPLES in row:
            add("delivered", x, row[SAMPLES])
        for key, us in row.items():
            if key.startswith(STAGE) and us > 0:
                add(key[len(STAGE) :], x, 1e6 / us)
    return out


def draw(rows: Sequence[dict[str, float]], path: str | os.PathLike[str], *, title: str = "") -> Any:
    """Draw ``rows`` (from :func:`~shardpipes.monitor.sinks.read_figures`) into the PNG ``path``.

    Returns the matplotlib ``Figure`` (top: wait per step; bottom: samples per second, handed
    out and per stage). Needs matplotlib (``pip install matplotlib``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("shardpipes report needs matplotlib: pip install matplotlib") from exc
    lines = series(rows)
    x_label = "seconds" if rows and all("elapsed" in r for r in rows) else "step"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    wait = lines.pop("wait per step (ms)", None)
    if wait is not None:
        top.plot(*wait, color="tab:red", label="wait per step (ms)")
    top.set_ylabel("training loop waits (ms per step)")
    top.set_title(title or "Is training data-bound?")
    top.legend(loc="upper right")
    delivered = lines.pop("delivered", None)
    if delivered is not None:
        bottom.plot(*delivered, color="black", linewidth=2.5, label="delivered")
    for label, (xs, ys) in sorted(lines.items()):
        bottom.plot(xs, ys, label=label)
    bottom.set_yscale("log")
    bottom.set_ylabel("samples per second (stages: per CPU-second)")
    bottom.set_xlabel(x_label)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
    return fig
