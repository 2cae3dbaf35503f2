"""A scheduled mixture under PyTorch Lightning DDP on 2 CPU processes, checkpointed and resumed.

    pip install lightning   # with -c constraints.txt in this repository, to keep torch
    python examples/lightning_mixing.py --data DIR --steps 10 --save-every 5 --seen whole
    python examples/lightning_mixing.py --data DIR --steps 10 --resume CKPT --seen tail

Two sources (an indexed shard list each) are mixed with weights that change at a step; each
rank reads its share through ``SequentialReadingService(DistributedReadingService(), ...)``.
Lightning saves the training loader's ``state_dict()`` in its checkpoints and restores it on
``fit(ckpt_path=...)``; two things make that exact (docs/mixing.md, "With Lightning"):

- Lightning fetches a batch ahead of the step it runs, so the loader's own state is a batch
  past the last step; ``LightningLoader`` gives Lightning the state after the last batch a step used.
- Lightning writes rank 0's checkpoint only, and a loader state is refused on another rank
  than the one that saved it; ``LightningLoader`` gathers every rank's state into the checkpoint, and
  each rank takes its own back.

``--seen NAME`` writes each rank's samples, in the order its steps took them, to
``NAME-<rank>.json`` (``tests/test_examples.py`` compares a run resumed from a checkpoint
with one that ran straight through).
"""

from __future__ import annotations

import argparse
import json
import os
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
from shardpipes.index import build_index
from shardpipes.lightning import LightningLoader
from shardpipes.synthetic import write_synthetic

BATCH = 8  # per rank: a step is 2 x 8 samples


class Tag:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: dict[str, Any]) -> str:
        return f"{self.name}{sample['.json']['id']}"


def graph(folder: str) -> Any:
    def source(name: str) -> Any:
        urls = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.startswith(name))
        return (
            IterableWrapper(urls)
            .shuffle()
            .sharding_by_index(build_index(urls, progress=False))
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .decode()
            .map(Tag(name))
        )

    schedule = [(0, [0.8, 0.2]), (6, [0.3, 0.7])]
    mixed = source("a").mix(
        source("b"), schedule=schedule, step_samples=2 * BATCH, samples_per_epoch=256
    )
    return mixed.batch(BATCH)


class Mixture(L.LightningDataModule):
    def __init__(self, folder: str, workers: int) -> None:
        super().__init__()
        self.folder = folder
        self.workers = workers
        self.batches: LightningLoader | None = None

    def train_dataloader(self) -> LightningLoader:
        service = SequentialReadingService(
            DistributedReadingService(),  # the process group Lightning started
            MultiProcessingReadingService(num_workers=self.workers),
        )
        loader = DataLoader2(graph(self.folder), reading_service=service)
        loader.seed(1234)
        self.batches = LightningLoader(loader)
        return self.batches

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training and self.batches is not None:
            self.batches.step()  # a step takes this batch
        return batch

    def teardown(self, stage: str) -> None:
        if self.batches is not None:
            self.batches.shutdown()


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.seen: list[str] = []

    def training_step(self, batch: list[str], batch_idx: int) -> torch.Tensor:
        self.seen += batch
        return self.linear(torch.ones(len(batch), 1)).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder for the two sources' shards")
    p.add_argument("--steps", type=int, default=10, help="steps to train to (default: 10)")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps")
    p.add_argument("--ckpt-dir", default="ckpt", help="where checkpoints go (default: ckpt)")
    p.add_argument("--resume", default=None, help="a checkpoint to resume from")
    p.add_argument("--workers", type=int, default=1, help="worker processes per rank")
    p.add_argument("--seen", default=None, help="write each rank's samples to SEEN-<rank>.json")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    if "LOCAL_RANK" not in os.environ and not os.path.isdir(args.data):
        # The launching process (rank 0, before Lightning starts rank 1) writes the data.
        write_synthetic(args.data, shards=2, samples=64, prefix="a")
        write_synthetic(args.data, shards=2, samples=64, prefix="b", seed=1)
    L.seed_everything(0, verbose=False)
    save = (
        [
            L.pytorch.callbacks.ModelCheckpoint(
                args.ckpt_dir, every_n_train_steps=args.save_every, save_top_k=-1
            )
        ]
        if args.save_every
        else []
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        callbacks=save,
        logger=False,
        enable_checkpointing=bool(save),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    trainer.fit(model, datamodule=Mixture(args.data, args.workers), ckpt_path=args.resume)
    if args.seen:
        with open(f"{args.seen}-{trainer.global_rank}.json", "w", encoding="utf-8") as f:
            json.dump(model.seen, f)
    print(f"rank {trainer.global_rank}: {len(model.seen) // BATCH} steps", flush=True)


if __name__ == "__main__":
    main(parse_args())
