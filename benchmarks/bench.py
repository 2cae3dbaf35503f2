"""shardpipes against webdataset 1.0.2, wids, torchdata 0.9, LitData, MosaicML streaming,
Megatron-Energon and DALI (CPU) on the same samples, in one run.

    python benchmarks/bench.py                       # small, large, jpeg presets, all peers, 3 trials
    python benchmarks/bench.py --quick               # a few seconds: tiny data, 1 trial
    python benchmarks/bench.py --presets small --peers shardpipes,webdataset --trials 5
    python benchmarks/bench.py --profile             # cProfile of shardpipes in-process, small
    python benchmarks/bench.py --s3                  # and again over loopback S3 (moto)

Every trial is a fresh subprocess (``_runner.py``) running one peer in one mode, one trial at
a time, with the page cache warm (the shards are read once before the first trial). Trials go
round-robin over the peers so that noise from other work on the machine spreads over all of
them; the table shows medians and the spread ((max - min) / median of samples/s).

shardpipes, ``tarfile`` and ``cat`` run with this interpreter; webdataset, wids, torchdata 0.9,
LitData, Mosaic, Energon and DALI run in ``.bench/venv-peers``, created on first use (see
``_venv.py``). LitData, Mosaic, Energon and DALI read the preset's samples in their own format,
written once by their own writer into ``<preset dir>/native/<peer>/`` (``_native.py``); a peer
whose writer fails is reported as not measured, with the writer's error. The ``jpeg`` preset
(photographs, ImageNet's training transform; ``_photos.py``, ``_work.py``) adds the rows
``shardpipes_fused``/``shardpipes_fused_t2`` (shardpipes' ``decode_random_resized_crop``). The
``floor`` row is the item function alone over the samples already in memory (``_peers.py``):
every in-process row is also given as a fraction of it, and, with ``--epochs N``, round by round
and epoch by epoch (``_report.rounds``), so that a machine that slows down between rounds shows
in every row of that round. ``paired.py`` interleaves one loader with the floor in one process. Shards are generated
once into ``.bench/data`` (see ``_data.py``). Neither is tracked by git. What each peer runs,
and how its batches are collated, is in ``_peers.py``; the results and how to read them are in
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _data  # noqa: E402
import _report  # noqa: E402
import _venv  # noqa: E402

ALL_PEERS = _report.ALL_PEERS
IN_PROCESS_ONLY = {
    "floor",
    "cat",
    "s3cat",
    "tarfile",
    "shardpipes_dl2",
    "shardpipes_fused_t2",
    "litdata_bare",
}
# shardpipes' crop-decode stage: the same graph as "shardpipes" where there are no images
JPEG_ONLY = {"shardpipes_fused", "shardpipes_fused_t2", "shardpipes_fused_u8"}
WORKERS_ONLY = {"torchdata09_dl", "shardpipes_fused_u8"}
# Peers that read their own format: written once per preset by their own writer (_native.py).
NATIVE = {"litdata", "litdata_bare", "mosaic", "energon", "dali"}
# A peer that reads another's format (the same files, run another way).
FORMAT_OF = {"litdata_bare": "litdata"}
IN_PEERS_VENV = {"webdataset", "wids", "torchdata09", "torchdata09_dl", *NATIVE}


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def machine() -> dict:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_gb, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in load],
    }


def source_state() -> str:
    """Which shardpipes source was measured: the commit and the files changed since (read-only git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "pipes"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty.stdout.splitlines()]
    if not changed:
        return f"commit {head.stdout.strip()}"
    return f"commit {head.stdout.strip()} + {len(changed)} uncommitted file(s) under pipes/: {', '.join(changed)}"


