"""One loader and the floor interleaved in one process: their ratio, block by block, epoch by epoch.

On a shared machine the CPU a sample costs moves by 2x between runs and even between epochs of one
process, for every loader and for the item function alone. Two figures taken at different times
therefore differ by the machine as much as by the code. This runs a peer of ``bench.py``
in-process and, after every block of its batches (1,024 samples by default), the same number of
samples through the ``floor`` (the item function alone over the preset's samples in memory:
``_peers.floor``), timing each block on the process's CPU clock. The ratio of the two within a
block is taken under the same machine conditions; its spread over blocks and epochs shows what
is the loader's own and what is the machine's::

    python benchmarks/paired.py --peer shardpipes_idx --epochs 4
    python benchmarks/paired.py --peer litdata_bare --epochs 4   # in the peers' venv

Prints, per epoch: the loader's and the floor's samples per CPU-second over the epoch, their
ratio, and the 10th/50th/90th percentiles of the per-block ratio. The floor's blocks run on
other samples than the loader's (the floor walks its own copy in a fixed shuffled order).
``--data`` picks the preset folder as ``instructions.py`` does (LitData's chunks in
``native/litdata``). Everything made before the loader (the floor's samples, the imports) is
moved out of the garbage collector's reach (``gc.freeze()``) first.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _run(peer: str, manifest: str, epochs: int, block: int) -> None:
    sys.path.insert(0, HERE)
    import _peers

    with open(manifest) as f:
        m = json.load(f)
    cfg = {"peer": peer, "shuffle": 1000, "batch": 64}
    _peers.preload(peer, m)
    _peers.preload("floor", m)
    # The floor's samples live as long as the process: out of the cyclic collector's reach, so
    # that a full collection during the loader's blocks does not walk them (they are this
    # script's, not the loader's: without this, a full collection in a LitData epoch of
    # ``small`` cost it a fifth of that epoch).
    gc.freeze()
    floor, _, _ = _peers.PEERS["floor"](m, 0, cfg)
    item, samples = floor.item, _peers._FLOOR_SAMPLES
    iterable, close, loader = _peers.PEERS[peer](m, 0, cfg)
    print(f"{peer}: {loader}", flush=True)
    clock, pos = time.process_time, 0
    try:
        for epoch in range(1, epochs + 1):
            batches = iter(iterable)
            own_s = floor_s = 0.0
            own_n = floor_n = 0
            ratios = []
            while True:
                c0 = clock()
                got = sum(len(b) for b in itertools.islice(batches, max(1, block // 64)))
                c1 = clock()
                if not got:
                    break
                if pos + got > len(samples):
                    pos = 0
                for i in range(pos, pos + got, 64):  # lists of 64, made and dropped
                    out = [item(s) for s in samples[i : min(i + 64, pos + got)]]
                del out
                pos += got
                c2 = clock()
                own_s, own_n, floor_s, floor_n = (
                    own_s + c1 - c0,
                    own_n + got,
                    floor_s + c2 - c1,
                    floor_n + got,
                )
                if c1 > c0 and c2 > c1:
                    ratios.append(
                        (c2 - c1) / (c1 - c0)
                    )  # same sample count: loader rate / floor rate
            ratios.sort()
            q = (
                [ratios[int(p * (len(ratios) - 1))] for p in (0.1, 0.5, 0.9)]
                if ratios
                else [0.0] * 3
            )
            own, fl = own_n / own_s, floor_n / floor_s
            print(
                f"epoch {epoch}: {own_n:,} samples; {peer} {own / 1e3:.1f}k, floor {fl / 1e3:.1f}k "
                f"samples per CPU-second; {peer} / floor {own / fl:.3f} (per block p10/p50/p90 "
                f"{q[0]:.3f}/{q[1]:.3f}/{q[2]:.3f}, {len(ratios)} blocks)",
                flush=True,
            )
    finally:
        close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", default="shardpipes_idx", help="a peer of bench.py, in-process")
    ap.add_argument("--data", help="the preset's folder (default: the newest .bench/data/small-*)")
    ap.add_argument(
        "--python", help="the interpreter (default: this one; the peers' venv for LitData)"
    )
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--block", type=int, default=1024, help="samples per block (default: 1024)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--manifest", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _run(args.peer, args.manifest, args.epochs, args.block)
        return
    sys.path.insert(0, HERE)
    import instructions

    data = args.data or instructions.newest_small()
    python = args.python
    if python is None:
        venv = os.path.join(REPO, ".bench", "venv-peers", "bin", "python")
        python = venv if args.peer.startswith("litdata") else sys.executable
    manifest = instructions.manifest_for(data, args.peer)
    try:
        cmd = [python, os.path.abspath(__file__), "--child", f"--peer={args.peer}"]
        cmd += [f"--manifest={manifest}", f"--epochs={args.epochs}", f"--block={args.block}"]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        sys.exit(subprocess.run(cmd, env=env, cwd=REPO).returncode)
    finally:
        os.unlink(manifest)


if __name__ == "__main__":
    main()
