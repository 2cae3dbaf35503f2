"""Instructions per sample of one peer's in-process epoch, counted by callgrind (load-independent).

On a machine shared with other work, CPU time per sample moves by a factor of two from run to
run; the count of instructions does not. This runs a peer of ``bench.py`` (``_peers.py``,
``_peers_native.py``: the same graph, the same item function) for two epochs under
``valgrind --tool=callgrind`` and reports the instructions of the second epoch per sample, so
that start-up (imports, the first open of every shard) is left out::

    python benchmarks/instructions.py --peer shardpipes_idx
    python benchmarks/instructions.py --peer litdata_bare      # in the peers' venv (bench.py makes it)

The preset's shards (and LitData's chunks, and the index) must exist: run ``bench.py --presets
small --peers shardpipes_idx,litdata_bare --trials 1`` once first. Instructions are not time:
the two loaders' instructions need not cost the same per instruction (memory traffic, page
faults and the kernel's share are not counted), so read this beside ``bench.py``'s CPU time.
Needs ``valgrind``; a run takes minutes (callgrind runs code about 50 times slower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _child(peer: str, manifest: str, epochs: int) -> None:
    """Run ``epochs`` epochs of ``peer``; callgrind dumps its counts at each ``getppid()``."""
    sys.path.insert(0, HERE)
    import _peers

    with open(manifest) as f:
        m = json.load(f)
    _peers.preload(peer, m)
    iterable, close, _ = _peers.PEERS[peer](m, 0, {"peer": peer, "shuffle": 1000, "batch": 64})
    try:
        for _ in range(epochs):
            n = sum(map(len, iterable))
            print(f"SAMPLES {n}", flush=True)
            os.getppid()  # the dump point (--dump-before=getppid)
    finally:
        close()


def newest_small() -> str:
    """The newest ``.bench/data/small-*`` folder (``bench.py --presets small`` writes it)."""
    root = os.path.join(REPO, ".bench", "data")
    found = sorted(
        (os.path.join(root, d) for d in os.listdir(root) if d.startswith("small-")),
        key=os.path.getmtime,
    )
    if not found:
        raise SystemExit("no .bench/data/small-*: run bench.py --presets small first")
    return found[-1]


def manifest_for(data: str, peer: str) -> str:
    """The preset's manifest with where LitData's chunks are (as ``bench.py`` adds it)."""
    with open(os.path.join(data, "manifest.json")) as f:
        m = json.load(f)
    lit = os.path.join(data, "native", "litdata")
    if os.path.isdir(lit):
        m["native"] = {"litdata": {"dir": lit}}
    fd, path = tempfile.mkstemp(suffix=".json", prefix=f"manifest-{peer}-")
    with os.fdopen(fd, "w") as f:
        json.dump(m, f)
    return path


def _summary(path: str) -> int:
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no summary line")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", default="shardpipes_idx", help="a peer of bench.py, in-process")
    ap.add_argument("--data", help="the preset's folder (default: the newest .bench/data/small-*)")
    ap.add_argument(
        "--python", help="the interpreter (default: this one; the peers' venv for LitData)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--manifest", help=argparse.SUPPRESS)
    ap.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="epochs in the process (default: 2); every epoch after the first is counted alone",
    )
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch holds the start-up)")
    if args.child:
        _child(args.peer, args.manifest, args.epochs)
        return
    data = args.data or newest_small()
    python = args.python
    if python is None:
        venv = os.path.join(REPO, ".bench", "venv-peers", "bin", "python")
        python = venv if args.peer.startswith("litdata") else sys.executable
    manifest = manifest_for(data, args.peer)
    out = tempfile.mkdtemp(prefix="callgrind-")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--dump-before=getppid",
        f"--callgrind-out-file={out}/cg.out",
        python,
        os.path.abspath(__file__),
        "--child",
        f"--peer={args.peer}",
        f"--manifest={manifest}",
        f"--epochs={args.epochs}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    counts = [int(x.split()[1]) for x in done.stdout.splitlines() if x.startswith("SAMPLES ")]
    if done.returncode != 0 or len(counts) != args.epochs:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    # Dump 1: start-up and epoch 1; dump k: epoch k alone.
    for epoch in range(2, args.epochs + 1):
        n = _summary(f"{out}/cg.out.{epoch}")
        print(
            f"{args.peer}: {n / counts[epoch - 1]:,.0f} instructions per sample "
            f"(epoch {epoch}: {counts[epoch - 1]:,} samples, {n:,} instructions; {data})"
        )
    os.unlink(manifest)


if __name__ == "__main__":
    main()
