"""The benchmark script runs end to end (``--quick``) and prints a table of positive figures.

Only the shape of the output is checked, never how fast anything is: timings on a shared
machine are noise, and DESIGN.md keeps performance out of the tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks", "bench.py")

ROW = re.compile(
    r"^\| (?P<peer>[a-z0-9_]+) \| (?P<mode>in-process|\d+ workers) \| (?P<sps>[\d,]+) \| (?P<mbs>[\d,]+) \|"
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_quick_run_prints_a_table_with_positive_figures(tmp_path):
    cmd = [
        sys.executable,
        BENCH,
        "--quick",
        "--peers",
        "shardpipes,shardpipes_idx,tarfile,cat",
        "--cache-dir",
        os.fspath(tmp_path / "data"),
        "--json",
        os.fspath(tmp_path / "out.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    rows = {}
    for line in proc.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[(m["peer"], m["mode"])] = (_number(m["sps"]), _number(m["mbs"]))
    assert set(rows) == {
        ("cat", "in-process"),
        ("tarfile", "in-process"),
        ("shardpipes", "in-process"),
        ("shardpipes", "2 workers"),
        ("shardpipes_idx", "in-process"),
        ("shardpipes_idx", "2 workers"),
    }, proc.stdout
    for key, (samples_per_s, mb_per_s) in rows.items():
        assert samples_per_s > 0 and mb_per_s > 0, (key, proc.stdout)
    assert "shardpipes/limit (cat MB/s, in-process)" in proc.stdout
    assert (tmp_path / "out.json").exists()


def test_memory_script_reports_rss_per_epoch(tmp_path):
    # Shape only: every epoch's RSS is recorded, for the main process and (with workers) the
    # workers, and a verdict is printed for each mode.
    script = os.path.join(REPO, "benchmarks", "memory.py")
    out = tmp_path / "mem.json"
    cmd = [sys.executable, script, "--presets", "quick", "--epochs", "3", "--workers", "2"]
    cmd += ["--cache-dir", os.fspath(tmp_path / "data"), "--json", os.fspath(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    runs = {r["workers"]: r for r in json.loads(out.read_text())}
    assert set(runs) == {0, 2}
    for workers, r in runs.items():
        assert len(r["rss_epochs_mb"]) == 3 and min(r["rss_epochs_mb"]) > 0
        children = r["rss_children_epochs_mb"]
        assert (min(children) > 0) if workers else children == [0, 0, 0]
        assert r["bound_mb"] > 0
    assert re.search(r"^\| quick \| in-process \|", proc.stdout, re.M), proc.stdout
    assert re.search(r"^\| quick \| 2 workers \|", proc.stdout, re.M), proc.stdout


def test_copy_floor_script_prints_every_reader(tmp_path):
    script = os.path.join(REPO, "benchmarks", "copy_floor.py")
    cmd = [sys.executable, script, "--preset", "quick", "--trials", "1", "--keep", "30"]
    cmd += ["--cache-dir", os.fspath(tmp_path / "data")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rates = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+) \|", proc.stdout, re.M))
    assert set(rates) == {
        "readinto (cat)",
        "pread, freed",
        "pread, 30 kept",
        "load_from_tar",
        "pipeline",
    }, proc.stdout
    assert all(float(v) > 0 for v in rates.values()), proc.stdout


def test_scale_script_reports_every_measure_for_a_small_simulation(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [
        sys.executable,
        os.path.join(REPO, "benchmarks", "scale.py"),
        "--shards",
        "1000",
        "--topologies",
        "2x2",
        "--budget",
        "60",
        "--out",
        os.fspath(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert row["shards"] == 1000 and row["descriptor_bytes"] > 0
    reader = row["topologies"]["2x2"]
    # 1000 shards over 4 readers: a reader's plan touches its quarter, and it yields a batch.
    assert reader["shards_read"] == 250
    assert reader["plan"]["ranges"] == 250
    assert reader["first_batch"]["batch_len"] > 0


def test_relay_passes_bytes_through_and_counts_requests(http_server):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from relay import Relay
    finally:
        sys.path.pop(0)
    data = bytes(range(256)) * 4096  # 1 MiB
    url = http_server.add("blob.bin", data)
    upstream = url.split("//", 1)[1].split("/", 1)[0]
    with Relay(upstream, latency_ms=5, conn_mbps=200, max_seconds=120) as relay:
        import urllib.request

        for _ in range(2):
            with urllib.request.urlopen(f"{relay.endpoint}/blob.bin", timeout=60) as resp:
                assert resp.read() == data
    # Every request went through the relay to the server.
    assert len(http_server.log.gets("blob.bin")) == 2


def test_floor_row_and_rounds_epoch_by_epoch(tmp_path):
    # The floor (the item function alone, samples in memory) runs as a row; every in-process row
    # is given against it, and round by round each trial's epochs are listed (CPU per epoch).
    out = tmp_path / "out.json"
    cmd = [sys.executable, BENCH, "--quick", "--peers", "floor,shardpipes_idx", "--modes"]
    cmd += ["inproc", "--trials", "1", "--epochs", "2", "--cache-dir", os.fspath(tmp_path / "data")]
    cmd += ["--json", os.fspath(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]["quick"]
    assert sorted((r["peer"], r["round"]) for r in results) == [("floor", 0), ("shardpipes_idx", 0)]
    for r in results:
        assert r["samples"] == r["expected"] == 1200, r
        assert len(r["cpu_epochs_s"]) == 2 and min(r["cpu_epochs_s"]) > 0, r
    assert re.search(
        r"^- shardpipes_idx/floor \(in-process, per CPU-second, medians\): [\d.]+$",
        proc.stdout,
        re.M,
    ), proc.stdout
    rounds = re.findall(
        r"^\| (\d) \| ([\d.]+k?)/([\d.]+k?) \| ([\d.]+k?)/([\d.]+k?); ([\d.]+) \|$",
        proc.stdout,
        re.M,
    )
    assert [r[0] for r in rounds] == ["1"], proc.stdout

    # paired.py: the same graph and the floor interleaved in one process, epoch by epoch
    [data] = [d for d in (tmp_path / "data").iterdir() if d.name.startswith("quick-")]
    paired = os.path.join(REPO, "benchmarks", "paired.py")
    cmd = [sys.executable, paired, "--peer", "shardpipes_idx", "--data", os.fspath(data)]
    cmd += ["--epochs", "2", "--block", "256"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    epochs = re.findall(r"^epoch (\d): 1,200 samples; .* / floor ([\d.]+) \(", proc.stdout, re.M)
    assert [e[0] for e in epochs] == ["1", "2"] and all(float(e[1]) > 0 for e in epochs), (
        proc.stdout
    )
