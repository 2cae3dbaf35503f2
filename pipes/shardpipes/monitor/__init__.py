"""Where the loader's telemetry goes: logs, TensorBoard, a figures file, Lightning, a picture.

- ``sinks.py``: :class:`LoggingSink` (plain ``logging`` at an interval), :class:`TensorBoardSink`
  (scalars through torch's ``SummaryWriter``), :class:`FiguresFile` (one JSON line per
  interval, what ``shardpipes report`` draws);
- ``lightning_callback.py``: ``TelemetryCallback``, the figures in whatever logger a Lightning
  ``Trainer`` has (imports Lightning; import it from there);
- ``plot.py``: the picture of a figures file (matplotlib).

docs/telemetry.md shows each.
"""

from shardpipes.monitor.sinks import (
    FiguresFile,
    IntervalSink,
    LoggingSink,
    TensorBoardSink,
    read_figures,
    summary,
)

__all__ = [
    "FiguresFile",
    "IntervalSink",
    "LoggingSink",
    "TensorBoardSink",
    "read_figures",
    "summary",
]
