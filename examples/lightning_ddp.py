"""PyTorch Lightning DDP on 2 CPU processes, with the data from a shardpipes DataLoader2.

    pip install lightning   # with -c constraints.txt in this repository, to keep torch
    python examples/lightning_ddp.py [--epochs 2] [--workers 1]

``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` starts a second process running this
same script and initialises ``torch.distributed`` (gloo) in both. The LightningModule's
``train_dataloader`` returns a ``DataLoader2`` whose ``DistributedReadingService`` uses that
process group: it splits the shards between the two ranks and makes them yield the same number
of batches each epoch (the shards here are deliberately uneven), so DDP's gradient all-reduce
never waits for a rank that has run out.

Lightning accepts any iterable as a training loader and leaves it alone: it injects its
``DistributedSampler`` only into ``torch.utils.data.DataLoader``, and re-iterates the same
object each epoch, which is the next epoch for ``DataLoader2`` (seeded once in ``setup``).
It also checkpoints the loader's ``state_dict()``, fetched one batch ahead of the step: the
loader goes to Lightning wrapped in ``shardpipes.lightning.LightningLoader``, told in
``on_before_batch_transfer`` which batch a step takes, so a resumed run neither skips nor
repeats a batch (docs/mixing.md, "With Lightning").
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
from typing import Any

import lightning as L
import torch

from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.lightning import LightningLoader
from shardpipes.synthetic import write_synthetic

FEATURES = 32
CLASSES = 10


def to_tensors(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Payload bytes as features, with a bump at the label so the model has something to learn."""
    x = torch.frombuffer(bytearray(sample[".bin"][:FEATURES]), dtype=torch.uint8).float() / 255.0
    x[sample[".cls"]] += 1.0
    return x, torch.tensor(sample[".cls"])


def build_pipeline(pattern: str, batch_size: int) -> Any:
    """Shards -> ``[features, labels]`` batches, made in the worker processes."""
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(to_tensors)
        .shuffle(buffer_size=100)
        .batch(batch_size)
        .collate()
    )


class Classifier(L.LightningModule):
    """A linear classifier; owns its data: shards written in ``setup``, a DataLoader2 to read them."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.model = torch.nn.Linear(FEATURES, CLASSES)
        self.dl: DataLoader2[Any] | None = None
        self.batches_in: LightningLoader[Any] | None = None
        self.tmp: str | None = None
        self.batches = 0
        self.loss_sum = 0.0

    def setup(self, stage: str) -> None:
        # Runs on every rank once the process group exists: rank 0 writes the data, and the
        # folder reaches the others through Lightning's own broadcast.
        folder = self.args.data
        if folder is None and self.global_rank == 0:
            folder = self.tmp = tempfile.mkdtemp(prefix="shardpipes-lightning-example-")
        if self.global_rank == 0 and not glob.glob(os.path.join(folder, "train-*.tar")):
            counts = [self.args.samples + 7 * i for i in range(self.args.shards)]
            write_synthetic(folder, shards=self.args.shards, samples=counts)
        folder = self.trainer.strategy.broadcast(folder, src=0)
        shards = len(glob.glob(os.path.join(folder, "train-*.tar")))
        pattern = f"{folder}/train-{{000000..{shards - 1:06d}}}.tar"
        rs = SequentialReadingService(
            DistributedReadingService(),  # uses the process group Lightning started
            MultiProcessingReadingService(num_workers=self.args.workers),
        )
        self.dl = DataLoader2(build_pipeline(pattern, self.args.batch_size), reading_service=rs)
        self.dl.seed(0)  # once: each pass over the loader is the next epoch, in a new order

    def train_dataloader(self) -> LightningLoader[Any]:
        if self.dl is None:
            raise RuntimeError("setup() was not called")
        # Lightning checkpoints the loader's state; LightningLoader makes it the state after the
        # last batch a step took (Lightning fetches one ahead) and keeps every rank's.
        self.batches_in = LightningLoader(self.dl)
        return self.batches_in

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training and self.batches_in is not None:
            self.batches_in.step()  # a step takes this batch
        return batch

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.batches += 1
        self.loss_sum += loss.item()
        return loss

    def on_train_epoch_end(self) -> None:
        # One write per line, so the two ranks' lines do not run into each other.
        sys.stdout.write(
            f"rank {self.global_rank} epoch {self.current_epoch}: {self.batches} batches, "
            f"mean loss {self.loss_sum / max(self.batches, 1):.4f}\n"
        )
        sys.stdout.flush()
        self.batches, self.loss_sum = 0, 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def teardown(self, stage: str) -> None:
        if self.dl is not None:
            self.dl.shutdown()  # stops the worker processes
            self.dl = None
        self.trainer.strategy.barrier()  # nobody removes the data while another rank reads it
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: 2)")
    p.add_argument(
        "--data",
        default=None,
        help="folder with train-*.tar shards, written by rank 0 if it has none; both ranks must "
        "see it (default: a temporary folder, removed at the end)",
    )
    p.add_argument("--workers", type=int, default=1, help="worker processes per rank (default: 1)")
    p.add_argument("--shards", type=int, default=5, help="shards to write (default: 5)")
    p.add_argument(
        "--samples",
        type=int,
        default=60,
        help="samples in the first shard; shard i has SAMPLES + 7*i (default: 60)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="batch size (default: 16)")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    L.seed_everything(0, verbose=False)  # the same initial weights on both ranks
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(args))


if __name__ == "__main__":
    main(parse_args())
