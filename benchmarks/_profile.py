"""cProfile of the shardpipes pipeline in-process: top functions and time per source file.

    python benchmarks/bench.py --profile [--presets small]

Runs in a fresh subprocess. It first times one unprofiled epoch, then profiles one epoch;
cProfile adds a fixed cost per Python call, so the shares of many tiny calls are inflated
(compare the two wall times it prints).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _peers  # noqa: E402

TOP = 25


def run(m: dict, args: argparse.Namespace) -> None:
    """Profile in a fresh subprocess and print its report."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(m, f)
    try:
        cmd = [sys.executable, __file__, f.name, str(args.shuffle), str(args.batch)]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        os.unlink(f.name)


def _where(key: tuple[str, int, str]) -> str:
    path, line, func = key
    if path == "~":
        return func  # a builtin, e.g. <method 'read' of '_io.BufferedReader' objects>
    for marker in ("site-packages/", "/pipes/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line}({func})"


def _file(key: tuple[str, int, str]) -> str:
    where = _where(key)
    return where.split(":", 1)[0] if ":" in where else "builtins"


def main() -> None:
    import cProfile
    import pstats

    manifest_path, shuffle, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(manifest_path) as f:
        m = json.load(f)
    cfg = {"peer": "shardpipes", "shuffle": shuffle, "batch": batch}
    _peers.preload("shardpipes")

    dp, _, _ = _peers.shardpipes(m, 0, cfg)
    t0 = time.perf_counter()
    n = sum(len(b) for b in dp)
    plain = time.perf_counter() - t0

    dp, _, _ = _peers.shardpipes(m, 0, cfg)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    n2 = sum(len(b) for b in dp)
    prof.disable()
    profiled = time.perf_counter() - t0
    assert n == n2 == m["samples"], (n, n2, m["samples"])

    stats = pstats.Stats(prof).stats  # key -> (primitive calls, calls, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    print(
        f"\nshardpipes in-process, {m['preset']['name']} ({n:,} samples, {m['bytes'] / 1e6:,.0f} MB): "
        f"{n / plain:,.0f} samples/s unprofiled ({plain:.2f} s), {profiled:.2f} s under cProfile "
        f"(sum of own times {total:.2f} s)\n"
    )
    print(f"Top {TOP} functions by own time (share of the profiled total):\n")
    print("| share | own s | cum s | calls | function |")
    print("|---|---|---|---|---|")
    for key, (_, calls, tt, ct, _) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:TOP]:
        print(f"| {tt / total:.1%} | {tt:.3f} | {ct:.3f} | {calls:,} | `{_where(key)}` |")
    by_file: dict[str, float] = {}
    for key, v in stats.items():
        by_file[_file(key)] = by_file.get(_file(key), 0.0) + v[2]
    print("\nOwn time by source file:\n")
    print("| share | own s | file |")
    print("|---|---|---|")
    for name, tt in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        print(f"| {tt / total:.1%} | {tt:.3f} | `{name}` |")
    print("\nCumulative time of the stages (inclusive of everything they call):\n")
    print("| share of wall | cum s | function |")
    print("|---|---|---|")
    wanted = (
        "iter_tar",
        "_iter_mapped",
        "scan",
        "members",
        "_entries",
        "__iter__",
        "_check_sums",
        "_json",
    )
    cum = [
        (v[3], key)
        for key, v in stats.items()
        if key[2] in wanted
        and ("shardpipes" in key[0] or "datapipes" in key[0] or "json" in key[0])
    ]
    for ct, key in sorted(cum, reverse=True)[:12]:
        print(f"| {ct / profiled:.1%} | {ct:.3f} | `{_where(key)}` |")


if __name__ == "__main__":
    main()
