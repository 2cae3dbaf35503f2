"""Ray Train: a TorchTrainer with 2 CPU workers, each reading its part of the shards with shardpipes.

    pip install "ray[train]"   # with -c constraints.txt in this repository, to keep torch
    python examples/ray_train.py [--epochs 2] [--workers 1]

The example starts a local Ray instance bound to 127.0.0.1 (no dashboard, no usage report),
writes a few synthetic shards of uneven sizes to a temporary folder, and runs
``TorchTrainer(..., scaling_config=ScalingConfig(num_workers=2, use_gpu=False))``. Ray starts
``torch.distributed`` (gloo) in its workers; each builds the shardpipes graph and a
``DataLoader2`` whose ``DistributedReadingService`` uses that process group: it splits the
shards between the Ray workers and makes them yield the same number of batches per epoch.

On a real cluster, put the shards where every node sees them (``s3://...``, a shared file
system) and pass ``--data`` (a folder) or change ``pattern``; connect with
``ray.init(address="auto")`` instead of starting a local instance.

With ``--ray-readers N`` the readers leave the trainers: each rank's ``--workers`` logical
readers run on a pool of N Ray reader actors (``RayReadingService``,
docs/disaggregated-reading.md), and the batches are those the worker processes would have made.
The graph then reads with a shard index (``sharding_by_index``), built once here. On a cluster,
give ``reader_options`` a resource only the CPU nodes have, so readers run there.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.raypool import RayReadingService
from shardpipes.synthetic import write_synthetic

FEATURES = 32
CLASSES = 10


def to_tensors(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Payload bytes as features, with a bump at the label so the model has something to learn."""
    x = torch.frombuffer(bytearray(sample[".bin"][:FEATURES]), dtype=torch.uint8).float() / 255.0
    x[sample[".cls"]] += 1.0
    return x, torch.tensor(sample[".cls"])


def build_pipeline(pattern: str, batch_size: int, *, indexed: bool = False) -> Any:
    """Shards -> ``[features, labels]`` batches, made in the worker processes (or reader actors)."""
    shards = IterableWrapper([pattern]).shard_expand().shuffle()
    return (
        (shards.sharding_by_index() if indexed else shards.sharding_filter())
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(to_tensors)
        .shuffle(buffer_size=100)
        .batch(batch_size)
        .collate()
    )


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker, after Ray has initialised torch.distributed."""
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(FEATURES, CLASSES)
    model = ray.train.torch.prepare_model(net)  # wrapped in DDP (CPU, gloo)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    start_epoch = 0
    restored = ray.train.get_checkpoint()  # set when Ray restarts the run after a failure
    if restored is not None:
        with restored.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    readers: Any = MultiProcessingReadingService(num_workers=config["workers"])
    if config["ray_readers"]:  # the same logical readers, on a pool of Ray actors
        readers = RayReadingService(
            config["workers"],
            pool="shardpipes-example",
            readers=config["ray_readers"],
            reader_options={"num_cpus": 0.5},
        )
    rs = SequentialReadingService(
        DistributedReadingService(),  # the process group Ray started
        readers,
    )
    graph = build_pipeline(
        config["pattern"], config["batch_size"], indexed=bool(config["ray_readers"])
    )
    with DataLoader2(graph, reading_service=rs) as dl:
        for epoch in range(start_epoch, config["epochs"]):
            dl.seed(epoch)  # the same on every worker; a new order each epoch
            batches, loss_sum = 0, 0.0
            for x, y in dl:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()  # DDP's all-reduce: every worker must take every step
                opt.step()
                batches += 1
                loss_sum += loss.item()
            # Ray keeps rank 0's metrics: gather every rank's figures for it to report.
            mine = {f"batches_rank{rank}": batches, f"loss_rank{rank}": loss_sum / max(batches, 1)}
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            metrics = {"epoch": epoch, **{k: v for ranks in everyone for k, v in ranks.items()}}
            with tempfile.TemporaryDirectory() as d:
                checkpoint = None
                if rank == 0:  # the weights are the same on every rank
                    state = {
                        "epoch": epoch,
                        "model": net.state_dict(),
                        "optimizer": opt.state_dict(),
                    }
                    torch.save(state, os.path.join(d, "state.pt"))
                    checkpoint = ray.train.Checkpoint.from_directory(d)
                ray.train.report(metrics, checkpoint=checkpoint)  # every rank calls it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: 2)")
    p.add_argument(
        "--data",
        default=None,
        help="folder with train-*.tar shards, written if it has none; every Ray worker must "
        "see it (default: a temporary folder)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="worker processes per Ray worker (default: 1)"
    )
    p.add_argument("--shards", type=int, default=5, help="shards to write (default: 5)")
    p.add_argument(
        "--samples",
        type=int,
        default=60,
        help="samples in the first shard; shard i has SAMPLES + 7*i (default: 60)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="batch size (default: 16)")
    p.add_argument(
        "--ray-readers",
        type=int,
        default=0,
        help="run each rank's --workers readers on a pool of this many Ray reader actors "
        "(RayReadingService; default: 0, worker processes)",
    )
    return p.parse_args(argv)


def print_epochs(result: Any) -> None:
    """One line per epoch from the metrics reported with each checkpoint."""
    for _, metrics in result.best_checkpoints or []:
        ranks = sorted(
            int(k.removeprefix("batches_rank")) for k in metrics if k.startswith("batches_rank")
        )
        per_rank = ", ".join(
            f"rank {r}: {metrics[f'batches_rank{r}']} batches, mean loss {metrics[f'loss_rank{r}']:.4f}"
            for r in ranks
        )
        print(f"epoch {metrics['epoch']}: {per_rank}")


def main(args: argparse.Namespace) -> int:
    # A Ray instance of this machine only, on the loopback interface: Ray then binds its
    # services and reports its workers' address as 127.0.0.1 (it is how Ray runs on macOS);
    # gloo talks over loopback too; and no usage statistics are sent. Set before Ray starts.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory(prefix="shardpipes-ray-example-") as tmp:
        folder = args.data or os.path.join(tmp, "shards")
        if not glob.glob(os.path.join(folder, "train-*.tar")):
            counts = [args.samples + 7 * i for i in range(args.shards)]
            write_synthetic(folder, shards=args.shards, samples=counts)
        n = len(glob.glob(os.path.join(folder, "train-*.tar")))
        pattern = f"{os.path.abspath(folder)}/train-{{000000..{n - 1:06d}}}.tar"
        if args.ray_readers:  # the readers seek: they need the shard index
            paths = sorted(glob.glob(os.path.join(os.path.abspath(folder), "train-*.tar")))
            if not os.path.exists(default_index_url(paths)):
                build_index(paths, progress=False).save(default_index_url(paths))

        # 4 logical CPUs: the 2 train workers and Ray's controller fit on a 2-core machine.
        # (and half a CPU per reader actor)
        ray.init(num_cpus=4 + (args.ray_readers + 1) // 2, include_dashboard=False)
        try:
            trainer = TorchTrainer(
                train_loop_per_worker,
                train_loop_config={
                    "pattern": pattern,
                    "epochs": args.epochs,
                    "workers": args.workers,
                    "batch_size": args.batch_size,
                    "ray_readers": args.ray_readers,
                },
                scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                run_config=RunConfig(
                    name="shardpipes-example",
                    storage_path=os.path.join(tmp, "ray"),
                    checkpoint_config=CheckpointConfig(num_to_keep=None),  # one per epoch
                ),
            )
            result = trainer.fit()
        finally:
            ray.shutdown()
        print_epochs(result)
    if result.error is not None:
        print(f"error: {result.error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