def source_digest() -> str:
    """A digest of every ``.py`` under ``pipes/``: tells whether the source changed during a run."""
    import hashlib

    h = hashlib.sha256()
    for root, dirs, files in os.walk(os.path.join(REPO, "pipes")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                h.update(path.encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:12]


def ensure_native(m: dict, peer: str, python: str) -> tuple[dict | None, str]:
    """Write ``m``'s samples in ``peer``'s own format with its own writer, once (cached)."""
    out = os.path.join(m["directory"], "native", peer)
    done = os.path.join(out, "native.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f), ""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(m, f)
    t0 = time.perf_counter()
    try:
        cmd = [python, os.path.join(HERE, "_native.py"), f"--manifest={f.name}"]
        p = subprocess.run(
            [*cmd, f"--format={peer}", f"--out={out}"],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
    finally:
        os.unlink(f.name)
    for line in p.stdout.splitlines():
        if line.startswith("NATIVE "):
            log(
                f"wrote {m['preset']['name']} as {peer} in {time.perf_counter() - t0:.1f} s -> {out}"
            )
            return json.loads(line[len("NATIVE ") :]), ""
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"its writer failed (exit {p.returncode}): {tail}"


def warm(paths: list[str]) -> None:
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)


def run_trial(
    python: str,
    peer: str,
    workers: int,
    manifest_path: str,
    args: argparse.Namespace,
    extra_env: dict[str, str] | None = None,
) -> dict:
    cmd = [
        python,
        os.path.join(HERE, "_runner.py"),
        f"--peer={peer}",
        f"--workers={workers}",
        f"--manifest={manifest_path}",
        f"--shuffle={args.shuffle}",
        f"--batch={args.batch}",
        f"--epochs={args.epochs}",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **(extra_env or {}))
    if args.omp_threads == "default":  # torch's own choice: a thread per core
        del env["OMP_NUM_THREADS"]
    else:
        env["OMP_NUM_THREADS"] = args.omp_threads
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"peer": peer, "workers": workers, "error": f"timed out after {args.timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    lines = p.stderr.strip().splitlines() or ["no output"]
    # The exception line itself ("ValueError: ...") says more than a trailing note.
    raised = [x for x in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*", x)]
    tail = (raised or lines)[-1].replace("|", "/")
    return {
        "peer": peer,
        "workers": workers,
        "error": f"exit {p.returncode}: {tail}",
        "stderr": p.stderr[-4000:],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="tiny data, 1 trial: a smoke run of a few seconds"
    )
    ap.add_argument("--presets", default=None, help="comma list of: " + ", ".join(_data.PRESETS))
    ap.add_argument(
        "--peers", default=",".join(ALL_PEERS), help="comma list (default: all): %(default)s"
    )
    ap.add_argument("--modes", default="inproc,workers", help="inproc, workers, or both (default)")
    ap.add_argument(
        "--workers", type=int, default=2, help="worker processes in the workers mode (default: 2)"
    )
    ap.add_argument(
        "--trials",
        type=int,
        default=None,
        help="runs per peer and mode (default: 3; 1 with --quick)",
    )
    ap.add_argument(
        "--epochs", type=int, default=1, help="epochs per run; the last is timed (default: 1)"
    )
    ap.add_argument("--shuffle", type=int, default=1000, help="shuffle buffer (default: 1000)")
    ap.add_argument(
        "--omp-threads",
        default="1",
        help="OMP_NUM_THREADS of every trial (torch's intra-op threads): a number, or 'default' "
        "for torch's own (one per core, what a training process has); default: 1",
    )
    ap.add_argument("--batch", type=int, default=64, help="batch size (default: 64)")
    ap.add_argument(
        "--cache-dir", default=os.path.join(REPO, ".bench", "data"), help="where shards are kept"
    )
    ap.add_argument(
        "--venv", default=os.path.join(REPO, ".bench", "venv-peers"), help="the peers' virtualenv"
    )
    ap.add_argument("--timeout", type=float, default=900, help="seconds per trial before giving up")
    ap.add_argument("--json", default=None, help="also write every trial's figures to this file")
    ap.add_argument(
        "--profile", action="store_true", help="only profile shardpipes in-process on the preset"
    )
    ap.add_argument(
        "--s3",
        action="store_true",
        help="also measure over loopback S3 (moto on 127.0.0.1): s3cat, webdataset, torchdata09, "
        "shardpipes",
    )
    args = ap.parse_args(argv)
    if args.presets is None:
        args.presets = "quick" if args.quick else "small,large,jpeg"
    if args.trials is None:
        args.trials = 1 if args.quick else 3
    args.presets = [p for p in args.presets.split(",") if p]
    args.peers = [p for p in args.peers.split(",") if p]
    args.modes = [m for m in args.modes.split(",") if m]
    for p in args.presets:
        if p not in _data.PRESETS:
            ap.error(f"unknown preset {p!r}; must be one of {', '.join(_data.PRESETS)}")
    for p in args.peers:
        if p not in ALL_PEERS:
            ap.error(f"unknown peer {p!r}; must be one of {', '.join(ALL_PEERS)}")
    for m in args.modes:
        if m not in ("inproc", "workers"):
            ap.error(f"unknown mode {m!r}; must be inproc or workers")
    if args.omp_threads != "default" and not (args.omp_threads.isdigit() and int(args.omp_threads)):
        ap.error(f"--omp-threads {args.omp_threads!r} must be a number >= 1 or 'default'")
    if args.trials < 1 or args.epochs < 1 or args.workers < 1:
        ap.error("--trials, --epochs and --workers must be >= 1")
    return args


def configs_for(peers: list[str], args: argparse.Namespace) -> list[tuple[str, int]]:
    configs = []
    for p in peers:
        if "inproc" in args.modes and p not in WORKERS_ONLY:
            configs.append((p, 0))
        if "workers" in args.modes and p not in IN_PROCESS_ONLY:
            configs.append((p, args.workers))
    return configs


def measure(
    label: str,
    m: dict,
    configs: list[tuple[str, int]],
    pythons: dict[str, str],
    args: argparse.Namespace,
    env: dict[str, str] | None = None,
) -> list[dict]:
    """Run every config ``args.trials`` times, round-robin, one trial at a time."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(m, f)
        manifest_path = f.name
    results = []
    try:
        for trial in range(args.trials):
            for peer, workers in configs:
                t0 = time.perf_counter()
                r = run_trial(pythons[peer], peer, workers, manifest_path, args, env)
                r["round"] = trial
                results.append(r)
                what = r.get("error") or f"{r['samples'] / r['seconds'][-1]:,.0f} samples/s"
                log(
                    f"[{label} {trial + 1}/{args.trials}] {peer:<14} "
                    f"{_report.mode_name(workers):<10} {what} ({time.perf_counter() - t0:.1f} s)"
                )
    finally:
        os.unlink(manifest_path)
    return results


def report(
    title: str,
    m: dict,
    rows: dict,
    args: argparse.Namespace,
    unavailable: dict,
    limit: str,
    results: list[dict] | None = None,
) -> None:
    p = m["preset"]
    what = (
        "photographs 500x375 q90, ImageNet training transform"
        if p.get("kind") == "jpeg"
        else f".bin payload {p['payload_bytes']:,} B"
    )
    print(
        f"\n## {title}: {len(m['paths'])} shards (uneven, {min(m['counts'])}-{max(m['counts'])} "
        f"samples), {m['samples']:,} samples, {m['bytes'] / 1e6:,.0f} MB, {what}; medians of "
        f"{args.trials} run(s)\n"
    )
    print(_report.table(rows, [*ALL_PEERS, "s3cat"]))
    for peer, why in unavailable.items():
        print(f"\n{peer}: not measured: {why}")
    print("\nLoaders:\n" + _report.loaders(rows))
    ratio_lines = _report.ratios(rows, args.workers, limit)
    if ratio_lines:
        print("\nRatios (samples/s unless stated):\n" + "\n".join(f"- {x}" for x in ratio_lines))
    round_lines = _report.rounds(results or [])
    if round_lines:
        print(
            "\nIn-process, round by round (samples per CPU-second of this process, "
            "epoch by epoch; the first epoch holds building the loader):\n" + "\n".join(round_lines)
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        import _profile

        for name in args.presets:
            m = _data.ensure_dataset(_data.PRESETS[name], args.cache_dir, log)
            _profile.run(m, args)
        return 0

    pythons = {p: sys.executable for p in [*args.peers, "s3cat"]}
    unavailable: dict[str, str] = {}
    if IN_PEERS_VENV & set(args.peers):
        py, why = _venv.ensure_peers_venv(args.venv, os.path.join(REPO, "constraints.txt"), log)
        for p in IN_PEERS_VENV & set(args.peers):
            if py is None:
                unavailable[p] = why
            else:
                pythons[p] = py
    peers = [p for p in args.peers if p not in unavailable]

    info = {
        "machine": machine(),
        "source": source_state(),
        "source_digest_start": source_digest(),
        "command": " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
    }
    all_results: dict[str, list[dict]] = {}
    status = 0
    manifests = {}
    for name in args.presets:
        m = manifests[name] = _data.ensure_dataset(_data.PRESETS[name], args.cache_dir, log)
        missing = dict(unavailable)
        m["native"] = {}
        for peer in [p for p in peers if p in NATIVE]:
            fmt = FORMAT_OF.get(peer, peer)
            native = m["native"].get(fmt)
            if native is None:
                native, why = ensure_native(m, fmt, pythons[peer])
            if native is None:
                missing[peer] = why
            else:
                m["native"][fmt] = native
        here = [p for p in peers if p not in missing]
        if m["preset"].get("kind") != "jpeg":
            here = [p for p in here if p not in JPEG_ONLY]
        warm(m["paths"])
        results = all_results[name] = measure(name, m, configs_for(here, args), pythons, args)
        rows = _report.summarise(results)
        report(name, m, rows, args, missing, "cat", results)
        targets = _report.targets(name, rows, args.workers)
        print("\nTargets:\n" + "\n".join(f"- {x}" for x in targets), flush=True)
        status |= _failed(rows)
        if args.json:  # after each preset too: a long run stopped later keeps what it measured
            _write_json(args, info, all_results)
    if args.s3:
        import _s3

        s3 = _s3.LoopbackS3()
        try:
            s3_peers = [p for p in _s3.S3_PEERS if p in peers or p == "s3cat"]
            for name in args.presets:
                m = s3.upload(manifests[name])
                label = f"{name}-s3"
                results = all_results[label] = measure(
                    label, m, configs_for(s3_peers, args), pythons, args, s3.env
                )
                rows = _report.summarise(results)
                report(f"{name} over loopback S3 (moto)", m, rows, args, {}, "s3cat")
                status |= _failed(rows)
        finally:
            s3.stop()

    info["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    info["source_digest_end"] = source_digest()
    versions = {}
    for results in all_results.values():
        for r in results:
            versions.update({f"{r['peer']}: {k}": v for k, v in r.get("versions", {}).items()})
    print("\nMachine: " + json.dumps(info["machine"]))
    print(
        f"shardpipes source: {info['source']}; digest of pipes/**/*.py {info['source_digest_start']}"
    )
    if info["source_digest_end"] != info["source_digest_start"]:
        print(
            f"warning: pipes/ changed during the run (digest {info['source_digest_end']} at the "
            "end): later trials measured other code than earlier ones"
        )
    print("Versions: " + json.dumps(dict(sorted(versions.items()))))
    if args.json:
        _write_json(args, info, all_results)
    return status


def _write_json(args: argparse.Namespace, info: dict, all_results: dict) -> None:
    machine = dict(info["machine"])
    machine.setdefault("loadavg_end", [round(x, 2) for x in os.getloadavg()])
    with open(args.json, "w") as f:
        json.dump(
            {**info, "machine": machine, "args": vars(args), "results": all_results}, f, indent=1
        )


def _failed(rows: dict) -> int:
    """1 when a shardpipes row failed or any peer delivered a wrong sample count.

    A peer that fails outright (torchdata 0.9's DataLoader2 with workers, see _peers.py) is
    reported in the table but does not fail the run.
    """
    for (peer, _), r in rows.items():
        if "error" in r and (peer.startswith("shardpipes") or "samples_per_s" in r):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
