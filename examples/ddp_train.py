"""Train a small classifier with DistributedDataParallel, fed by shardpipes, with checkpoints.

Run on this machine with 2 ranks (CPU, gloo)::

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py --resume   # continue

Rank 0 writes a small synthetic dataset with shards of uneven sizes (unless ``--data`` already
holds shards), every rank streams its part of it through ``DataLoader2`` with
``DistributedReadingService`` (splits the shards across ranks and makes every rank yield the
same number of batches) and ``MultiProcessingReadingService`` (worker processes per rank).
Uneven shards give the ranks uneven amounts of data; without the equal-length guarantee the
rank with more batches would wait forever in DDP's gradient all-reduce for the others.

At the end of every epoch each rank saves ``{checkpoint}/rank{R}.pt`` with the model, the
optimizer and ``dl.state_dict()``. ``--preempt-after N`` saves the same checkpoint after N
steps of this run and exits, as a preempted job would; ``--resume`` then continues with the
next batch, exactly where the interrupted run stopped.

On several nodes, run the same command on each with ``--nnodes``/``--rdzv-endpoint`` and a
``--data`` folder that every node sees at the same path (or change ``pattern`` to an
``s3://`` URL, see ``examples/s3_stream.py``).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic

FEATURES = 32  # payload bytes used as the input vector
CLASSES = 10  # write_synthetic's default number of labels


def to_tensors(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a decoded sample into ``(features, label)``.

    The ``.bin`` payload is random bytes, so on its own it predicts nothing; a bump at the
    label's position gives the linear model a signal to learn, so the loss visibly falls.
    """
    payload = bytearray(sample[".bin"][:FEATURES])
    x = torch.frombuffer(payload, dtype=torch.uint8).float() / 255.0
    label = sample[".cls"]
    x[label] += 1.0
    return x, torch.tensor(label)


def build_pipeline(pattern: str, batch_size: int) -> Any:
    """Shards -> samples -> ``[features (B, 32), labels (B,)]`` batches, made in the workers."""
    return (
        IterableWrapper([pattern])
        .shard_expand()  # one URL per shard
        .shuffle()  # shard order: the same on every rank (shared seed)
        .sharding_filter()  # each (rank, worker) keeps its own shards
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(to_tensors)
        .shuffle(buffer_size=200)  # sample order: seeded per (rank, worker)
        .batch(batch_size)
        .collate()  # list of (x, y) -> [stacked x, stacked y]
    )


def shard_counts(shards: int, samples: int) -> list[int]:
    """Uneven samples per shard (``samples``, ``samples + 7``, ...), so the ranks get uneven data."""
    return [samples + 7 * i for i in range(shards)]


def prepare_data(args: argparse.Namespace, rank: int) -> tuple[str, str | None]:
    """Return the shards' brace pattern (the same on every rank) and a temp dir to remove.

    Rank 0 writes the shards if needed; the others wait for it and get the folder by broadcast.
    """
    made: str | None = None
    box: list[Any] = [None]
    if rank == 0:
        folder = args.data
        if folder is None:
            folder = made = tempfile.mkdtemp(prefix="shardpipes-ddp-example-")
        if not glob.glob(os.path.join(folder, "train-*.tar")):
            write_synthetic(
                folder, shards=args.shards, samples=shard_counts(args.shards, args.samples)
            )
        box[0] = folder
    dist.broadcast_object_list(box, src=0)
    folder = box[0]
    n = len(glob.glob(os.path.join(folder, "train-*.tar")))
    return f"{folder}/train-{{000000..{n - 1:06d}}}.tar", made


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (a crash mid-write leaves the old checkpoint)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def params_checksum(model: torch.nn.Module) -> float:
    """A number that changes with any weight: lets runs be compared for exact equality."""
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(model.parameters())))


def checkpoint(
    model: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    dl: DataLoader2[Any],
    *,
    epoch: int,
    epoch_done: bool,
) -> dict[str, Any]:
    """What to save: weights, optimizer, the loader's position, and where in training we are."""
    return {
        "epoch": epoch,
        "epoch_done": epoch_done,
        "model": model.module.state_dict(),
        "optimizer": opt.state_dict(),
        "loader": dl.state_dict(),
    }


def train(args: argparse.Namespace) -> None:
    """The training loop of one rank."""
    dist.init_process_group("gloo")  # torchrun provides rank, world size and rendezvous
    rank = dist.get_rank()
    pattern, made = prepare_data(args, rank)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ckpt_path = os.path.join(args.checkpoint, f"rank{rank}.pt")

    start_epoch, loader_state = 0, None
    if args.resume:
        ckpt = torch.load(ckpt_path, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if ckpt["epoch_done"]:
            start_epoch = ckpt["epoch"] + 1
        else:  # stopped mid-epoch: the loader state says where
            start_epoch, loader_state = ckpt["epoch"], ckpt["loader"]
        at = loader_state["consumed"] if loader_state else 0
        print(f"rank {rank}: resumed from {ckpt_path}: epoch {start_epoch}, after batch {at}")

    rs = SequentialReadingService(
        DistributedReadingService(), MultiProcessingReadingService(num_workers=args.workers)
    )
    steps = 0  # in this run
    preempted = False
    with DataLoader2(build_pipeline(pattern, args.batch_size), reading_service=rs) as dl:
        for epoch in range(start_epoch, args.epochs):
            before = 0  # batches of this epoch trained on before a resume
            if loader_state is not None:
                # Instead of dl.seed(epoch): the state holds that seed and the batches consumed.
                dl.load_state_dict(loader_state)
                before, loader_state = loader_state["consumed"], None
            else:
                dl.seed(epoch)  # the same on every rank; a new order each epoch
            batches, loss_sum = 0, 0.0
            for x, y in dl:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()  # DDP's all-reduce: every rank must take every step
                opt.step()
                batches += 1
                loss_sum += loss.item()
                steps += 1
                if steps == args.preempt_after:
                    preempted = True  # every rank gets here at the same step: equal lengths
                    break
            done = not preempted
            save_checkpoint(ckpt_path, checkpoint(model, opt, dl, epoch=epoch, epoch_done=done))
            if preempted:
                print(
                    f"rank {rank} epoch {epoch}: preempted after {batches} batches, saved {ckpt_path}"
                )
                break
            resumed = f" ({batches} after the resume)" if before else ""
            print(
                f"rank {rank} epoch {epoch}: {before + batches} batches{resumed}, "
                f"mean loss {loss_sum / max(batches, 1):.4f}"
            )
    if not preempted:
        print(f"rank {rank}: done, weights checksum {params_checksum(model.module):.6f}")
    dist.barrier()  # nobody removes the data while another rank still reads it
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs to train in all (default: 3)")
    p.add_argument(
        "--data",
        default=None,
        help="folder with train-*.tar shards, written by rank 0 if it has none; every rank must "
        "see it (default: a temporary folder, removed at the end)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes per rank (default: 2)")
    p.add_argument("--shards", type=int, default=5, help="shards to write (default: 5)")
    p.add_argument(
        "--samples",
        type=int,
        default=200,
        help="samples in the first shard; shard i has SAMPLES + 7*i (default: 200)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="batch size (default: 16)")
    p.add_argument(
        "--checkpoint",
        default="checkpoints/ddp_train",
        help="folder for the per-rank checkpoints (default: checkpoints/ddp_train)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the checkpoints")
    p.add_argument(
        "--preempt-after",
        type=int,
        default=0,
        metavar="N",
        help="save a checkpoint and stop after N steps of this run, as if preempted (default: off)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse_args())
