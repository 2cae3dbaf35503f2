"""The loader's figures as TensorBoard scalars, next to the loss, through torch's ``SummaryWriter``.

Needs the ``tensorboard`` package. Writes the scalars ``data/wait_share``,
``data/samples_per_s``, ``data/stage_us/<stage>``, ... every ``--every`` steps into
``--logdir``; look at them with ``tensorboard --logdir runs``::

    python examples/telemetry_tensorboard.py [--logdir runs] [--workers 2] [--every 10]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.tensorboard import SummaryWriter

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.telemetry import verdict
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.monitor import TensorBoardSink
from shardpipes.synthetic import write_synthetic


def to_tensor(sample: dict) -> torch.Tensor:
    """The payload as a float tensor of 2,000 values."""
    return torch.frombuffer(bytearray(bytes(sample[".bin"])), dtype=torch.uint8).float() / 255


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()

    model = torch.nn.Linear(2000, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    writer = SummaryWriter(args.logdir)
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
        sink = TensorBoardSink(telemetry, writer, steps=args.every)
        with dl:
            for step, batch in enumerate(dl):
                loss = model(batch).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                writer.add_scalar("loss", loss.item(), step)
                telemetry.step()
                sink.step()
            print(f"verdict: {verdict(telemetry.snapshot()).text}")
    writer.close()
    print(f"scalars in {args.logdir}")


if __name__ == "__main__":
    main()
