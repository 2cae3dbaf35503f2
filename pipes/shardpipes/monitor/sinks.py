"""Sinks: the figures of each interval, to ``logging``, TensorBoard or a file.

A sink takes a snapshot of the loader's :class:`~shardpipes.dataloader2.telemetry.Telemetry`
at the end of each interval and writes the figures of that interval (the difference from the
previous snapshot, :meth:`~shardpipes.dataloader2.telemetry.Snapshot.since`). An interval is
``seconds`` (a thread of the sink's own, between :meth:`IntervalSink.start` and
:meth:`IntervalSink.stop`, or a ``with`` block) or ``steps`` (the training loop calls
:meth:`IntervalSink.step` once per step).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from shardpipes.dataloader2.telemetry import Snapshot, Telemetry, verdict

__all__ = [
    "FiguresFile",
    "IntervalSink",
    "LoggingSink",
    "TensorBoardSink",
    "read_figures",
    "summary",
]

log = logging.getLogger(__name__)


def summary(figures: Snapshot) -> str:
    """One line of the figures: the verdict, then throughput, wait, storage and stage costs."""
    s = figures
    stages = ", ".join(f"{name} {us:.0f}" for name, us in s.stage_us_per_sample().items())
    retries = sum(s.storage.retries.values())
    text = (
        f"rank {s.rank}: {verdict(s).text} | {s.samples_per_s:,.0f} samples/s, "
        f"{s.batches_per_s:,.1f} batches/s, wait {1e3 * s.wait_per_batch:.1f} ms/batch, "
        f"{s.bytes_per_s / 1e6:,.1f} MB/s from storage, {s.storage.open_streams} open streams, "
        f"{retries} retries, {s.skipped} skipped"
    )
    return f"{text} | CPU us/sample: {stages}" if stages else text


class IntervalSink:
    """Base of the sinks: writes the figures of each interval (subclasses define :meth:`emit`).

    Args:
        telemetry: What ``dl.watch()`` returned.
        seconds: An interval in seconds (the sink's own thread, :meth:`start`/:meth:`stop`).
        steps: Or an interval in steps (:meth:`step`, once per training step).
    """

    def __init__(
        self, telemetry: Telemetry, *, seconds: float | None = None, steps: int | None = None
    ) -> None:
        if (seconds is None) == (steps is None):
            raise ValueError("give one interval: seconds=... or steps=...")
        if (seconds is not None and seconds <= 0) or (steps is not None and steps < 1):
            raise ValueError(
                f"the interval should be positive, got seconds={seconds}, steps={steps}"
            )
        self.telemetry = telemetry
        self.seconds = seconds
        self.steps = steps
        self._count = 0
        self._last: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def emit(self, total: Snapshot, interval: Snapshot, step: int) -> None:
        """Write the figures of one interval (``total``: since the start)."""
        raise NotImplementedError

    def flush(self, step: int | None = None) -> Snapshot:
        """Write the figures since the last write now; return the running totals."""
        total = self.telemetry.snapshot()
        interval = total.since(self._last)
        self._last = total
        self.emit(total, interval, self._count if step is None else step)
        return total

    def step(self) -> None:
        """Count a training step; every ``steps`` steps, write the interval's figures."""
        self._count += 1
        if self.steps is not None and self._count % self.steps == 0:
            self.flush()

    def start(self) -> None:
        """Write every ``seconds`` from a thread of the sink's own."""
        if self.seconds is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="shardpipes-sink", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, and write the last interval."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
            self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self.flush()

    def __enter__(self) -> IntervalSink:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoggingSink(IntervalSink):
    """The figures of each interval as one log line (:func:`summary`), verdict first.

    Args:
        telemetry: What ``dl.watch()`` returned.
        seconds: Interval in seconds (or ``steps``).
        steps: Interval in steps.
        logger: Where to log. Default: ``logging.getLogger("shardpipes.monitor.sinks")``.
        level: Default: ``logging.INFO``.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        seconds: float | None = None,
        steps: int | None = None,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
    ) -> None:
        super().__init__(telemetry, seconds=seconds, steps=steps)
        self.logger = logger if logger is not None else log
        self.level = level

    def emit(self, total: Snapshot, interval: Snapshot, step: int) -> None:
        """Log the interval's summary."""
        self.logger.log(self.level, "%s", summary(interval))


class TensorBoardSink(IntervalSink):
    """The figures of each interval as TensorBoard scalars (``data/wait_share``, ...).

    Args:
        telemetry: What ``dl.watch()`` returned.
        writer: A ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package).
        seconds: Interval in seconds (or ``steps``).
        steps: Interval in steps; the scalars' step is the count of :meth:`step` calls.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        writer: Any,
        *,
        seconds: float | None = None,
        steps: int | None = None,
    ) -> None:
        super().__init__(telemetry, seconds=seconds, steps=steps)
        self.writer = writer

    def emit(self, total: Snapshot, interval: Snapshot, step: int) -> None:
        """One scalar per figure of :meth:`Snapshot.flat`."""
        for key, value in interval.flat().items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()


class FiguresFile(IntervalSink):
    """The figures of each interval as one JSON line in ``path`` (what ``shardpipes report`` draws).

    Each line holds ``elapsed`` (seconds since the loader's first batch), ``step`` and the
    figures of :meth:`Snapshot.flat`; a rank other than 0 writes to ``path`` with ``.rank<R>``
    before its extension.

    Args:
        telemetry: What ``dl.watch()`` returned.
        path: The file (appended to).
        seconds: Interval in seconds (or ``steps``).
        steps: Interval in steps.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        path: str | os.PathLike[str],
        *,
        seconds: float | None = None,
        steps: int | None = None,
    ) -> None:
        super().__init__(telemetry, seconds=seconds, steps=steps)
        self.path = os.fspath(path)

    def emit(self, total: Snapshot, interval: Snapshot, step: int) -> None:
        """Append one line."""
        path = self.path
        if total.rank:
            stem, ext = os.path.splitext(path)
            path = f"{stem}.rank{total.rank}{ext}"
        row = {"elapsed": total.elapsed, "step": step, **interval.flat()}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def read_figures(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of a figures file (JSON lines), or of a Lightning ``CSVLogger``'s ``metrics.csv``.

    In a CSV, rows without telemetry figures (other metrics) are left out, and empty cells too.
    """
    return list(_rows(os.fspath(path)))


def _rows(path: str) -> Iterator[dict[str, float]]:
    if path.endswith(".csv"):
        import csv

        with open(path, newline="", encoding="utf-8") as f:
            for raw in csv.DictReader(f):
                row = {k: float(v) for k, v in raw.items() if v not in ("", None)}
                if any(k.startswith("data/") for k in row):
                    yield row
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield {k: float(v) for k, v in json.loads(line).items()}
