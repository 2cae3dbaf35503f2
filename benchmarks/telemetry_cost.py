"""What telemetry costs on the small preset, in instructions (callgrind), not seconds.

The machine this was measured on was shared (two cores, six people), so times are noise;
instruction counts are not. One epoch of the README graph (small preset, shuffle 1000, batch
64) through DataLoader2, run under callgrind in each mode::

    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=cg.%p \\
        python benchmarks/telemetry_cost.py MODE [--workers W]

MODE:

- ``setup``: everything but the epoch (imports, the graph, the loader): subtracted from the
  others, so the figures are those of the epoch alone;
- ``off``: telemetry off (the default);
- ``hooks``: ``dl.watch(interval=None)``: every hook on (the wait around each batch, the
  worker's report per bundle, the storage counters), no stack sampler;
- ``ticks``: as ``hooks``, plus one stack sample (``StageSampler.tick``) of the loop's own
  stack every ``--every`` samples, taken from inside the graph, so the count is fixed.

``(ticks - hooks) / number of ticks`` is what one look of the sampler costs; at the default
interval (10 ms) a busy loader thread is looked at 100 times per CPU-second, so the sampler's
share of the loader's CPU is ``100 x instructions per tick / instructions per CPU-second``.
``off`` and ``setup`` also run on a shardpipes without telemetry (``PYTHONPATH`` of another
checkout): the default's cost against the code before it. ``--native`` runs a mode without valgrind and prints its CPU seconds, for the instructions per
CPU-second. docs/telemetry.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _data  # noqa: E402

_RUN: dict = {"n": 0, "ticks": 0}  # the loader deep-copies the graph: state lives here


class Ticker:
    """A map that takes one stack sample every ``every`` samples (a fixed number of looks)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def __call__(self, sample):
        _RUN["n"] += 1
        if _RUN["n"] % self.every == 0:
            sampler = _RUN.get("sampler")
            if sampler is None:  # over the graph the loader runs (its lean copy)
                # imported here, so that `off` also runs on a shardpipes without telemetry
                from shardpipes.dataloader2.telemetry import StageSampler

                sampler = _RUN["sampler"] = StageSampler(_RUN["loader"]._graph, 0.01)
            sampler.tick(sys._getframe())
            _RUN["ticks"] += 1
        return sample


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("setup", "off", "hooks", "ticks", "ab"))
    ap.add_argument("--rounds", type=int, default=5, help="mode ab: rounds of off/on")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--every", type=int, default=64, help="samples per tick (mode ticks)")
    ap.add_argument(
        "--cache-dir", default=os.path.join(os.path.dirname(HERE), ".bench", "data")
    )  # bench.py's
    ap.add_argument("--native", action="store_true", help="print the CPU seconds of the run")
    args = ap.parse_args()

    from shardpipes.dataloader2 import (
        DataLoader2,
        InProcessReadingService,
        MultiProcessingReadingService,
    )
    from shardpipes.datapipes.iter import IterableWrapper

    m = _data.ensure_dataset(_data.PRESETS["small"], args.cache_dir, log=lambda *a: None)
    if args.mode == "ab":
        return same_run(m, args.workers, args.rounds)
    ticker = Ticker(args.every)
    dp = (
        IterableWrapper(m["paths"])
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode(image=None)
        .shuffle(buffer_size=1000)
    )
    if args.mode == "ticks":
        dp = dp.map(ticker)
    dp = dp.batch(64)
    rs = (
        MultiProcessingReadingService(num_workers=args.workers)
        if args.workers
        else InProcessReadingService()
    )
    dl = DataLoader2(dp, reading_service=rs)
    _RUN["loader"] = dl  # the sampler's thread is never started: ticks by count
    if args.mode != "off":
        telemetry = dl.watch(interval=None)
    t0 = time.process_time()
    n = 0
    with dl:
        for batch in dl if args.mode != "setup" else ():
            n += len(batch)
    cpu = time.process_time() - t0
    assert n == (m["samples"] if args.mode != "setup" else 0), (n, m["samples"])
    ticks = _RUN["ticks"]
    extra = f", {telemetry.snapshot().samples} counted" if args.mode in ("hooks", "ticks") else ""
    print(
        f"{args.mode}: {n} samples{extra}, {ticks} ticks"
        + (f", {cpu:.3f} CPU s" if args.native else "")
    )


def same_run(m: dict, workers: int, rounds: int) -> None:
    """Epochs with telemetry off and fully on (the default sampler), alternating in one run.

    CPU seconds of this process and its reaped workers per epoch (each epoch a new loader, so
    its workers are reaped and counted); the median of each, and their ratio.
    """
    import statistics

    from shardpipes.dataloader2 import (
        DataLoader2,
        InProcessReadingService,
        MultiProcessingReadingService,
    )
    from shardpipes.datapipes.iter import IterableWrapper

    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    spent: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            dp = (
                IterableWrapper(m["paths"])
                .sharding_filter()
                .open_files_by_fsspec(mode="rb")
                .load_from_tar()
                .webdataset()
                .decode(image=None)
                .shuffle(buffer_size=1000)
                .batch(64)
            )
            rs = (
                MultiProcessingReadingService(num_workers=workers)
                if workers
                else InProcessReadingService()
            )
            dl = DataLoader2(dp, reading_service=rs)
            if mode == "on":
                dl.watch()
            t0 = cpu()
            with dl:
                n = sum(len(b) for b in dl)
            spent[mode].append(cpu() - t0)
            assert n == m["samples"]
    off, on = statistics.median(spent["off"]), statistics.median(spent["on"])
    print(f"workers={workers}: off {spent['off']}, on {spent['on']}")
    print(f"median CPU s: off {off:.3f}, on {on:.3f}, on/off {on / off:.4f}")


if __name__ == "__main__":
    main()
