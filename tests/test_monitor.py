"""Where telemetry goes: logging, TensorBoard, a figures file and its picture, Lightning."""

from __future__ import annotations

import csv
import json
import logging

import pytest
import torch

from shardpipes.cli import main
from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.monitor import FiguresFile, LoggingSink, TensorBoardSink, read_figures
from shardpipes.monitor.plot import draw, series


def work(x: int) -> int:
    total = 0
    for i in range(20_000):  # CPU-busy: a stage the sampler sees
        total += i * x
    return x


def _loader(n: int = 96) -> DataLoader2:
    return DataLoader2(IterableWrapper(range(n)).shuffle(buffer_size=8).map(work).batch(4))


def test_logging_sink_logs_the_verdict_every_n_steps(caplog):
    dl = _loader()
    telemetry = dl.watch(interval=0.002, budget=0.5)
    sink = LoggingSink(telemetry, steps=8)
    with caplog.at_level(logging.INFO, logger="shardpipes.monitor"), dl:
        for _ in dl:
            telemetry.step()
            sink.step()
    lines = [r.getMessage() for r in caplog.records if r.name == "shardpipes.monitor.sinks"]
    assert len(lines) == 3  # 24 batches, a line every 8 steps
    assert all(line.startswith("rank 0: data-bound at") for line in lines)
    assert all("samples/s" in line and "CPU us/sample:" in line for line in lines)


def test_logging_sink_thread_logs_at_an_interval_and_once_at_stop(caplog):
    dl = _loader(8)
    telemetry = dl.watch(interval=None)
    with caplog.at_level(logging.INFO, logger="shardpipes.monitor"), dl:
        with LoggingSink(telemetry, seconds=3600):  # the interval never comes: only the last
            assert sum(len(b) for b in dl) == 8
    lines = [r.getMessage() for r in caplog.records if r.name == "shardpipes.monitor.sinks"]
    assert len(lines) == 1 and "samples/s" in lines[0]


def test_an_interval_is_seconds_or_steps():
    telemetry = _loader().watch()
    with pytest.raises(ValueError, match="one interval"):
        LoggingSink(telemetry)
    with pytest.raises(ValueError, match="one interval"):
        LoggingSink(telemetry, seconds=1, steps=1)


def test_tensorboard_sink_writes_scalars_summary_writer_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    dl = _loader()
    telemetry = dl.watch(interval=0.002, budget=0.5)
    writer = SummaryWriter(str(tmp_path))
    sink = TensorBoardSink(telemetry, writer, steps=6)
    with dl:
        for _ in dl:
            telemetry.step()
            sink.step()
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"data/wait_share", "data/samples_per_s", "data/stage_us/map"} <= tags
    assert [e.step for e in events.Scalars("data/wait_share")] == [6, 12, 18, 24]
    assert all(0 <= e.value <= 1 for e in events.Scalars("data/wait_share"))


def test_report_draws_what_the_figures_file_logged(tmp_path, capsys):
    path = tmp_path / "figures.jsonl"
    dl = _loader()
    telemetry = dl.watch(interval=0.002, budget=0.5)
    sink = FiguresFile(telemetry, path, steps=4)
    with dl:
        for _ in dl:
            telemetry.step()
            sink.step()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6 and [r["step"] for r in rows] == [4, 8, 12, 16, 20, 24]
    assert read_figures(path) == rows

    fig = draw(rows, tmp_path / "direct.png")
    top, bottom = fig.axes
    (wait,) = top.get_lines()
    assert list(wait.get_ydata()) == [r["data/wait_ms_per_step"] for r in rows]
    assert list(wait.get_xdata()) == [r["elapsed"] for r in rows]
    drawn = {line.get_label(): list(line.get_ydata()) for line in bottom.get_lines()}
    assert drawn["delivered"] == [r["data/samples_per_s"] for r in rows]
    sampled = [r["data/stage_us/map"] for r in rows if r.get("data/stage_us/map", 0) > 0]
    assert drawn["map"] == [pytest.approx(1e6 / us) for us in sampled]  # samples/CPU-s
    assert series(rows)["map"][1] == drawn["map"]

    assert main(["report", str(path), "-o", str(tmp_path / "run.png")]) == 0
    out = capsys.readouterr().out
    assert "6 intervals drawn into" in out and "map:" in out
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_a_file_without_figures(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert main(["report", str(path)]) == 1
    assert "no loader figures" in capsys.readouterr().err


def test_lightning_callback_logs_to_the_trainers_csv_logger(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from shardpipes.lightning import LightningLoader
    from shardpipes.monitor.lightning_callback import TelemetryCallback

    class Model(pl.LightningModule):
        def __init__(self, batches: LightningLoader) -> None:
            super().__init__()
            self.batches = batches
            self.layer = torch.nn.Linear(1, 1)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training:
                self.batches.step()
            return batch

        def training_step(self, batch, batch_idx):
            x = torch.tensor(batch, dtype=torch.float32).unsqueeze(1)
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self):
            return self.batches

    dl = _loader()
    telemetry = dl.watch(interval=0.002, budget=0.5)
    batches = LightningLoader(dl)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=CSVLogger(str(tmp_path), name="run"),
        callbacks=[TelemetryCallback(telemetry, every_n_steps=6)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(batches))
    dl.shutdown()
    (metrics,) = tmp_path.glob("run/*/metrics.csv")
    with open(metrics, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("data/wait_share")]
    assert [int(r["step"]) for r in rows] == [6, 12, 18, 24]  # the Trainer's global step
    # (stage figures are sampled, and most of this loop's time is Lightning's own: not asserted)
    assert {"data/samples_per_s", "data/wait_ms_per_step", "data/mb_per_s"} <= set(rows[0])
    assert all(0 <= float(r["data/wait_share"]) <= 1 for r in rows)
    assert telemetry.snapshot().steps == 23  # LightningLoader.step() marked each of 24 steps
    assert len(read_figures(metrics)) == 4  # shardpipes report reads the CSV too
