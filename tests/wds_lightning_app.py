"""A Lightning app using webdataset's API through ``import shardpipes.webdataset as wds``.

Run by tests/test_wds_lightning.py (``tox -e heavy``): ``Trainer(devices=2, strategy="ddp")``
on CPU starts the second rank itself. The two pipelines are those of a Lightning user who hit
"you need to add an explicit nodesplitter": only the import line differs from webdataset code.
Each rank prints ``rank R epoch E: N batches ids I`` per epoch.

    python tests/wds_lightning_app.py --data DIR --pipeline resampled|equalize
"""

from __future__ import annotations

import argparse
import glob
import sys

import lightning as L
import numpy as np
import torch

import shardpipes.webdataset as wds


def preprocess(sample):
    img, meta = sample
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).float()
    return torch.stack([x[:, :4, :4], x[:, 4:, 4:]]), torch.tensor([meta["id"], meta["id"]])


def to_tensor(img):
    return torch.from_numpy(np.asarray(img, dtype=np.float32).copy()).permute(2, 0, 1)


def meta_id(meta):
    return meta["id"]


def make_loader(urls, pipeline, bs):
    if pipeline == "resampled":
        dataset = (
            wds.WebDataset(urls, resampled=True)
            .shuffle(1000)
            .decode("rgb")
            .to_tuple("png", "json")
            .map(preprocess)
            .with_epoch(6)
        )
        return (
            wds.WebLoader(dataset, batch_size=None, num_workers=2)
            .unbatched()
            .shuffle(1000)
            .batched(bs)
        )
    dataset = (
        wds.WebDataset(urls)
        .decode("pil")
        .to_tuple("png", "json")
        .map_tuple(to_tensor, meta_id)
        .shuffle(5000)
        .batched(bs, partial=False)
    )
    dataset_size = 48
    return wds.WebLoader(dataset, num_workers=2).ddp_equalize(dataset_size // bs)


class Model(L.LightningModule):
    def __init__(self, urls, pipeline, bs):
        super().__init__()
        self.urls, self.pipeline, self.bs = urls, pipeline, bs
        self.lin = torch.nn.Linear(3 * 4 * 4, 2)
        self.batches, self.ids = 0, []

    def train_dataloader(self):
        return make_loader(self.urls, self.pipeline, self.bs)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.pipeline == "equalize":  # WebLoader's default batch_size=1 adds a dimension
            x, y = x[0], y[0]
            x = x[:, :, :4, :4]
        self.batches += 1
        self.ids.extend(int(i) for i in y)
        return self.lin(x.reshape(len(x), -1)).sum()

    def on_train_epoch_end(self):
        ids = ",".join(map(str, sorted(self.ids)))
        sys.stdout.write(
            f"rank {self.global_rank} epoch {self.current_epoch}: {self.batches} batches ids {ids}\n"
        )
        sys.stdout.flush()
        self.batches, self.ids = 0, []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--pipeline", choices=["resampled", "equalize"], required=True)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args()
    urls = sorted(glob.glob(f"{args.data}/*.tar"))
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(urls, args.pipeline, args.batch_size))


if __name__ == "__main__":
    main()
