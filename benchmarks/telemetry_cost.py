"""What telemetry costs on the small preset: instructions (callgrind) and the sampler's own CPU.

The machine this was measured on was shared (two cores, six people), so wall times are noise.
One epoch of the README graph (small preset, shuffle 1000, batch 64) through DataLoader2::

    valgrind --tool=callgrind --callgrind-out-file=cg.%p \\
        python benchmarks/telemetry_cost.py MODE [--workers W]

MODE, for callgrind:

- ``setup``: everything but the epoch (imports, the graph, the loader): subtracted from the
  others, so the figures are those of the epoch alone;
- ``off``: telemetry off (the default);
- ``hooks``: ``dl.watch(interval=None)``: every hook on (the wait around each batch, the
  worker's report per bundle, the storage counters), no stack sampler.

``setup`` and ``off`` also run on a shardpipes without telemetry (``PYTHONPATH`` of another
checkout): the default's cost against the code before it.

MODE, without valgrind (the stack sampler runs on wall-clock time, which valgrind stretches
fifty-fold, so its instruction count under valgrind says nothing):

- ``sampler``: ``dl.watch()`` (the default 10 ms interval); prints what the samplers' own
  threads used (their CPU clocks, wake-ups included) against the CPU they sampled;
- ``ab``: epochs with telemetry off and fully on, alternating in one run; CPU of the process and
  its reaped workers, medians and their ratio.

docs/telemetry.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _data  # noqa: E402


def _loader(m: dict, workers: int):
    from shardpipes.dataloader2 import (
        DataLoader2,
        InProcessReadingService,
        MultiProcessingReadingService,
    )
    from shardpipes.datapipes.iter import IterableWrapper

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
        MultiProcessingReadingService(num_workers=workers) if workers else InProcessReadingService()
    )
    return DataLoader2(dp, reading_service=rs)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def same_run(m: dict, workers: int, rounds: int) -> None:
    """Epochs with telemetry off and on (the default sampler), alternating, each a new loader."""
    spent: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            dl = _loader(m, workers)
            if mode == "on":
                dl.watch()
            t0 = _cpu()
            with dl:
                n = sum(len(b) for b in dl)
            spent[mode].append(_cpu() - t0)  # the workers are reaped at shutdown: counted
            assert n == m["samples"]
    off, on = statistics.median(spent["off"]), statistics.median(spent["on"])
    print(f"workers={workers}: CPU s off {spent['off']}, on {spent['on']}")
    print(f"median CPU s: off {off:.3f}, on {on:.3f}, on/off {on / off:.4f}")


def sampler_cost(m: dict, workers: int) -> None:
    """One epoch with the default sampler; the samplers' own CPU against the CPU they sampled."""
    dl = _loader(m, workers)
    telemetry = dl.watch()
    with dl:
        n = sum(len(b) for b in dl)
        snap = telemetry.snapshot()
    assert n == m["samples"]
    sampled = sum(s.cpu for s in snap.stages)
    print(
        f"workers={workers}: {snap.ticks} looks, samplers' CPU {1e3 * snap.sampler_cpu:.1f} ms, "
        f"sampled CPU {sampled:.3f} s: {snap.sampler_share:.3%} of it, "
        f"{1e6 * snap.sampler_cpu / max(snap.ticks, 1):.1f} us per look"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("setup", "off", "hooks", "sampler", "ab"))
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5, help="mode ab: rounds of off/on")
    ap.add_argument(
        "--cache-dir", default=os.path.join(os.path.dirname(HERE), ".bench", "data")
    )  # bench.py's
    args = ap.parse_args()
    m = _data.ensure_dataset(_data.PRESETS["small"], args.cache_dir, log=lambda *a: None)
    if args.mode == "ab":
        return same_run(m, args.workers, args.rounds)
    if args.mode == "sampler":
        return sampler_cost(m, args.workers)
    dl = _loader(m, args.workers)
    telemetry = dl.watch(interval=None) if args.mode == "hooks" else None
    n = 0
    with dl:
        for batch in dl if args.mode != "setup" else ():
            n += len(batch)
    assert n == (m["samples"] if args.mode != "setup" else 0), (n, m["samples"])
    counted = f", {telemetry.snapshot().samples} counted" if telemetry is not None else ""
    print(f"{args.mode}: {n} samples{counted}")


if __name__ == "__main__":
    main()
