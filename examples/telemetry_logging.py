"""Is training data-bound? The loader's figures in the log while a (fake) training loop runs.

A graph with a deliberately costly ``map`` (an augmentation that hashes each sample) runs in
worker processes; ``dl.watch()`` turns telemetry on, ``LoggingSink`` logs the figures of every
``--every`` steps (verdict first), and the run ends with the verdict of the whole run::

    python examples/telemetry_logging.py [--workers 2] [--samples 2000] [--every 20]

See docs/telemetry.md for what each figure means and the rules of the verdict.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import tempfile
import time

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.telemetry import verdict
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.monitor import LoggingSink
from shardpipes.synthetic import write_synthetic


def augment(sample: dict) -> dict:
    """A costly augmentation: hashes the payload 1,500 times."""
    digest = bytes(sample[".bin"])
    for _ in range(1500):
        digest = hashlib.sha256(digest).digest()
    return {**sample, "digest": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--every", type=int, default=20, help="steps between two log lines")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    with tempfile.TemporaryDirectory() as folder:
        shards = write_synthetic(folder, shards=4, samples=args.samples // 4, payload_bytes=2000)
        graph = (
            IterableWrapper(shards)
            .sharding_filter()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .shuffle(buffer_size=100)
            .map(augment)
            .batch(16)
        )
        dl = DataLoader2(graph, reading_service=MultiProcessingReadingService(args.workers))
        telemetry = dl.watch()  # before the first epoch
        sink = LoggingSink(telemetry, steps=args.every)
        with dl:
            for _batch in dl:
                time.sleep(0.002)  # the training step
                telemetry.step()  # where a step ends: the wait's share of step time
                sink.step()
            print(f"verdict: {verdict(telemetry.snapshot()).text}")


if __name__ == "__main__":
    main()
