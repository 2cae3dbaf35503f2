"""The loader's figures in a Lightning ``Trainer``'s logger, then drawn by ``shardpipes report``.

``TelemetryCallback`` logs the figures of every ``--every`` steps to the Trainer's loggers
(here a ``CSVLogger``); ``LightningLoader.step()`` marks each step, so the wait is a share of
step time. Afterwards ``shardpipes report <metrics.csv>`` draws wait per step and samples per
second per stage::

    python examples/telemetry_lightning.py [--out lightning_logs] [--workers 2] [--every 10]
    shardpipes report lightning_logs/telemetry/version_0/metrics.csv
"""

from __future__ import annotations

import argparse
import tempfile

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.lightning import LightningLoader
from shardpipes.monitor.lightning_callback import TelemetryCallback
from shardpipes.synthetic import write_synthetic


def to_tensor(sample: dict) -> torch.Tensor:
    """The payload as a float tensor of 2,000 values."""
    return torch.frombuffer(bytearray(bytes(sample[".bin"])), dtype=torch.uint8).float() / 255


class Model(pl.LightningModule):
    def __init__(self, batches: LightningLoader) -> None:
        super().__init__()
        self.batches = batches
        self.layer = torch.nn.Linear(2000, 1)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        if self.trainer.training:
            self.batches.step()  # a step takes this batch (and marks the step for telemetry)
        return batch

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return self.batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="lightning_logs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        shards = write_synthetic(folder, shards=4, samples=args.samples // 4, payload_bytes=2000)
        graph = (
            IterableWrapper(shards)
            .sharding_filter()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .map(to_tensor)
            .batch(32)
            .collate()
        )
        dl = DataLoader2(graph, reading_service=MultiProcessingReadingService(args.workers))
        telemetry = dl.watch()
        logger = CSVLogger(args.out, name="telemetry")
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            logger=logger,
            callbacks=[TelemetryCallback(telemetry, every_n_steps=args.every)],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        batches = LightningLoader(dl)
        trainer.fit(Model(batches))
        batches.shutdown()
    print(f"figures in {logger.log_dir}/metrics.csv")


if __name__ == "__main__":
    main()
