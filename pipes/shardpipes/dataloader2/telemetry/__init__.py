"""Is training data-bound? The loader's figures while it runs, and what they say to change.

``dl.watch()`` turns telemetry on (docs/telemetry.md); ``snapshot()`` of what it returns gives
one rank's figures as a :class:`Snapshot`, and :func:`verdict` reads them.

- ``recorder.py``: :class:`Telemetry`, the main process's side (batch waits, steps, the
  workers' reports);
- ``reporter.py``: a worker's side, its figures attached to a bundle every so often;
- ``sampler.py``: CPU per stage from samples of a thread's stack;
- ``names.py``: the stage names, shared with ``shardpipes bench --profile``;
- ``snapshot.py``, ``verdict.py``: the figures as a value, and the rules that read them.
"""

from shardpipes.dataloader2.telemetry.names import stage_labels, stage_name
from shardpipes.dataloader2.telemetry.recorder import DEFAULT_INTERVAL, Telemetry
from shardpipes.dataloader2.telemetry.reporter import WorkerReporter
from shardpipes.dataloader2.telemetry.sampler import (
    BUDGET,
    LOADER,
    MAX_WAIT,
    StageSampler,
    next_wait,
)
from shardpipes.dataloader2.telemetry.snapshot import (
    Snapshot,
    StageCost,
    StorageFigures,
    WorkerFigures,
)
from shardpipes.dataloader2.telemetry.verdict import Verdict, verdict

__all__ = [
    "BUDGET",
    "DEFAULT_INTERVAL",
    "LOADER",
    "MAX_WAIT",
    "Snapshot",
    "StageCost",
    "StageSampler",
    "StorageFigures",
    "Telemetry",
    "Verdict",
    "WorkerFigures",
    "WorkerReporter",
    "next_wait",
    "stage_labels",
    "stage_name",
    "verdict",
]
