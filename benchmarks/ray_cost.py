"""Trainer CPU per batch under RayReadingService, against Ray's raw transfer of the same bytes.

    python benchmarks/ray_cost.py [--batches 400] [--batch-bytes 262144] [--readers 2] [--rounds 3]

One local Ray instance (127.0.0.1, no dashboard), one trainer process. Each round runs both
sides, one after the other (service, raw, service, raw, ...), so the machine's other work falls
on both alike:

- ``service``: one epoch of a ``DataLoader2`` with ``RayReadingService(--readers)`` (as many
  logical readers, on as many reader actors) over indexed synthetic shards whose batches hold
  ``--batch-bytes`` of payload (``--batch-size`` ``bytes`` samples). The readers send
  ``--bundle`` batches per message (a ``Bundle``). The trainer takes each message with
  ``ray.wait`` on the lease's generator when it is not ready yet, ``next()`` and one ``ray.get``,
  hands it to the dealer, and yields its batches through the loader.
- ``raw``: the same number of batches of the same shape and bytes (made once by the same graph
  in this process), put in a Ray actor that yields them ``--bundle`` per message from a
  streaming generator; the trainer does ``ray.get(next(generator))`` per message and nothing else.

On both sides every message is made before the trainer starts counting (``--settle`` seconds
of wait after the first batch; the readers may run ahead a whole epoch): a trainer that waits
for its readers spends CPU in Ray's waiting, which is not what is measured here. On both sides
the trainer drops each batch once counted (as a training step does: keeping them all would make
the measured side pay for fresh pages). Measured: ``time.process_time`` of the trainer (every
thread of the process, Ray's own included), per batch, and the main thread's share
(``time.thread_time``). Prints each round and the ratio service / raw of each round.

``--keep``: also measure, in each round, the service side keeping every batch until the epoch
ends, as this benchmark did before (its 1.9-2.5x came from that: the kept 100 MiB cost fresh
pages on the service side only).

``--profile``: cProfile of the service side's trainer loop in the last round (where it goes).

The machine this was written on had 2 cores shared with other work: read the ratios of the
same rounds, not the absolute figures.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from shardpipes.dataloader2 import DataLoader2
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.raypool import RayReadingService
from shardpipes.synthetic import write_synthetic


def payload(sample: dict[str, Any]) -> bytes:
    return bytes(sample[".bin"])


class Replay:
    """An actor that yields given batches ``bundle`` per message (Ray's raw transfer)."""

    def run(self, batches: list[Any], bundle: int) -> Any:
        for i in range(0, len(batches), bundle):
            yield batches[i : i + bundle]


def _measure(
    it: Any, prof: cProfile.Profile | None = None, *, keep: bool = False
) -> tuple[int, float, float]:
    """Consume ``it``, dropping (or keeping) each batch: ``(batches, process CPU s, main-thread CPU s)``."""
    n = 0
    kept = []
    cpu0, thread0 = time.process_time(), time.thread_time()
    if prof is not None:
        prof.enable()
    for batch in it:
        n += 1
        if keep:
            kept.append(batch)
        del batch
    if prof is not None:
        prof.disable()
    return n, time.process_time() - cpu0, time.thread_time() - thread0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-bytes", type=int, default=256 << 10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--bundle", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=10.0, help="seconds the readers get to fill up")
    p.add_argument("--profile", action="store_true", help="cProfile the service side's last round")
    p.add_argument("--keep", action="store_true", help="also measure the service keeping batches")
    args = p.parse_args()
    import ray

    per_sample = args.batch_bytes // args.batch_size
    samples = args.batches * args.batch_size
    with tempfile.TemporaryDirectory(prefix="sp-raycost-") as tmp:
        shards = 8
        paths = write_synthetic(
            tmp, shards=shards, samples=samples // shards, payload_bytes=per_sample
        )
        build_index(paths, progress=False).save(default_index_url(paths))
        dp = (
            IterableWrapper(paths)
            .sharding_by_index()
            .open_files_by_fsspec()
            .load_from_tar()
            .webdataset()
            .map(payload)
            .batch(args.batch_size)
        )
        batches = list(dp)  # the raw side's batches: the same graph's, made here
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            # Every message may be made ahead (see the module doc).
            ahead = args.batches // (args.bundle * args.readers) + 2
            rs = RayReadingService(
                args.readers,
                pool="cost",
                reader_options={"num_cpus": 0.5},
                bundle=args.bundle,
                prefetch=ahead,
                check_every=1 << 20,
            )
            actor = ray.remote(Replay).options(num_cpus=0.5).remote()
            stored = ray.put(batches)
            rows = []
            prof = None
            with DataLoader2(dp, reading_service=rs) as dl:
                for r in range(args.rounds):
                    kept = None
                    if args.keep:
                        dl.seed(1000 + r)
                        it = iter(dl)
                        next(it)
                        time.sleep(args.settle)
                        kept = _measure(it, keep=True)
                    dl.seed(r)
                    it = iter(dl)
                    next(it)  # the pool is up, the first messages made
                    time.sleep(args.settle)
                    if args.profile and r == args.rounds - 1:
                        prof = cProfile.Profile()
                    service = _measure(it, prof)
                    gen = actor.run.options(
                        num_returns="streaming",
                        _generator_backpressure_num_objects=ahead * args.readers,
                    ).remote(stored, args.bundle)
                    first = ray.get(next(gen))
                    time.sleep(args.settle)
                    raw = _measure(b for ref in gen for b in ray.get(ref))
                    del first
                    rows.append((service, raw, kept))
        finally:
            ray.shutdown()
    mb = args.batch_bytes / 2**20
    print(f"batches of {args.batch_size} samples, {mb:.2f} MiB each; messages of {args.bundle}")
    ratios, kept_ratios = [], []
    for r, (service, raw, kept) in enumerate(rows):
        per = [1e3 * cpu / max(n, 1) for n, cpu, _ in (service, raw)]
        main_thread = [1e3 * th / max(n, 1) for n, _, th in (service, raw)]
        ratio = per[0] / per[1] if per[1] else float("nan")
        ratios.append(ratio)
        line = (
            f"round {r}: service {service[0]} batches, {per[0]:.3f} ms CPU/batch "
            f"(main thread {main_thread[0]:.3f}); raw ray.get {raw[0]} batches, {per[1]:.3f} ms "
            f"CPU/batch (main thread {main_thread[1]:.3f}); ratio {ratio:.2f}"
        )
        if kept is not None:
            per_kept = 1e3 * kept[1] / max(kept[0], 1)
            kept_ratios.append(per_kept / per[1] if per[1] else float("nan"))
            line += f"; service keeping its batches {per_kept:.3f} ms ({kept_ratios[-1]:.2f})"
        print(line)
    for name, found in (("", ratios), (" keeping the batches", kept_ratios)):
        if found:
            print(
                f"ratio service{name} / raw (trainer CPU per batch): median "
                f"{statistics.median(found):.2f} over {len(found)} rounds "
                f"({', '.join(f'{x:.2f}' for x in found)})"
            )
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
