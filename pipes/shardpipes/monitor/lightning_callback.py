"""``TelemetryCallback``: the loader's figures in whatever logger a Lightning ``Trainer`` has.

Imports Lightning (``lightning.pytorch``): import this module only where Lightning is installed.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from shardpipes.dataloader2.telemetry import Snapshot, Telemetry, verdict

__all__ = ["TelemetryCallback"]


class TelemetryCallback(Callback):
    """Every ``every_n_steps`` training steps, log the loader's figures of those steps.

    The figures are those of :meth:`Snapshot.flat <shardpipes.dataloader2.telemetry.Snapshot.flat>`
    (``data/wait_share``, ``data/samples_per_s``, ``data/stage_us/<stage>``, ...), logged to
    every logger of the ``Trainer`` at its ``global_step``; at the end of training the verdict
    of the whole run is printed on rank 0. Each rank logs its own figures where its loggers
    write (Lightning's loggers write on rank 0 only, by default).

    Args:
        telemetry: What ``dl.watch()`` returned for the training loader.
        every_n_steps: Steps per logged interval. Default: ``50``.
    """

    def __init__(self, telemetry: Telemetry, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps should be >= 1, got {every_n_steps}")
        self.telemetry = telemetry
        self.every_n_steps = every_n_steps
        self._steps = 0
        self._last: Snapshot | None = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the interval's figures every ``every_n_steps`` steps."""
        self._steps += 1
        if self._steps % self.every_n_steps:
            return
        total = self.telemetry.snapshot()
        figures = total.since(self._last).flat()
        self._last = total
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Print the verdict of the whole run (rank 0)."""
        rank_zero_info(f"shardpipes loader: {verdict(self.telemetry.snapshot()).text}")
